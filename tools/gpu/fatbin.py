"""Which GPU architectures a CUDA library carries kernels for, read from its fat binaries.

nvcc stores the device code of every compilation unit in a *fat binary*; the
linker concatenates them in the ELF section ``.nv_fatbin``. Each fat binary
holds one entry per target: SASS (an ELF *cubin*, machine code for one
architecture ``sm_XY``) or PTX (virtual-ISA text for ``compute_XY`` that the
driver compiles at load time for the GPU it runs on). Listing the entries
answers "which GPUs can run this library": see :mod:`mxfp16.machine.gpu.coverage`.

Layout relied on
----------------
Everything is little-endian. Only the fields below are read; NVIDIA does not
publish the format (``fatbinary_section.h`` in the CUDA toolkit gives the
magic and the container header), and these fields are the ones ``cuobjdump``
agrees with (the cross-check of ``--cuobjdump``).

Container header, 16 bytes, at the start of each fat binary::

    offset  size  field
    0       4     magic, 0xBA55ED50
    4       2     version (1)
    6       2     header size (16): where the first entry starts
    8       8     size of all entries that follow, in bytes

Entry header, at least 64 bytes; the entry's payload follows it::

    offset  size  field
    0       2     kind: 1 = PTX, 2 = ELF cubin (SASS); others (e.g. LTO IR) are counted as 'other'
    2       2     (attributes, not read)
    4       4     entry header size: offset from the entry to its payload
    8       8     payload size (padded; the next entry starts after it)
    16      8     (compressed size and reserved, not read)
    24      2     code version, minor (PTX ISA minor for PTX)
    26      2     code version, major
    28      4     architecture number: 86 means sm_86 / compute_86, 120 means sm_120

Entries follow each other until the container's size is used up. In a linked
library the containers follow each other too, each starting on an 8-byte
boundary; anything but zero padding between them is an error, so a wrong
assumption about the layout shows up as an exception, not as a wrong table.
Payloads (possibly compressed) are skipped, never read: parsing the 534 MB
section of MXNet's GPU wheel touches about 4,000 small headers.

Architecture-specific targets (``sm_90a``) are stored as their number and
reported as plain ``sm_90`` here.

Command line
------------
``python tools/gpu/fatbin.py PATH`` prints the table for a ``.so`` or for a
wheel (its ``mxnet/libmxnet.so``); ``--cuobjdump`` compares with NVIDIA's
``cuobjdump --list-elf/--list-ptx``; ``--write FILE`` writes the data module
mxfp16 ships (:mod:`mxfp16.machine.gpu.wheel_kernels`).
"""
import argparse
import os
import pprint
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from dataclasses import dataclass, field

from mxfp16.machine.gpu.elf import section_ranges
from mxfp16.plumbing.fileio import sha256_file

__all__ = ["FatbinError", "FatbinEntry", "Kernels", "parse_fatbin", "read_library", "arch_name"]

MAGIC = 0xBA55ED50
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQ8xHHI")
_ENTRY_MIN = 64
_KINDS = {1: "ptx", 2: "sass"}
SECTION = ".nv_fatbin"


class FatbinError(ValueError):
    """Bytes that do not follow the fat-binary layout described in the module docstring."""


@dataclass(frozen=True)
class FatbinEntry:
    """One device-code entry.

    Attributes
    ----------
    kind : str
        ``'sass'`` (ELF cubin), ``'ptx'`` or ``'other'``.
    arch : int
        Architecture number: 86 for sm_86 / compute_86.
    version : tuple of int
        ``(major, minor)`` code version (the PTX ISA version for PTX).
    offset : int
        Where the entry header starts, relative to the parsed bytes.
    """

    kind: str
    arch: int
    version: tuple
    offset: int


@dataclass
class Kernels:
    """What a library's fat binaries hold, counted per architecture.

    Attributes
    ----------
    sass : dict
        ``{arch: number of cubins}``.
    ptx : dict
        ``{arch: number of PTX entries}``.
    other : dict
        ``{kind number: count}`` for entry kinds that are neither.
    containers : int
        Fat binaries found.
    """

    sass: dict = field(default_factory=dict)
    ptx: dict = field(default_factory=dict)
    other: dict = field(default_factory=dict)
    containers: int = 0

    @classmethod
    def from_entries(cls, entries, containers):
        sass = Counter(e.arch for e in entries if e.kind == "sass")
        ptx = Counter(e.arch for e in entries if e.kind == "ptx")
        other = Counter(e.arch for e in entries if e.kind == "other")
        return cls(dict(sorted(sass.items())), dict(sorted(ptx.items())), dict(sorted(other.items())), containers)


def arch_name(arch, kind="sass"):
    """``86, 'sass'`` -> ``'sm_86'``; ``86, 'ptx'`` -> ``'compute_86'``."""
    return f"{'compute' if kind == 'ptx' else 'sm'}_{arch}"


def _entries(read, start, end):
    """Walk the entries of the container whose entries occupy ``[start, end)``."""
    pos = start
    while pos < end:
        if end - pos < _ENTRY_MIN:
            raise FatbinError(f"{end - pos} stray bytes at the end of the fat binary at {start - _CONTAINER.size}")
        kind, _attrs, header_size, payload, minor, major, arch = _ENTRY.unpack(read(pos, _ENTRY.size))
        if header_size < _ENTRY_MIN or pos + header_size + payload > end:
            raise FatbinError(f"entry at byte {pos}: header size {header_size} and payload {payload} do not fit "
                              f"in its fat binary (which ends at {end})")
        code = _KINDS.get(kind, "other")
        yield FatbinEntry(code, arch if code != "other" else kind, (major, minor), pos)
        pos += header_size + payload


def _walk(read, size):
    """Yield ``(entries, container start)`` for every fat binary in ``size`` bytes."""
    pos = 0
    while pos < size:
        if size - pos < _CONTAINER.size:
            tail = read(pos, size - pos)
            if tail.strip(b"\0"):
                raise FatbinError(f"{size - pos} stray bytes after the last fat binary")
            return
        magic, _version, header_size, body = _CONTAINER.unpack(read(pos, _CONTAINER.size))
        if magic != MAGIC:
            if read(pos, 8).strip(b"\0"):
                raise FatbinError(f"byte {pos}: expected the fat-binary magic 0x{MAGIC:08X} or zero padding, "
                                  f"found 0x{magic:08X}")
            pos += 8  # padding between two 8-byte aligned containers
            continue
        if header_size < _CONTAINER.size or pos + header_size + body > size:
            raise FatbinError(f"fat binary at byte {pos} claims {header_size}+{body} bytes, past the end ({size})")
        yield list(_entries(read, pos + header_size, pos + header_size + body)), pos
        pos = (pos + header_size + body + 7) // 8 * 8


def parse_fatbin(data):
    """Parse one or more concatenated fat binaries held in memory.

    Parameters
    ----------
    data : bytes
        E.g. the contents of an ``.nv_fatbin`` section, or a ``.fatbin`` file
        written by ``nvcc -fatbin``.

    Returns
    -------
    (list of FatbinEntry, int)
        The entries in order and the number of containers.

    Raises
    ------
    FatbinError
        When the bytes do not follow the documented layout.
    """
    view = memoryview(data)

    def read(offset, size):
        return bytes(view[offset:offset + size])

    entries, containers = [], 0
    for found, _start in _walk(read, len(data)):
        entries.extend(found)
        containers += 1
    return entries, containers


def read_library(path):
    """Count the kernels in every ``.nv_fatbin`` section of a shared library.

    Only the headers are read (seeks in the file), so this takes well under
    a second even for MXNet's 891 MB ``libmxnet.so``.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    Kernels
        Empty for a library without device code (the CPU wheel's).
    """
    entries, containers = [], 0
    with open(path, "rb") as handle:
        for offset, size in section_ranges(path, SECTION):
            def read(rel, length, _base=offset):
                handle.seek(_base + rel)
                return handle.read(length)

            for found, _start in _walk(read, size):
                entries.extend(found)
                containers += 1
    return Kernels.from_entries(entries, containers)


# --------------------------------------------------------------------------
# Cross-check against NVIDIA's cuobjdump
# --------------------------------------------------------------------------
_LISTED = re.compile(r"\.(sm|compute)_(\d+)[a-z]?\.(cubin|ptx)\s*$")


def find_cuobjdump():
    """``cuobjdump`` on PATH, in a CUDA toolkit, or from the ``nvidia-cuda-cuobjdump`` wheel; else None."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    candidates = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")]
    for entry in sys.path:
        candidates += [os.path.join(entry, "nvidia", sub, "bin", "cuobjdump")
                       for sub in ("cu13", "cu12", "cuda_cuobjdump")]
    return next((c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)), None)


def cuobjdump_counts(library, exe):
    """Per-architecture counts of ``cuobjdump --list-elf`` and ``--list-ptx`` on ``library``.

    Returns
    -------
    Kernels
        ``containers`` is 0: cuobjdump does not list them.
    """
    counts = {"sass": Counter(), "ptx": Counter()}
    for flag in ("--list-elf", "--list-ptx"):
        proc = subprocess.run([exe, flag, str(library)], capture_output=True, text=True, check=False)
        for line in proc.stdout.splitlines():
            match = _LISTED.search(line)
            if match:
                counts["ptx" if match.group(3) == "ptx" else "sass"][int(match.group(2))] += 1
    return Kernels(dict(sorted(counts["sass"].items())), dict(sorted(counts["ptx"].items())))


def cuobjdump_version(exe):
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    match = re.search(r"release (\S+), V(\S+)", proc.stdout)
    return f"cuobjdump {match.group(2)}" if match else "cuobjdump (version unknown)"


# --------------------------------------------------------------------------
# Command line: print, cross-check, write the data module
# --------------------------------------------------------------------------
def _wheel_source(path, tmp):
    """Extract ``mxnet/libmxnet.so`` from a wheel; return its path and what to record about the wheel."""
    name = os.path.basename(path)
    parts = name.split("-")
    with zipfile.ZipFile(path) as wheel:
        member = next((n for n in wheel.namelist() if n.endswith("/libmxnet.so")), None)
        if member is None:
            raise SystemExit(f"{name} holds no libmxnet.so; pass the library itself")
        library = wheel.extract(member, tmp)
    return library, {"wheel": name, "distribution": parts[0].replace("_", "-"),
                     "version": parts[1] if len(parts) > 1 else None,
                     "sha256": sha256_file(path), "library": member}


def _format(kernels):
    def listing(counts, kind):
        return ", ".join(f"{arch_name(a, kind)} ({n})" for a, n in counts.items()) or "none"

    lines = [f"fat binaries: {kernels.containers}",
             f"SASS (native kernels): {listing(kernels.sass, 'sass')}",
             f"PTX (JIT-compilable):  {listing(kernels.ptx, 'ptx')}"]
    if kernels.other:
        lines.append("other entries: " + ", ".join(f"kind {k} ({n})" for k, n in kernels.other.items()))
    return "\n".join(lines)


def _module_text(source, kernels, cross_check):
    return f'''"""GPU kernels in {source.get("wheel") or source["library"]} (generated; do not edit).

Written by ``python tools/gpu/fatbin.py <wheel> --cuobjdump --write <this file>``
from the ``.nv_fatbin`` sections of ``{source["library"]}``; see
``tools/gpu/fatbin.py`` for the format and :mod:`mxfp16.machine.gpu.coverage` for
what the numbers mean for each GPU generation.
"""

#: Where the table was read from (the wheel's sha256 identifies it exactly).
SOURCE = {pprint.pformat(source, width=100, sort_dicts=False)}

#: ``{{architecture: cubins}}``: native machine code (SASS), e.g. 86 = sm_86.
SASS = {kernels.sass!r}

#: ``{{architecture: PTX entries}}``: code the driver can JIT-compile for newer GPUs.
PTX = {kernels.ptx!r}

#: Fat binaries in the library.
CONTAINERS = {kernels.containers!r}

#: How the parse was checked against NVIDIA's tool.
CROSS_CHECK = {cross_check!r}
'''


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python tools/gpu/fatbin.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="a shared library (.so) or an MXNet wheel (.whl)")
    parser.add_argument("--cuobjdump", nargs="?", const="auto", default=None, metavar="EXE",
                        help="compare with `cuobjdump --list-elf/--list-ptx` (EXE, or found on PATH, in "
                             "CUDA_HOME or the nvidia-cuda-cuobjdump wheel when omitted)")
    parser.add_argument("--write", metavar="FILE", help="write the table as a Python data module to FILE")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="mxfp16-fatbin-") as tmp:
        if args.path.endswith(".whl"):
            library, source = _wheel_source(args.path, tmp)
        else:
            library, source = args.path, {"library": os.path.basename(args.path), "sha256": sha256_file(args.path)}
        kernels = read_library(library)
        print(_format(kernels))
        cross_check = "not checked (no cuobjdump)"
        status = 0
        if args.cuobjdump:
            exe = find_cuobjdump() if args.cuobjdump == "auto" else args.cuobjdump
            if not exe:
                raise SystemExit("no cuobjdump found: pip install nvidia-cuda-cuobjdump, or pass --cuobjdump PATH")
            theirs = cuobjdump_counts(library, exe)
            tool = cuobjdump_version(exe)
            same = (theirs.sass, theirs.ptx) == (kernels.sass, kernels.ptx)
            cross_check = f"{tool} --list-elf/--list-ptx: " + ("same entries per architecture" if same else
                                                              f"DIFFERENT: sass {theirs.sass}, ptx {theirs.ptx}")
            print(cross_check)
            status = 0 if same else 1
    if args.write:
        with open(args.write, "w", encoding="utf-8") as handle:
            handle.write(_module_text(source, kernels, cross_check))
        print(f"wrote {args.write}")
    return status


if __name__ == "__main__":
    sys.exit(main())
