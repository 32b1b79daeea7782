"""The fat-binary parser: synthetic blobs, a synthetic ELF, nvcc's own output and cuobjdump's listing."""
import os
import re
import shutil
import struct
import subprocess
import sys

from mxfp16.machine.gpu.elf import section_ranges

import pytest
from conftest import REPO
from gpu_tools import fatbin

FatbinError, parse_fatbin, read_library = fatbin.FatbinError, fatbin.parse_fatbin, fatbin.read_library

PTX, SASS = 1, 2


def entry(kind, arch, payload, version=(1, 7), header_size=64):
    """One entry as nvcc lays it out: header, payload, zero padding to 8 bytes."""
    padded = payload + b"\0" * (-len(payload) % 8)
    head = struct.pack("<HHIQIIHHI", kind, 0x0101, header_size, len(padded), len(payload), 0,
                       version[1], version[0], arch)
    return head + b"\0" * (header_size - len(head)) + padded


def container(*entries):
    body = b"".join(entries)
    return struct.pack("<IHHQ", fatbin.MAGIC, 1, 16, len(body)) + body


# Three containers as a linker leaves them in .nv_fatbin, the second after zero padding.
SPEC = [
    [(SASS, 50, b"\x7fELF cubin 50"), (SASS, 86, b"\x7fELF cubin 86 longer"), (PTX, 86, b".version 7.2\n")],
    [(SASS, 50, b"x" * 3), (SASS, 120, b"y" * 9, (1, 8), 112)],
    [(PTX, 52, b".version 6.0\n" * 5, (6, 0))],
]


def blob():
    parts = []
    for spec in SPEC:
        parts.append(container(*(entry(*e) for e in spec)))
    return parts[0] + b"\0" * 16 + parts[1] + parts[2]


def test_parses_every_entry_of_every_container():
    entries, containers = parse_fatbin(blob())
    assert containers == len(SPEC)
    expected = [("sass" if e[0] == SASS else "ptx", e[1], (e[3] if len(e) > 3 else (1, 7))) for s in SPEC for e in s]
    assert [(e.kind, e.arch, e.version) for e in entries] == expected
    kernels = fatbin.Kernels.from_entries(entries, containers)
    assert kernels.sass == {50: 2, 86: 1, 120: 1} and kernels.ptx == {52: 1, 86: 1}


@pytest.mark.parametrize("damage, where", [
    (lambda b: b[:-5], "past the end"),                          # truncated
    # the first entry's payload size (container header 16 + 8) overruns its container
    (lambda b: b[:24] + struct.pack("<Q", 1 << 20) + b[32:], "do not fit"),
    (lambda b: b + b"\x07" * 8, "stray bytes|expected the fat-binary magic"),  # garbage after the last one
])
def test_damaged_blobs_raise_instead_of_miscounting(damage, where):
    data = blob()
    assert parse_fatbin(data)  # intact, it parses
    with pytest.raises(FatbinError, match=where):
        parse_fatbin(damage(data))


def test_unknown_entry_kinds_are_counted_apart():
    entries, _ = parse_fatbin(container(entry(SASS, 80, b"a"), entry(8, 80, b"lto ir")))
    kernels = fatbin.Kernels.from_entries(entries, 1)
    assert kernels.sass == {80: 1} and kernels.ptx == {} and kernels.other == {8: 1}


@pytest.fixture(scope="module")
def synthetic_library(tmp_path_factory):
    """A real shared object whose .nv_fatbin section holds the synthetic blob."""
    if not shutil.which("gcc"):
        pytest.skip("needs gcc")
    folder = tmp_path_factory.mktemp("elf")
    data = blob()
    source = folder / "fatbin.c"
    source.write_text('__attribute__((section(".nv_fatbin"), used, aligned(8)))\n'
                      f"static const unsigned char fatbin[{len(data)}] = {{{', '.join(map(str, data))}}};\n"
                      "int host_code(void) { return 0; }\n")
    library = folder / "libfake.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True, capture_output=True)
    return str(library), data


def test_reads_the_section_out_of_an_elf_file(synthetic_library):
    library, data = synthetic_library
    entries, containers = parse_fatbin(data)
    kernels = read_library(library)
    assert kernels == fatbin.Kernels.from_entries(entries, containers)
    if shutil.which("readelf"):
        out = subprocess.run(["readelf", "-S", "-W", library], capture_output=True, text=True, check=True).stdout
        match = re.search(r"\.nv_fatbin\s+PROGBITS\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)", out)
        assert section_ranges(library, ".nv_fatbin") == [(int(match.group(1), 16), int(match.group(2), 16))]


def test_a_library_without_device_code_has_no_kernels(synthetic_library):
    import mxnet

    cpu_library = os.path.join(os.path.dirname(mxnet.__file__), "libmxnet.so")  # this venv's CPU wheel
    assert read_library(cpu_library) == fatbin.Kernels()


def test_command_writes_an_importable_data_module(synthetic_library, tmp_path):
    library, data = synthetic_library
    target = tmp_path / "kernels_table.py"
    proc = subprocess.run([sys.executable, fatbin.__file__, library, "--write", str(target)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "sm_86 (1)" in proc.stdout and "compute_52 (1)" in proc.stdout
    namespace = {}
    exec(target.read_text(), namespace)
    expected = read_library(library)
    assert namespace["SASS"] == expected.sass and namespace["PTX"] == expected.ptx
    assert namespace["CONTAINERS"] == len(SPEC)
    assert len(namespace["SOURCE"]["sha256"]) == 64


@pytest.fixture(scope="module")
def nvcc_object(tmp_path_factory):
    """A real object file from nvcc: sm_75 SASS and compute_80 PTX."""
    nvcc = shutil.which("nvcc") or next((p for p in ["/usr/local/cuda/bin/nvcc"] if os.path.exists(p)), None)
    if not nvcc:
        pytest.skip("needs nvcc")
    folder = tmp_path_factory.mktemp("nvcc")
    source = folder / "kernel.cu"
    source.write_text("__global__ void twice(float *x) { x[threadIdx.x] *= 2.0f; }\n")
    obj = folder / "kernel.o"
    proc = subprocess.run([nvcc, "-c", "-gencode", "arch=compute_75,code=sm_75", "-gencode",
                           "arch=compute_80,code=compute_80", "-o", str(obj), str(source)],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        pytest.skip(f"nvcc could not build the test kernel: {proc.stderr[-300:]}")
    return str(obj)


def test_parses_what_nvcc_writes(nvcc_object):
    kernels = read_library(nvcc_object)
    assert kernels.sass == {75: 1} and kernels.ptx == {80: 1}


def test_agrees_with_cuobjdump(nvcc_object):
    exe = fatbin.find_cuobjdump()
    if not exe:
        pytest.skip("needs cuobjdump (pip install nvidia-cuda-cuobjdump)")
    ours = read_library(nvcc_object)
    theirs = fatbin.cuobjdump_counts(nvcc_object, exe)
    assert (theirs.sass, theirs.ptx) == (ours.sass, ours.ptx)
