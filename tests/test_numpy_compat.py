"""numpy and Python versions newer than MXNet 1.9.1: the names they removed, supplied before MXNet loads.

Most checks run in a fresh process whose numpy is made to look like a newer
one (names deleted, the module's ``__getattr__`` answering nothing), so the
supply path is exercised on every Python the suite runs on; the
newest-Python leg of ``make test`` runs the same file on a real numpy 2.
"""
import configparser
import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import subprocess
import sys
import warnings

from mxfp16.machine import stack
from mxfp16.machine.stack import MXNET_NUMPY_NAMES as NAMES

import numpy as np
import pytest
from conftest import REPO, last_line_json, run_python
from packaging.requirements import Requirement

#: What numpy 1.24, 2.0 and 2.4 removed that MXNet 1.9.1 uses (numpy's release notes), for the simulated numpy.
#: numpy 2 brought ``np.bool`` back as its own ``numpy.bool_``, which numpy's internals use: never hidden there.
#: ``trapz`` is hidden only where ``trapezoid`` (numpy 2.0) exists to stand in for it.
REMOVED = ["bool"] * ("bool" not in vars(np)) + ["int", "PZERO", "NZERO", "PINF", "NINF", "Inf", "NaN", "NAN",
           "alltrue", "sometrue", "product", "round_", "msort", "compat", "mirr", "npv", "pmt", "ppmt", "pv", "rate",
           "in1d"] + ["trapz"] * hasattr(np, "trapezoid")

#: Code that makes this process's numpy lack ``names`` the way numpy 2 does (its __getattr__ then raises).
NEWER_NUMPY = """
import numpy
_hidden = {hidden!r}
for _name in _hidden:
    numpy.__dict__.pop(_name, None)
_original = numpy.__dict__.get("__getattr__")
def _getattr(name):
    if name in _hidden:
        raise AttributeError(f"`np.{{name}}` was removed (simulated)")
    if _original is None:
        raise AttributeError(name)
    return _original(name)
numpy.__getattr__ = _getattr
"""


def _scanner():
    spec = importlib.util.spec_from_file_location("mxnet_numpy_names", os.path.join(REPO, "tools",
                                                                                    "mxnet_numpy_names.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _resolve(module, dotted):
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def test_the_name_list_is_what_the_installed_mxnet_uses():
    scanner = _scanner()
    scanned = scanner.scan()
    assert sorted(scanned) == sorted(NAMES), (
        "MXNet's numpy names changed; regenerate: "
        "python tools/mxnet_numpy_names.py > mxfp16/machine/mxnet_numpy_names.json")
    # The file is exactly what the tool writes (its text, not only its names).
    with open(os.path.join(REPO, "mxfp16", "machine", "mxnet_numpy_names.json"), encoding="utf-8") as handle:
        assert handle.read() == scanner.render(scanned, f"mxnet {importlib.metadata.version('mxnet')}")
    # The scan reads all three ways MXNet reaches numpy, not only attribute access.
    assert "PZERO" in scanned and "compat.basestring" in scanned  # np.PZERO, _np.compat.basestring
    assert "mirr" in scanned and "linalg.norm" in scanned  # fallback.py; a dispatch-protocol list entry


def test_the_scanner_reads_aliases_from_imports_and_looped_getattr(tmp_path):
    (tmp_path / "a.py").write_text("import numpy as onp\nx = onp.alpha + onp.sub.beta\n")
    (tmp_path / "b.py").write_text("from numpy import gamma\nimport numpy\ny = numpy.delta(1)\n")
    (tmp_path / "c.py").write_text("import numpy as _np\nOPS = ['eps', 'lin.zeta']\n"
                                   "for op in OPS:\n    f = getattr(_np, op)\n")
    (tmp_path / "d.py").write_text("from . import numpy as np\nz = np.not_numpy\n")  # MXNet's own np
    assert _scanner().scan(str(tmp_path)) == {
        "alpha": ["a.py"], "delta": ["b.py"], "eps": ["c.py"], "gamma": ["b.py"], "lin.zeta": ["c.py"],
        "sub.beta": ["a.py"]}


def test_the_scanner_lists_what_a_numpy_lacks():
    # `python tools/mxnet_numpy_names.py --missing` on a newly installed numpy: the names needing a stand-in.
    import types

    fake = types.SimpleNamespace(alpha=1, sub=types.SimpleNamespace(beta=2))
    assert _scanner().missing(["alpha", "sub.beta", "sub.gone", "gone"], numpy=fake) == ["sub.gone", "gone"]
    assert _scanner().missing(NAMES) == []  # this process's numpy, after mxfp16 supplied what it lacked


def test_every_name_mxnet_uses_resolves_here():
    import mxnet  # noqa: F401 -- loads after mxfp16 (conftest imports it), as a user's would
    missing = [n for n in NAMES if not _resolves(n)]
    assert not missing


def _resolves(dotted):
    try:
        _resolve(np, dotted)
    except (AttributeError, RuntimeError):
        return False
    return True


def test_a_newer_numpy_gets_the_removed_names_and_mxnet_runs():
    proc = run_python(NEWER_NUMPY.format(hidden=REMOVED) + """
import json, math
import mxfp16
from mxfp16.machine import stack
import mxnet as mx
from mxnet import gluon, autograd
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(4, activation="relu"), gluon.nn.Dense(2))
net.initialize()
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
x = mx.nd.random.uniform(shape=(8, 3))
with autograd.record():
    loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), mx.nd.zeros(8))
loss.backward()
trainer.step(8)
print(json.dumps({"supplied": stack.SUPPLIED, "loss": float(loss.mean().asscalar()),
                  "np_ops": float(mx.np.array([1.0, 2.0]).sum())}))
""")
    report = last_line_json(proc.stdout)
    assert set(REMOVED) <= set(report["supplied"])
    assert math.isfinite(report["loss"]) and report["np_ops"] == 3.0


def test_supplied_values_match_what_numpy_said_to_use_instead():
    proc = run_python(NEWER_NUMPY.format(hidden=REMOVED) + """
import json, math
import numpy
native_bool = "bool" not in _hidden and hasattr(numpy, "bool")  # numpy 2's own numpy.bool; 1.24 to 1.26 have none
import mxfp16
a = numpy.array([[3.0, 1.0], [1.0, 2.0], [2.0, 0.5]])
print(json.dumps({
    "pzero": math.copysign(1, numpy.PZERO), "nzero": math.copysign(1, numpy.NZERO),
    "pinf": numpy.PINF, "ninf": numpy.NINF, "inf": numpy.Inf, "nan": [math.isnan(numpy.NaN), math.isnan(numpy.NAN)],
    "all": [bool(numpy.alltrue([True, False])), bool(numpy.alltrue([True, True]))],
    "any": [bool(numpy.sometrue([False, False])), bool(numpy.sometrue([False, True]))],
    "product": float(numpy.product([2.0, 3.0, 4.0])), "round": float(numpy.round_(2.675, 2)),
    "msort": numpy.msort(a).tolist(), "bool": numpy.bool is (numpy.bool_ if native_bool else bool),
    "int": numpy.int is int,
    "basestring": numpy.compat.basestring is str,
}))
try:
    numpy.mirr([1.0], 0.1, 0.1)
except RuntimeError as err:
    print(err)
""")
    lines = proc.stdout.strip().splitlines()
    got = json.loads(lines[0])
    # Independent values: IEEE signed zeros and infinities, Python's any/all, the product by hand.
    assert got["pzero"] == 1.0 and got["nzero"] == -1.0
    assert got["pinf"] == float("inf") and got["ninf"] == float("-inf") and got["inf"] == float("inf")
    assert got["nan"] == [True, True]
    assert got["all"] == [False, True] and got["any"] == [False, True]
    assert got["product"] == 24.0 and got["round"] == pytest.approx(2.67, abs=0.011)
    columns = [sorted(col) for col in zip(*[[3.0, 1.0], [1.0, 2.0], [2.0, 0.5]])]
    assert got["msort"] == [list(row) for row in zip(*columns)]  # each column sorted on its own
    assert got["bool"] and got["int"] and got["basestring"]
    # A financial function fails as numpy 1.x's own stand-in did, naming where it went.
    assert "numpy-financial" in lines[1]


def _shim(name):
    """The stand-in mxfp16 supplies for ``numpy.<name>`` where numpy lacks it (built here, numpy untouched)."""
    return stack._replacements(np)[name][1]


@pytest.mark.parametrize("assume_unique", [False, True])
@pytest.mark.parametrize("invert", [False, True])
def test_the_supplied_in1d_is_isin_on_the_flattened_array(assume_unique, invert):
    rng = np.random.default_rng(7)
    in1d = _shim("in1d")
    for _trial in range(20):
        # Values drawn from a small pool so that many are shared; unique ones where assume_unique promises it.
        pool = rng.standard_normal(12).astype(np.float64)
        if assume_unique:
            ar1 = rng.permutation(pool)[:6].reshape(2, 3)
            ar2 = rng.permutation(pool)[:5]
        else:
            ar1 = rng.choice(pool, size=(3, 4))
            ar2 = rng.choice(pool, size=7)
        got = in1d(ar1, ar2, assume_unique=assume_unique, invert=invert)
        wanted = np.isin(ar1, ar2, assume_unique=assume_unique, invert=invert).ravel()
        assert got.shape == (ar1.size,) and got.dtype == np.bool_
        np.testing.assert_array_equal(got, wanted)
        # Independent of numpy's set routines: membership element by element.
        by_hand = np.array([(v in set(ar2.tolist())) != invert for v in ar1.ravel().tolist()])
        np.testing.assert_array_equal(got, by_hand)
        if "in1d" in vars(np) and "in1d" not in stack.SUPPLIED:  # numpy before 2.4's own: the same answer
            with _quiet():
                np.testing.assert_array_equal(got, np.in1d(ar1, ar2, assume_unique=assume_unique, invert=invert))
    assert in1d(3.0, [1.0, 3.0]).tolist() == [True]  # a scalar answers in one dimension, as numpy's in1d did


def test_the_supplied_trapz_is_trapezoid():
    if not hasattr(np, "trapezoid"):
        pytest.skip("numpy before 2.0 has no trapezoid; there its own trapz is never replaced")
    rng = np.random.default_rng(11)
    trapz, own = _shim("trapz"), np.trapezoid
    for _trial in range(20):
        y = rng.standard_normal((3, 9)).astype(np.float64)
        x = np.sort(rng.uniform(-2.0, 2.0, size=9))
        dx = float(rng.uniform(0.1, 2.0))
        results = [trapz(y), trapz(y, x), trapz(y, dx=dx), trapz(y.T, x, axis=0)]
        for got, wanted in zip(results, [own(y), own(y, x), own(y, dx=dx), own(y.T, x, axis=0)]):
            np.testing.assert_array_equal(got, wanted)
        if "trapz" in vars(np) and "trapz" not in stack.SUPPLIED:  # numpy before 2.4's own: the same answer
            with _quiet():
                for got, wanted in zip(results, [np.trapz(y), np.trapz(y, x), np.trapz(y, dx=dx),
                                                 np.trapz(y.T, x, axis=0)]):
                    np.testing.assert_allclose(got, wanted, rtol=1e-15, atol=1e-15)
        # Independent: the trapezoid rule written out.
        by_hand = ((y[:, 1:] + y[:, :-1]) / 2 * np.diff(x)).sum(axis=1)
        np.testing.assert_allclose(results[1], by_hand, rtol=1e-12, atol=1e-12)
    assert trapz([1.0, 2.0, 3.0], dx=0.5) == 2.0  # exact for a straight line


@contextlib.contextmanager
def _quiet():
    """numpy 2.0 to 2.3 deprecate their own in1d and trapz: comparing against them warns."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def test_mxnet_operators_that_call_in1d_and_trapz_run_on_the_supplied_names():
    # MXNet's numpy front end takes both from numpy at import (mxnet/numpy/fallback.py) and calls them for
    # mx.np.in1d and mx.np.trapz: on numpy 2.4+ (or the simulated one) they are mxfp16's. The child ends as
    # mxfp16's own processes do (end_process): MXNet aborted this one at exit (apache/mxnet#17653) on its run
    # and on run_python's re-run, in one CI run of the newest leg; 1 of 60 runs here, 0 of 60 with end_process.
    hidden = [n for n in REMOVED if n in ("in1d", "trapz")]
    proc = run_python(NEWER_NUMPY.format(hidden=hidden) + """
import json
import mxfp16, numpy
from mxfp16.machine import stack
import mxnet as mx
a = mx.np.array([[1.0, 2.0], [3.0, 4.0]], dtype="float64")
b = mx.np.array([2.0, 4.0, 5.0], dtype="float64")
y = mx.np.array([1.0, 2.0, 4.0], dtype="float64")
x = mx.np.array([0.0, 1.0, 3.0], dtype="float64")
print(json.dumps({"supplied": sorted(stack.SUPPLIED), "numpy": numpy.__version__,
                  "in1d": mx.np.in1d(a, b).tolist(), "in1d_invert": mx.np.in1d(a, b, invert=True).tolist(),
                  "trapz": float(mx.np.trapz(y, x)), "trapz_dx": float(mx.np.trapz(y, dx=0.5))}))
from mxfp16.plumbing.child import end_process
end_process(0)
""")
    got = last_line_json(proc.stdout)
    assert set(hidden) <= set(got["supplied"])
    assert got["in1d"] == [False, True, False, True] and got["in1d_invert"] == [True, False, True, False]
    assert got["trapz"] == 1.5 + 6.0 and got["trapz_dx"] == 0.5 * (1.5 + 3.0)


def test_a_name_numpy_still_has_is_never_replaced():
    proc = run_python(NEWER_NUMPY.format(hidden=["PZERO", "alltrue"]) + """
import numpy
numpy.alltrue = "the user's own"      # present: must survive
import mxfp16
from mxfp16.machine import stack
print(numpy.alltrue, sorted(stack.SUPPLIED))
""")
    assert proc.stdout.split()[:3] == ["the", "user's", "own"]
    assert "PZERO" in proc.stdout and "'alltrue'" not in proc.stdout


def test_a_numpy_that_removed_an_unknown_name_fails_at_import_naming_it_and_the_pin():
    proc = run_python(NEWER_NUMPY.format(hidden=["isclose", "PZERO"]) + """
import mxfp16
""", check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()
    assert "ImportError" in proc.stderr and "AttributeError" not in proc.stderr
    assert "numpy.isclose" in proc.stderr and "numpy.PZERO" not in proc.stderr  # PZERO was supplied
    pin = stack.TESTED_NUMPY[sys.version_info[:2]]
    assert f"pip install 'numpy=={pin}'" in proc.stderr, last


def test_the_message_for_an_untested_python_names_the_newest_tested_stack():
    message = stack.unknown_numpy_message("3.1.0", ["isclose"], python=(3, 15))
    newest = stack.TESTED_NUMPY[max(stack.TESTED_NUMPY)]
    assert "Python 3.15 is not tested" in message and f"numpy {newest}" in message and "numpy.isclose" in message


def test_the_newest_leg_defaults_to_the_numpy_tested_on_the_newest_python():
    # `make test-newest NEWEST_NUMPY=2.3.5` tries another numpy; without it the leg runs the pinned one.
    with open(os.path.join(REPO, "Makefile")) as handle:
        default = [line.split("?=")[1].strip() for line in handle if line.startswith("NEWEST_NUMPY")]
    assert default == [stack.TESTED_NUMPY[max(stack.TESTED_NUMPY)]]


#: A meta-path finder that hides the standard library's (and setuptools' hook's) distutils.
NO_DISTUTILS = """
import sys
class _Hide:
    def __init__(self, names):
        self.names = names
    def find_spec(self, name, path=None, target=None):
        if name in self.names:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
for _name in [n for n in sys.modules if n == "distutils" or n.startswith(("distutils.", "_distutils_hack"))]:
    del sys.modules[_name]
sys.meta_path = [f for f in sys.meta_path if "distutils" not in type(f).__module__]
sys.meta_path.insert(0, _Hide({hidden!r}))
"""


def test_distutils_comes_from_setuptools_where_python_has_none():
    proc = run_python(NO_DISTUTILS.format(hidden=["distutils"]) + """
import mxfp16
from mxfp16.machine import stack
from distutils.version import LooseVersion   # what MXNet's numpy front end imports
import mxnet as mx
print(stack.DISTUTILS["source"], LooseVersion("2.2.6") > LooseVersion("1.17"), mx.np.ones(2).sum())
""")
    assert proc.stdout.split()[:3] == ["setuptools._distutils", "(supplied", "by"]
    assert "True" in proc.stdout


def test_no_distutils_and_no_setuptools_is_explained():
    proc = run_python(NO_DISTUTILS.format(hidden=["distutils", "setuptools"]) + """
import mxfp16
""", check=False)
    assert proc.returncode != 0
    assert "distutils" in proc.stderr and "pip install setuptools" in proc.stderr


def _pins():
    """``{marker: pin}`` for numpy in constraints.txt."""
    pins = []
    with open(os.path.join(REPO, "constraints.txt")) as handle:
        for line in handle:
            line = line.split("#")[0].strip()
            if line.startswith("numpy"):
                pins.append(Requirement(line))
    return pins


@pytest.mark.parametrize("python", sorted(stack.TESTED_NUMPY), ids=lambda v: "%d.%d" % v)
def test_constraints_setup_cfg_and_the_compat_table_agree_per_python(python):
    env = {"python_version": "%d.%d" % python, "python_full_version": "%d.%d.0" % python}
    pinned = [r for r in _pins() if r.marker is None or r.marker.evaluate(env)]
    assert len(pinned) == 1, f"constraints.txt must pin numpy once for Python {env['python_version']}"
    version = next(iter(pinned[0].specifier)).version
    assert version == stack.TESTED_NUMPY[python]
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    wanted = [Requirement(line) for line in cfg["options"]["install_requires"].splitlines()
              if line.strip().startswith("numpy")]
    applies = [r for r in wanted if r.marker is None or r.marker.evaluate(env)]
    assert len(applies) == 1 and version in applies[0].specifier
    # MXNet itself comes from the extra where its numpy<2 can be met, and --no-deps (Makefile) where not.
    cpu = [Requirement(line) for line in cfg["options.extras_require"]["cpu"].splitlines() if line.strip()]
    with_mxnet = any(r.name == "mxnet" and (r.marker is None or r.marker.evaluate(env)) for r in cpu)
    assert with_mxnet == (int(version.split(".")[0]) < 2)


def test_every_tested_python_is_named_in_the_readme():
    with open(os.path.join(REPO, "README.md")) as handle:
        readme = handle.read()
    for numpy_version in stack.TESTED_NUMPY.values():
        assert numpy_version in readme
    assert "3.8 to 3.13" in readme


def test_info_reports_python_numpy_and_what_was_supplied():
    proc = subprocess.run([sys.executable, "-m", "mxfp16", "info", "--json"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["stack"]
    assert report["python"] == ".".join(map(str, sys.version_info[:3])) and report["numpy"] == np.__version__
    assert report["numpy_tested"] == stack.TESTED_NUMPY.get(sys.version_info[:2])
    # The same numpy in this process: info reports what mxfp16 supplied here (nothing on numpy 1.23).
    assert report["numpy_names_supplied"] == stack.SUPPLIED
    assert all(not _resolves_unprepared(name) for name in report["numpy_names_supplied"])
    text = subprocess.run([sys.executable, "-m", "mxfp16", "info"], capture_output=True, text=True, cwd=REPO,
                          timeout=120).stdout
    assert f"numpy {np.__version__}" in text and "numpy names mxfp16 supplied for MXNet" in text


def test_on_numpy_2_the_names_numpy_removed_were_supplied():
    if int(np.__version__.split(".")[0]) < 2:
        pytest.skip("runs on numpy 2 (the newest-Python leg of make test)")
    assert {"PZERO", "NaN", "alltrue", "compat"} <= set(stack.SUPPLIED)
    assert np.PZERO == 0.0 and math.isnan(np.NaN)


def _resolves_unprepared(name):
    """Whether a fresh process's numpy has ``name`` before mxfp16 touches it."""
    proc = run_python(f"import numpy\nprint(hasattr(numpy, {name!r}))")
    return proc.stdout.strip() == "True"
