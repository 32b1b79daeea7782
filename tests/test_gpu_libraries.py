"""Loading the CUDA wheels' libraries before MXNet: found, missing, order, idempotence, the import error.

A fake site-packages tree holds tiny real shared objects under the sonames
and folders of NVIDIA's cu11 wheels (``nvidia/<name>/lib/<soname>``), linked
to each other as the real ones are and without run paths, so loading them in
the wrong order fails as it would for real. A fake ``mxnet`` package loads a
fake ``libmxnet.so`` that links them all, the way MXNet's ``base.py`` does.
"""
import configparser
import os
import re
import shutil
import subprocess

from mxfp16.machine.gpu import libraries
from mxfp16.machine.gpu.elf import dynamic_info

import pytest
from conftest import REPO, last_line_json, run_python

pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc to build the fake libraries")

# The real libmxnet.so of mxnet-cu112 1.9.1 links these (read with readelf -d); the fake one does too.
MXNET_CUDA_NEEDED = ("libcudnn.so.8", "libnccl.so.2", "libcudart.so.11.0", "libcufft.so.10", "libcublas.so.11",
                     "libcusolver.so.11", "libcurand.so.10", "libnvrtc.so.11.2", "libnvToolsExt.so.1")
FAKE_MXNET_INIT = '''
import ctypes, os
__version__ = "fake-cuda"
_LIB = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "libmxnet.so"), ctypes.RTLD_LOCAL)
'''


def _gcc(out, source_dir, name, soname, links=(), link_dirs=()):
    source = os.path.join(source_dir, name + ".c")
    symbol = re.sub(r"\W", "_", soname)
    with open(source, "w") as handle:
        handle.write(f"int fake_{symbol}(void) {{ return 1; }}\n")
    cmd = ["gcc", "-shared", "-fPIC", "-o", out, source, f"-Wl,-soname,{soname}"]
    # --no-as-needed: keep DT_NEEDED although the fakes call nothing in each other.
    cmd += [f"-L{d}" for d in link_dirs] + ["-Wl,--no-as-needed"] + [f"-l:{lib}" for lib in links]
    subprocess.run(cmd, check=True, capture_output=True)


def make_tree(root, skip=(), broken=()):
    """A fake site-packages: nvidia/<package>/lib/<soname> per library, and a fake CUDA mxnet.

    Returns ``{soname: path}`` of the libraries written.
    """
    src = os.path.join(root, "src")
    os.makedirs(src, exist_ok=True)
    paths = {}
    by_soname = {lib.soname: lib for lib in libraries.LIBRARIES}

    def build(lib):  # dependencies first, whatever order LIBRARIES has (that order is under test)
        if lib.soname in paths:
            return
        for dep in lib.needs:
            build(by_soname[dep])
        folder = os.path.join(root, "nvidia", lib.package.replace("nvidia-", "").replace("-cu11", ""), "lib")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, lib.soname)
        _gcc(path, src, lib.soname, lib.soname, lib.needs, {os.path.dirname(paths[n]) for n in lib.needs})
        paths[lib.soname] = path

    for lib in libraries.LIBRARIES:
        build(lib)  # even the ones to skip: libmxnet.so must link them; they are deleted below
    package = os.path.join(root, "mxnet")
    os.makedirs(package, exist_ok=True)
    with open(os.path.join(package, "__init__.py"), "w") as handle:
        handle.write(FAKE_MXNET_INIT)
    _gcc(os.path.join(package, "libmxnet.so"), src, "libmxnet", "libmxnet.so", MXNET_CUDA_NEEDED,
         sorted({os.path.dirname(p) for p in paths.values()}))
    for soname in skip:
        os.remove(paths.pop(soname))
    for soname in broken:
        with open(paths[soname], "w") as handle:
            handle.write("not a shared object\n")
    return paths


@pytest.fixture(scope="module")
def complete(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("site-complete"))
    return root, make_tree(root)


@pytest.fixture(scope="module")
def without_cudnn(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("site-no-cudnn"))
    return root, make_tree(root, skip=("libcudnn.so.8",))


def _needed(root):
    return dynamic_info(os.path.join(root, "mxnet", "libmxnet.so")).needed


def test_fake_libmxnet_is_a_cuda_build_and_the_cpu_wheel_is_not(complete):
    root, _ = complete
    assert libraries.is_cuda_build(_needed(root))
    installed = libraries.needed_by_mxnet()  # this venv holds the CPU wheel
    assert installed and not libraries.is_cuda_build(installed)
    assert libraries.status() == []


def test_finds_every_library_in_its_wheel_folder_in_load_order(complete):
    root, paths = complete
    found = libraries.status(_needed(root), paths=[root])
    assert [s.library.soname for s in found] == [lib.soname for lib in libraries.LIBRARIES]
    assert {s.library.soname: s.path for s in found} == paths
    # libcublasLt is not linked by libmxnet.so itself, only through libcublas: still loaded, and first.
    order = [s.library.soname for s in found]
    assert "libcublasLt.so.11" not in _needed(root)
    for lib in libraries.LIBRARIES:
        assert all(order.index(dep) < order.index(lib.soname) for dep in lib.needs)


def test_missing_library_is_reported_with_its_package_and_command(without_cudnn):
    root, _ = without_cudnn
    found = {s.library.soname: s for s in libraries.status(_needed(root), paths=[root])}
    cudnn = found["libcudnn.so.8"]
    assert cudnn.path is None and cudnn.as_dict()["fix"] == cudnn.library.fix
    assert cudnn.library.fix == f"pip install {cudnn.library.package}=={cudnn.library.version}"
    assert all(s.path for name, s in found.items() if name != "libcudnn.so.8")
    message = libraries.explain_load_error(
        "libcudnn.so.8: cannot open shared object file: No such file or directory", list(found.values()))
    assert cudnn.library.package in message and cudnn.library.fix in message
    assert re.search(r"libcudnn\.so\.8\s+MISSING", message)
    assert re.search(r"libcudart\.so\.11\.0\s+found", message)


def test_the_fake_libraries_depend_on_each_other_like_the_real_ones(complete):
    # Without this, a test of the load order could not fail.
    _, paths = complete
    proc = run_python(f"import ctypes; ctypes.CDLL({paths['libcublas.so.11']!r})", check=False)
    assert proc.returncode != 0 and "libcublasLt.so.11" in proc.stderr


PROBE = """
    import json, sys, types
    # Import mxfp16.machine.stack without mxfp16/__init__, which would go on to import the rest of
    # mxfp16 against the fake mxnet.
    package = types.ModuleType("mxfp16"); package.__path__ = [{repo!r} + "/mxfp16"]
    sys.modules["mxfp16"] = package
    from mxfp16.machine import stack
    from mxfp16.machine.gpu import libraries
    mx = stack.check_stack()
    first = libraries.preload()
    handles = dict(libraries._HANDLES)
    second = libraries.preload()
    print(json.dumps({{
        "mxnet": mx.__version__,
        "report": [s.as_dict() for s in first],
        "same": first is second and libraries._HANDLES == handles,
        "maps": {{s.library.soname: libraries.loaded_path(s.library.soname) for s in first}},
    }}))
"""


def test_preload_then_import_works_without_ld_library_path_and_twice_is_harmless(complete):
    root, paths = complete
    proc = run_python(PROBE.format(repo=REPO), env={"PYTHONPATH": root + os.pathsep + REPO, "LD_LIBRARY_PATH": ""})
    result = last_line_json(proc.stdout)
    assert result["mxnet"] == "fake-cuda"
    assert all(row["loaded"] and not row["error"] for row in result["report"])
    assert result["maps"] == paths
    assert result["same"]


@pytest.mark.parametrize("statement", ["from mxfp16 import cast_net", "from mxfp16.train import train"])
def test_half_installed_set_fails_the_import_naming_library_and_package(without_cudnn, statement):
    root, _ = without_cudnn
    env = {"PYTHONPATH": root + os.pathsep + REPO, "LD_LIBRARY_PATH": ""}
    assert run_python("import mxfp16", env=env).returncode == 0  # MXNet is not loaded by the import itself
    proc = run_python(statement, check=False, env=env)
    assert proc.returncode != 0
    last = proc.stderr[proc.stderr.index("ImportError"):]
    cudnn = next(lib for lib in libraries.LIBRARIES if lib.soname == "libcudnn.so.8")
    assert "libcudnn.so.8" in last and cudnn.package in last and cudnn.fix in last
    assert "OSError" not in last.splitlines()[0]


def test_half_installed_set_on_the_command_line_is_a_clear_error(without_cudnn):
    root, _ = without_cudnn
    env = {"PYTHONPATH": root + os.pathsep + REPO, "LD_LIBRARY_PATH": ""}
    # --help needs no MXNet and answers; a command that runs needs it, and names the missing library.
    helped = run_python("import sys; from mxfp16.cli import main; sys.exit(main(['train', '--help']))",
                        check=False, env=env)
    assert helped.returncode == 0 and "--batch-size" in helped.stdout, helped.stderr
    proc = run_python("import sys; from mxfp16.cli import main; sys.exit(main(['train']))", check=False, env=env)
    cudnn = next(lib for lib in libraries.LIBRARIES if lib.soname == "libcudnn.so.8")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "libcudnn.so.8" in proc.stderr and cudnn.fix in proc.stderr
    info = run_python("import sys; from mxfp16.cli import main; sys.exit(main(['info']))", check=False, env=env)
    assert info.returncode == 2 and "Traceback" not in info.stderr
    assert re.search(r"libcudnn\.so\.8\s.*MISSING", info.stdout) and cudnn.fix in info.stdout


def test_broken_library_is_reported_not_raised(tmp_path):
    root = str(tmp_path)
    paths = make_tree(root, broken=("libnccl.so.2",))
    proc = run_python(PROBE.format(repo=REPO), check=False,
                      env={"PYTHONPATH": root + os.pathsep + REPO, "LD_LIBRARY_PATH": ""})
    # preload carried on past the broken file; the import then failed on it, with the table.
    assert proc.returncode != 0
    assert re.search(r"libnccl\.so\.2\s+BROKEN\s+" + re.escape(paths["libnccl.so.2"]), proc.stderr)
    assert re.search(r"libcudnn\.so\.8\s+found", proc.stderr)


def test_missing_driver_says_no_pip_package_provides_it():
    message = libraries.explain_load_error("libcuda.so.1: cannot open shared object file: No such file or "
                                           "directory", [])
    assert "NVIDIA driver" in message and "mxfp16[cpu]" in message


def test_cpu_build_preload_does_nothing_quickly():
    proc = run_python("""
        import time
        start = time.perf_counter()
        from mxfp16.machine.gpu import libraries   # runs mxfp16/__init__ (CPU MXNet) first; time the call itself
        start = time.perf_counter()
        libraries._REPORT = None           # undo the preload the import just did
        report = libraries.preload()
        print(len(report), len(libraries._HANDLES), time.perf_counter() - start)
    """)
    count, handles, seconds = proc.stdout.split()
    assert (int(count), int(handles)) == (0, 0)
    assert float(seconds) < 0.05, f"preload took {seconds} s with the CPU wheel"


def test_elf_reader_agrees_with_readelf(complete):
    if not shutil.which("readelf"):
        pytest.skip("needs readelf")
    _, paths = complete
    path = paths["libcusolver.so.11"]
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    info = dynamic_info(path)
    assert list(info.needed) == re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)
    assert info.soname == re.search(r"\(SONAME\)\s+Library soname: \[(.+?)\]", out).group(1)


def test_packaging_pins_the_versions_the_fix_commands_name():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    extra = [line.strip() for line in cfg["options.extras_require"]["gpu"].splitlines() if line.strip()]
    from packaging.requirements import Requirement

    with open(os.path.join(REPO, "constraints.txt")) as handle:
        pinned = [Requirement(line.split("#")[0].strip()) for line in handle if "==" in line.split("#")[0]]
    pins = {r.name: next(iter(r.specifier)).version for r in pinned if r.marker is None}

    requirements = {r.name: r for r in map(Requirement, extra)}
    for lib in libraries.LIBRARIES:
        assert pins.get(lib.package) == lib.version, f"constraints.txt must pin {lib.package}=={lib.version}"
        assert lib.version in requirements[lib.package].specifier, f"the gpu extra excludes {lib.fix}"
