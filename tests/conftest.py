"""Shared test helpers: fresh-process runs (AMP is process-global), and the markers for what a machine lacks.

A child process that imports this checkout's mxfp16 gets :func:`child_env`; one
that reports a result prints it as JSON on its last line, read by
:func:`last_line_json`.

Every marker is decided by a property detected on the machine that runs the
suite, never by the CPU a test was written on:

* ``requires_gpu`` skips where MXNet sees no CUDA GPU.
* ``requires_bfloat16`` skips where MXNet 1.9.1 cannot run bfloat16 arithmetic
  at all (a CPU without AVX-512, or ``DNNL_MAX_CPU_ISA`` capped below it): the
  tests behind it need bfloat16 arithmetic, and whatever else they check runs
  in float32 in a test of its own. Where the CPU's flags cannot be read
  (``kind == 'unknown'``: macOS, Windows) a bfloat16 Dense is run in a child
  process to decide (:data:`BFLOAT16_RUNS`).
* ``requires_native_bfloat16`` skips where bfloat16 is not native
  (``avx512_bf16`` or AMX): for claims about oneDNN's native kernels, which
  the emulation on AVX-512 CPUs without bfloat16 instructions does not share.

What MXNet's float32 -> bfloat16 cast does with subnormals also depends on the
CPU (flushed or kept): the ``bfloat16_cast`` fixture measures it
(:func:`mxfp16.float_formats.measure_bfloat16_cast`).
``DNNL_MAX_CPU_ISA=AVX2 make test`` runs the suite's bfloat16 arithmetic as an
AVX2-only CPU would; the cast keeps the CPU's own behaviour under it.
"""
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
import warnings

# The suite runs two test workers, two notebook kernels and their children on two cores. OpenMP threads that
# spin while they wait for work (libgomp's default, read when MXNet loads: so before anything imports it) then
# burn the cores the other processes need: a 2-epoch training run took 2.6x-3.0x the CPU-seconds of one whose
# threads sleep (OMP_WAIT_POLICY=PASSIVE), at a load of 8 on a 2-core Zen 4. Thread counts, and so what every test
# checks, are unchanged; only idle threads sleep. Children inherit it; a test that needs its own value sets it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import mxfp16  # noqa: F401 -- before anything imports MXNet: supplies the numpy names it needs (mxfp16.machine.stack)
from mxfp16.machine import hardware

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# auto's verdicts (mxfp16.measure.auto) go to a folder of this session's: tests neither read a user's cached
# verdicts nor leave their own behind, and children started by tests inherit it.
os.environ["MXFP16_CACHE_DIR"] = tempfile.mkdtemp(prefix="mxfp16-test-cache-")
atexit.register(shutil.rmtree, os.environ["MXFP16_CACHE_DIR"], True)  # each process removes the folder it made
# auto times a network in repeats of a second each by default (a verdict a user keeps): the suite's examples,
# recipes, notebooks and runs only need *a* verdict, so their probes time repeats of 100 ms, for the same code
# path in a tenth of the time. tests/test_auto_precision.py checks the default length and this setting.
os.environ.setdefault("MXFP16_AUTO_REPEAT_MS", "100")


def _gpu_count():
    try:
        import mxnet as mx
        return mx.context.num_gpus()
    except Exception:  # no CUDA runtime: no GPU
        return 0


HAS_GPU = _gpu_count() > 0


#: The files that take longest (CPU-seconds of their child processes, measured on 2 cores), longest first. Under
#: pytest-xdist (``make test``: ``--dist loadfile --no-loadscope-reorder``) files go to the workers in collection
#: order, one file to whichever worker is free: long files first and short ones last let the two workers end
#: together (a long file last would leave one worker idle while the other runs it). A file not named here keeps
#: its place after them; a renamed one only loses its place in the queue.
LONGEST_FIRST = ("test_amp_zoo.py", "test_sequence_models.py", "test_distributed_train.py", "test_train_faults.py",
                 "test_docs.py", "test_train_state.py", "test_amp_layers.py", "test_console.py", "test_bench_suite.py",
                 "test_distributed.py", "test_one_writer.py", "test_amp_routes.py", "test_inference_export.py",
                 "test_torch_coexistence.py", "test_tensorboard.py", "test_bench_inference.py", "test_examples.py")


def _queue_position(item):
    name = os.path.basename(item.nodeid.split("::")[0])
    if name == "test_notebooks.py":
        return len(LONGEST_FIRST) + 1
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(session, config, items):
    """The longest files first (:data:`LONGEST_FIRST`), the notebooks' file last.

    The notebooks' checks wait for the smoke runs started at collection, done
    by the time a worker reaches them last; reached in the middle, a worker
    would sit waiting while it could test. The sort is stable: within a file,
    and among the files not named, the order stays the collection's.
    """
    items.sort(key=_queue_position)


def pytest_collection_finish(session):
    """Start the selected notebooks' smoke runs now, when the session will check them (see tests/test_notebooks.py)."""
    wanted = [item for item in session.items if item.name.startswith("test_notebook_runs_in_smoke_mode")
              and not any(mark.args and mark.args[0] for mark in item.iter_markers("skipif"))]
    if wanted:
        try:
            import papermill  # noqa: F401 -- without it the notebook tests skip
        except ImportError:
            return
        wanted[0].module.start_smoke_runs([item.callspec.params["path"] for item in wanted])


def smoke_folder(run_id):
    """The folder of the notebooks' smoke runs (their outputs and results) in the run ``run_id`` names."""
    return os.path.join(tempfile.gettempdir(), f"mxfp16-notebooks-{run_id}")


def pytest_configure(config):
    """Name the run here, where pytest-xdist's workers get their ``testrunuid``, so that the last process knows the
    smoke runs' folder (tests/test_notebooks.py) and removes it: about 20 MB of executed notebooks a run."""
    if not os.environ.get("PYTEST_XDIST_WORKER") and getattr(config.option, "testrunuid", "") is None:
        config.option.testrunuid = uuid.uuid4().hex


def pytest_sessionfinish(session):
    """The process that runs the notebooks' smoke runs outlives them (under xdist, other workers wait for them); the
    run's last process (the only one, or xdist's controller once every worker is done) removes their folder."""
    module = sys.modules.get("test_notebooks")
    if module is not None:
        module.finish_smoke_runs()
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # xdist's run id, or this process's own (no workers)
        for run_id in {getattr(session.config.option, "testrunuid", None), os.getpid()} - {None}:
            shutil.rmtree(smoke_folder(run_id), ignore_errors=True)
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU and the mxnet-cu112 wheel")

#: mxfp16's classification of this CPU (what the library refuses or lets through, and why).
BFLOAT16 = hardware.bfloat16_support()
#: The CPU's class (AVX2, AVX-512, avx512_bf16, AMX: :data:`mxfp16.machine.hardware.CPU_CLASSES`), named in the
#: run's header and in every failure's report, so a failure on a CPU class nobody ran before says which it is.
CPU_CLASS = hardware.cpu_class()


def cpu_statement():
    return (f"CPU class {CPU_CLASS} ({hardware.CPU_CLASSES[CPU_CLASS]}); bfloat16 in MXNet here: "
            f"{BFLOAT16.describe()}")


def pytest_report_header(config):
    return cpu_statement()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(("CPU", cpu_statement()))
if BFLOAT16.kind == "unknown":  # no flags to classify the CPU by (the library lets it through): MXNet decides
    BFLOAT16_RUNS, _probe = hardware.probe_bfloat16_arithmetic()
    BFLOAT16_REASON = f"{BFLOAT16.reason}; {_probe}"
else:
    BFLOAT16_RUNS, BFLOAT16_REASON = BFLOAT16.runs, BFLOAT16.reason
#: The precision a test runs in where it means "mixed precision on this CPU": amp-bfloat16 where it runs, else
#: float32, so what the test checks beyond the arithmetic (files, outputs, resume) is checked on every CPU.
CPU_MIXED = "amp-bfloat16" if BFLOAT16_RUNS else "float32"
requires_bfloat16 = pytest.mark.skipif(
    not BFLOAT16_RUNS, reason=f"needs bfloat16 arithmetic (CPU classes AVX-512, avx512_bf16, AMX); this CPU is "
                              f"{CPU_CLASS}: {BFLOAT16_REASON}")
requires_native_bfloat16 = pytest.mark.skipif(
    not BFLOAT16.native, reason=f"needs native bfloat16 (CPU classes avx512_bf16, AMX); this CPU is {CPU_CLASS}, "
                                f"bfloat16 here: {BFLOAT16.describe()}")


@pytest.fixture(scope="session")
def bfloat16_cast():
    """What MXNet's float32 -> bfloat16 cast does with subnormals on this CPU, measured once in a child process."""
    from mxfp16.float_formats import measure_bfloat16_cast

    return measure_bfloat16_cast()


def child_env(env=None):
    """This process's environment plus ``env``, for a child that imports this checkout's mxfp16.

    PYTHONPATH is the repository first, then ``env``'s PYTHONPATH, then this process's.
    """
    extra = dict(env or {})
    path = [REPO, extra.pop("PYTHONPATH", ""), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p), **extra)


def last_line_json(output):
    """The JSON value a child printed last (its ``print(json.dumps(...))``), after whatever it logged before."""
    return json.loads(output.strip().splitlines()[-1])


#: What MXNet 1.9.1 leaves on standard error when its engine's threads race the C++ static destructors at exit
#: (apache/mxnet#17653, #19379): a SIGABRT after the process has done its work and printed its output.
#: mxfp16's own processes end before those destructors (:func:`mxfp16.plumbing.child.end_process`); a test's
#: ``python -c`` snippet does not, so :func:`run_python` runs one that died only of that once more.
MXNET_EXIT_ABORT = "terminate called without an active exception"


class MXNetExitAbort(UserWarning):
    """A child re-run because MXNet aborted it at exit (the warnings summary lists each)."""


def aborted_at_exit(proc):
    """Whether ``proc`` died of SIGABRT with :data:`MXNET_EXIT_ABORT` as the last line of its error output."""
    lines = (proc.stderr or "").strip().splitlines()
    return proc.returncode == -signal.SIGABRT and bool(lines) and lines[-1] == MXNET_EXIT_ABORT


def run_python(code, timeout=300, env=None, check=True, cwd=REPO):
    """Run ``code`` in a fresh Python process (so ``amp.init`` cannot leak between tests).

    Returns the CompletedProcess; with ``check`` a non-zero exit fails the test
    with the child's stderr. ``env`` adds variables (:func:`child_env`).
    ``cwd``: where relative paths the code writes land. A child that MXNet
    aborted at exit (:func:`aborted_at_exit`) runs once more, with a warning:
    one that aborts every time still fails.
    """
    argv = [sys.executable, "-c", textwrap.dedent(code)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=child_env(env), cwd=cwd)
    if aborted_at_exit(proc):
        warnings.warn(MXNetExitAbort(f"re-ran a child MXNet aborted at exit; it had printed:\n{proc.stdout[-500:]}"),
                      stacklevel=2)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=child_env(env), cwd=cwd)
    if check and proc.returncode != 0:
        pytest.fail(f"child process failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def python_child():
    return run_python


@pytest.fixture(autouse=True)
def _restore_environment():
    """Undo environment changes a test makes in-process.

    ``mxfp16.train`` sets MXNET_SAFE_ACCUMULATION and friends for float16, as a
    real run should; without this a later test (or a notebook it starts) would
    inherit them and measure something else.
    """
    saved = dict(os.environ)
    yield
    for name in set(os.environ) - set(saved):
        del os.environ[name]
    os.environ.update(saved)
