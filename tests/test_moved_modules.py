"""Modules that moved keep their old import path for one release, as the same module object, with a warning."""
import subprocess
import sys

import pytest

MOVED = {
    "mxfp16.parts": "mxfp16.training_parts",
    "mxfp16.formats": "mxfp16.float_formats",
    "mxfp16.hardware": "mxfp16.machine.hardware",
    "mxfp16.environment": "mxfp16.machine.environment",
    "mxfp16._compat": "mxfp16.machine.stack",
    "mxfp16.gpu": "mxfp16.machine.gpu",
    "mxfp16.gpu.libraries": "mxfp16.machine.gpu.libraries",
    "mxfp16.gpu.coverage": "mxfp16.machine.gpu.coverage",
    "mxfp16.data.bench": "mxfp16.data.timing",
}

CHILD = """
import importlib, sys, warnings
old, new, named = sys.argv[1], sys.argv[2], sys.argv[3]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    moved = importlib.import_module(old)
print(moved is importlib.import_module(new),
      any(issubclass(w.category, DeprecationWarning) and named in str(w.message) for w in caught))
"""


@pytest.mark.parametrize("old", list(MOVED))
def test_an_old_path_is_the_new_module_and_warns(old):
    # a module of a moved package is named by its package's warning
    named = "mxfp16.machine.gpu" if old.startswith("mxfp16.gpu.") else MOVED[old]
    proc = subprocess.run([sys.executable, "-c", CHILD, old, MOVED[old], named], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert proc.stdout.split() == ["True", "True"], (old, proc.stdout, proc.stderr[-800:])


def test_the_package_itself_uses_no_old_path():
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning:mxfp16", "-c",
                           "import warnings; warnings.filterwarnings('error', message='.*moved to mxfp16')\n"
                           "import mxfp16.cli, mxfp16.train.run, mxfp16.bench.runner, mxfp16.inference.export\n"
                           "from mxfp16.commands import info, bench, data, diagnose, export, predict, train"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
