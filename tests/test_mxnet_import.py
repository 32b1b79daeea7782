"""What ``import mxfp16`` keeps out of MXNet's own load (:class:`mxfp16.machine.stack._LeanMXNetImport`).

Each check runs in a fresh interpreter: MXNet loads once per process.
"""
import math
import subprocess
import sys

import pytest
from conftest import REPO, child_env, last_line_json

pytest.importorskip("sklearn")
pytest.importorskip("scipy.stats")


def _child(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env=child_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_line_json(proc.stdout)


@pytest.fixture(scope="module")
def seen():
    """One process: what ``import mxfp16, mxnet`` loaded, then scipy.stats and scikit-learn in use."""
    return _child("""
import json, math, sys
import mxfp16, mxnet
from mxnet.contrib import quantization
from mxfp16.machine.stack import lean_mxnet_import
seen = {"sklearn": "sklearn" in sys.modules, "stats_ran": "scipy.stats._stats_py" in sys.modules,
        "stats_known": "scipy.stats" in sys.modules, "quantization_sees_stats": quantization.stats is not None,
        "base": mxnet.model.BASE_ESTIMATOR.__name__, "placed_again": lean_mxnet_import(),
        "finders": [type(f).__name__ for f in sys.meta_path]}
import mxnet.test_utils
from scipy.stats import norm
import scipy.stats
try:
    scipy.stats.no_such_name
except AttributeError as err:
    seen["missing"] = str(err)
from sklearn.datasets import load_digits
from sklearn.base import BaseEstimator
seen.update({"cdf": float(norm.cdf(1.0)), "via_mxnet": float(mxnet.test_utils.ss.norm.pdf(0.0)),
             "same": mxnet.test_utils.ss is scipy.stats, "class": type(scipy.stats).__name__,
             "digits": list(load_digits().data.shape), "estimator": BaseEstimator.__module__})
print(json.dumps(seen))
""")


def test_mxnet_loads_without_scikit_learn_and_without_running_scipy_stats(seen):
    assert seen["sklearn"] is False
    assert seen["stats_known"] is True and seen["stats_ran"] is False
    assert seen["quantization_sees_stats"] is True  # its "scipy installed?" check still says yes
    assert seen["base"] == "object"  # MXNet's own fallback for FeedForward
    assert seen["finders"][0] == "_LeanMXNetImport" and seen["finders"].count("_LeanMXNetImport") == 1
    assert seen["placed_again"] is False  # MXNet is loaded: nothing left to spare


def test_both_work_as_usual_afterwards_for_everyone(seen):
    assert seen["cdf"] == pytest.approx(0.5 * (1 + math.erf(1 / math.sqrt(2))))  # the normal CDF at 1
    assert seen["via_mxnet"] == pytest.approx(1 / math.sqrt(2 * math.pi))  # its density at 0
    assert seen["same"] is True and seen["class"] == "module"  # one module, run once, now a plain module
    assert "no_such_name" in seen["missing"]
    assert seen["digits"] == [1797, 64]
    assert seen["estimator"] == "sklearn.base"


def test_scikit_learn_loaded_first_stays_mxnets_base_and_scipy_stats_imported_outside_mxnet_runs_at_once():
    seen = _child("""
import json, sys
import sklearn.base
import mxfp16
import scipy.stats
ran = "scipy.stats._stats_py" in sys.modules
import mxnet
print(json.dumps({"base": mxnet.model.BASE_ESTIMATOR.__module__, "ran_at_import": ran}))
""")
    assert seen["base"] == "sklearn.base"
    assert seen["ran_at_import"] is True


def test_a_first_use_from_two_threads_runs_the_module_once_and_both_get_its_names(tmp_path):
    import importlib.machinery
    import importlib.util
    import threading
    import types

    from mxfp16.machine.stack import _OnFirstUse

    (tmp_path / "slow_first_use.py").write_text(
        "import time\nopen(__file__ + '.runs', 'a').write('x')\ntime.sleep(0.5)\nVALUE = 42\n")
    spec = importlib.machinery.PathFinder.find_spec("slow_first_use", [str(tmp_path)])
    spec.loader = _OnFirstUse(spec.loader)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imported, not run
    assert not (tmp_path / "slow_first_use.py.runs").exists()

    seen = []

    def use():
        try:
            seen.append(module.VALUE)
        except AttributeError as err:
            seen.append(str(err))

    first = threading.Thread(target=use)
    first.start()
    while not (tmp_path / "slow_first_use.py.runs").exists():  # the first thread is running the module's code
        threading.Event().wait(0.01)
    second = threading.Thread(target=use)  # asks while the module is still running
    second.start()
    first.join(10)
    second.join(10)
    assert seen == [42, 42]
    assert (tmp_path / "slow_first_use.py.runs").read_text() == "x"  # run once
    assert type(module) is types.ModuleType
    assert not hasattr(module, "no_such_name")
