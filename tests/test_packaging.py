"""Install-time guards, the command-line entry points and `mxfp16 info`."""
import json
import os
import subprocess
import sys

from mxfp16 import __version__
from mxfp16.float_formats import bfloat16_cast_path, measure_bfloat16_cast
from mxfp16.machine import cpuinfo, hardware
from mxfp16.precision import resolve_precision

import mxnet as mx
import numpy as np
from conftest import REPO, run_python


def test_missing_mxnet_is_explained_where_it_is_needed():
    proc = run_python("""
        import sys
        sys.modules["mxnet"] = None    # as if no MXNet wheel were installed
        import mxfp16                  # works: predict of an ONNX export needs no MXNet
        print("imported")
        mxfp16.make_trainer            # needs MXNet
    """, check=False)
    assert proc.returncode != 0 and proc.stdout.strip() == "imported"
    assert "needs MXNet 1.9.1, which is not installed" in proc.stderr
    assert "mxfp16[cpu]" in proc.stderr and "mxnet-cu112" in proc.stderr and "mxfp16[onnx]" in proc.stderr
    # Python 3.13's route (the extras leave MXNet out there) is named too.
    assert "pip install --no-deps mxnet==1.9.1" in proc.stderr
    command = run_python("""
        import sys
        sys.modules["mxnet"] = None
        from mxfp16.cli import main
        sys.exit(main(["train", "--epochs", "1"]))
    """, check=False)
    assert command.returncode == 2 and "Traceback" not in command.stderr
    assert "needs MXNet 1.9.1, which is not installed" in command.stderr


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mxfp16", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_version_and_help():
    proc = _cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"mxfp16 {__version__}"
    assert "info" in _cli("--help").stdout


def test_info_json_reports_this_machine():
    proc = _cli("info", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    machine = report["machine"]
    assert machine["mxnet_version"] == mx.__version__
    assert set(machine["mxnet_features"]) == {n for n, f in mx.runtime.Features().items() if f.enabled}
    assert len(machine["gpus"]) == mx.context.num_gpus()
    flags = cpuinfo.cpu_flags() or set()
    assert machine["cpu_bfloat16"] == {"avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags}
    assert machine["cpu"] == hardware.cpu_identity()
    assert report["precisions"]["float32"]["runs"] is True
    assert report["precisions"]["float16"]["runs"] is (mx.context.num_gpus() > 0)
    auto = resolve_precision("auto", "gpu:0" if machine["gpus"] else "cpu")  # the rule, with its reason
    assert (report["auto"]["resolves_to"], report["auto"]["reason"]) == (auto.name, auto.reason)
    assert machine["bfloat16"]["kind"] == hardware.bfloat16_support().kind
    cast = report["bfloat16_cast"]  # measured by info's own process: the same answer as this one's
    assert cast["subnormals"] == measure_bfloat16_cast(in_process=True).subnormals in ("flushed", "kept")
    assert cast["path"] == bfloat16_cast_path() and cast["sentence"].startswith("MXNet's float32 -> bfloat16 cast")
    f16 = report["formats"]["float16"]
    assert f16["max"] == float(np.finfo(np.float16).max)
    assert f16["smallest_subnormal"] == float(np.finfo(np.float16).smallest_subnormal)


def test_info_text_mentions_precisions():
    proc = _cli("info")
    assert proc.returncode == 0
    for word in ("float16", "amp-bfloat16", "auto ->", "min subnormal", "float32 -> bfloat16 cast (amp_cast"):
        assert word in proc.stdout
    assert f"CPU: {hardware.describe_cpu(hardware.cpu_identity())}, " in proc.stdout


def _find_python(name, path):
    return subprocess.run(["sh", os.path.join(REPO, "tools", "find-python"), name], capture_output=True, text=True,
                          env=dict(os.environ, PATH=path), timeout=60).stdout.strip()


def test_find_python_takes_a_working_interpreter_or_says_nothing(tmp_path):
    path = os.environ["PATH"]
    assert os.path.realpath(_find_python(sys.executable, path)) == os.path.realpath(sys.executable)
    assert _find_python("python-that-does-not-exist", path) == ""


def test_find_python_falls_back_to_pyenv_when_the_shim_refuses(tmp_path):
    """A pyenv shim for an installed but unselected version fails; the interpreter comes from ``pyenv which``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3.99").write_text("#!/bin/sh\necho 'pyenv: python3.99: command not found' >&2\nexit 127\n")
    (bin_dir / "pyenv").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = versions ]; then printf "3.11.7\\n3.99.0\\n3.99.2\\n3.990.1\\n"; exit 0; fi\n'
        f'if [ "$1" = which ] && [ "$PYENV_VERSION" = 3.99.2 ]; then echo {sys.executable}; exit 0; fi\n'
        "exit 1\n")
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    found = _find_python("python3.99", f"{bin_dir}:/usr/bin:/bin")
    assert found == sys.executable  # the newest 3.99.x, not 3.990.1 and not the refusing shim


def test_every_data_file_of_the_package_is_shipped():
    """A non-editable install copies only what setup.cfg's package_data names besides the modules."""
    import configparser
    import fnmatch

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    patterns = [p.strip() for p in cfg["options.package_data"]["mxfp16"].split(",")]
    root = os.path.join(REPO, "mxfp16")
    data = [os.path.relpath(os.path.join(folder, name), root) for folder, dirs, files in os.walk(root)
            if "__pycache__" not in folder for name in files if not name.endswith((".py", ".pyc"))]
    assert {"amp/op_verdicts.json", "machine/mxnet_numpy_names.json"} <= set(data)
    assert [path for path in data if not any(fnmatch.fnmatch(path, p) for p in patterns)] == []
