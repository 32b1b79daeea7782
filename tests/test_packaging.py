"""Install-time guards, the command-line entry points and `mxfp16 info`."""
import json
import subprocess
import sys

import mxnet as mx
import numpy as np

from conftest import REPO, run_python
from mxfp16 import __version__, hardware


def test_numpy_too_new_is_explained():
    proc = run_python("""
        import numpy
        numpy.__version__ = "1.26.4"   # what a resolver without the constraints file installs
        import mxfp16
    """, check=False)
    assert proc.returncode != 0
    assert "numpy<1.24" in proc.stderr and "1.26.4" in proc.stderr and "constraints.txt" in proc.stderr


def test_missing_mxnet_is_explained():
    proc = run_python("""
        import sys
        sys.modules["mxnet"] = None    # as if no MXNet wheel were installed
        import mxfp16
    """, check=False)
    assert proc.returncode != 0
    assert "mxfp16[cpu]" in proc.stderr and "mxnet-cu112" in proc.stderr


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
    flags = hardware.cpu_flags()
    assert machine["cpu_bfloat16"] == {"avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags}
    assert report["precisions"]["float32"]["runs"] is True
    assert report["precisions"]["float16"]["runs"] is (mx.context.num_gpus() > 0)
    expected_auto = ("float16" if machine["gpus"] else
                     "amp-bfloat16" if hardware.has_cpu_bfloat16() else "float32")
    assert report["auto"]["resolves_to"] == expected_auto
    f16 = report["formats"]["float16"]
    assert f16["max"] == float(np.finfo(np.float16).max)
    assert f16["smallest_subnormal"] == float(np.finfo(np.float16).smallest_subnormal)


def test_info_text_mentions_precisions():
    proc = _cli("info")
    assert proc.returncode == 0
    for word in ("float16", "amp-bfloat16", "auto ->", "min subnormal"):
        assert word in proc.stdout
