"""Pieces of ``make gpu-check`` that can be tested without the 2 GB install: the driver stand-in, the install log."""
import os
import shutil
import subprocess

import pytest
from conftest import run_python
from gpu_tools import check, driver_standin

install_figures = check.install_figures

needs_toolchain = pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("nm")), reason="needs gcc and nm")


@pytest.fixture(scope="module")
def fake_libmxnet(tmp_path_factory):
    """A library that links libcuda.so.1 and calls driver functions, as libmxnet.so of mxnet-cu112 does."""
    folder = tmp_path_factory.mktemp("driverless")
    (folder / "empty.c").write_text("int empty;\n")
    (folder / "mx.c").write_text("int cuInit(unsigned); int cuLaunchKernel(void);\n"
                                 "int start(void) { return cuInit(0); }\n"
                                 "int launch(void) { return cuLaunchKernel(); }\n")
    linkdir = folder / "link-only"
    linkdir.mkdir()
    # An empty libcuda.so.1 just to link against; deleted, as on a machine without the driver.
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(linkdir / "libcuda.so.1"), str(folder / "empty.c"),
                    "-Wl,-soname,libcuda.so.1"], check=True, capture_output=True)
    library = folder / "libmxnet.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(folder / "mx.c"), f"-L{linkdir}",
                    "-Wl,--no-as-needed", "-l:libcuda.so.1"], check=True, capture_output=True)
    shutil.rmtree(linkdir)
    return str(library)


@needs_toolchain
def test_driver_functions_are_the_cu_capital_ones(fake_libmxnet):
    assert driver_standin.driver_functions(fake_libmxnet) == ["cuInit", "cuLaunchKernel"]


@needs_toolchain
def test_stand_in_lets_a_driverless_machine_load_the_library_and_answers_no_device(fake_libmxnet, tmp_path):
    code = f"""
        import ctypes
        lib = ctypes.CDLL({fake_libmxnet!r})
        print(lib.start(), lib.launch())
    """
    without = run_python(code, check=False, env={"LD_PRELOAD": ""})
    if without.returncode == 0:
        pytest.skip("this machine has a libcuda.so.1")
    assert "libcuda.so.1" in without.stderr
    standin = driver_standin.build(fake_libmxnet, str(tmp_path))
    assert os.path.basename(standin) == "libcuda.so.1"
    proc = run_python(code, env={"LD_PRELOAD": standin})
    assert proc.stdout.split() == [str(driver_standin.CUDA_ERROR_NO_DEVICE)] * 2


def test_stand_in_refuses_a_library_that_does_not_link_the_driver(tmp_path):
    import mxnet

    cpu_library = os.path.join(os.path.dirname(mxnet.__file__), "libmxnet.so")
    with pytest.raises(ValueError, match="needs no stand-in"):
        driver_standin.build(cpu_library, str(tmp_path))


def test_install_figures_read_pip_log(tmp_path):
    log = tmp_path / "install.log"
    log.write_text("Collecting mxnet-cu112==1.9.1\n"
                   "  Downloading mxnet_cu112-1.9.1-py3-none-manylinux2014_x86_64.whl (499.4 MB)\n"
                   "  Using cached nvidia_nvtx_cu11-11.8.86-py3-none-manylinux2014_x86_64.whl (99 kB)\n"
                   "install_seconds=155\n")
    figures = install_figures(str(log))
    assert figures["install_seconds"] == 155
    assert figures["wheels"] == {"mxnet_cu112-1.9.1-py3-none-manylinux2014_x86_64.whl": 499.4e6,
                                 "nvidia_nvtx_cu11-11.8.86-py3-none-manylinux2014_x86_64.whl": 99e3}
    assert install_figures(str(tmp_path / "absent.log")) is None
