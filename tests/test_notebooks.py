"""Every tutorial notebook runs top to bottom in SMOKE mode, in a fresh kernel.

The notebooks assert their own claims, so a notebook that executes is a
notebook whose claims still hold. Each one runs in its own papermill process
and kernel (AMP is process-global, so no notebook may inherit another's
patched MXNet), with ``SMOKE = True`` injected into its parameters cell, in a
scratch working directory so nothing is written into the repository. Two run
at a time, started as soon as the session has collected them: most of a
smoke run is process start-up and imports, which overlap well with the rest
of the suite on two cores.

Every notebook runs on every CPU: where this CPU cannot run bfloat16 (no
AVX-512), the notebooks that compute in bfloat16 (4, 8, 9 and 10) skip those
cells with the reason, read from ``mxfp16.machine.hardware.bfloat16_support``,
and check the rest.
"""
import glob
import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings

import nbformat
import pytest
from conftest import REPO, smoke_folder

NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "notebooks", "[0-9][0-9]_*.ipynb")))
IDS = [os.path.basename(p)[:-len(".ipynb")] for p in NOTEBOOKS]
SMOKE = [pytest.param(path, id=name) for path, name in zip(NOTEBOOKS, IDS)]
PARALLEL = 2
TIMEOUT = 600
#: What papermill says when the kernel died while starting, before it ran any cell (once in a CI run, notebook 1
#: on a 2-core Zen 3; the kernel's own error was not kept). One candidate: jupyter_client picks the kernel's ports
#: free and the kernel binds them a moment later, while this suite starts kernels, MXNet's kvstore and other
#: children side by side. Such a run is started once more; a kernel that dies twice still fails the test.
KERNEL_START_DIED = "Kernel died before replying to kernel_info"
RETRIED = "(the first kernel died before replying to kernel_info; this is the second run)"


def _code_cells(path):
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_the_ten_notebooks_are_there():
    assert [os.path.basename(p)[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_is_saved_with_a_full_run(path):
    cells = _code_cells(path)
    tagged = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "one code cell must carry the papermill 'parameters' tag"
    assert "SMOKE = False" in tagged[0].source
    # A SMOKE run saved by mistake carries papermill's injected cell.
    assert not any("injected-parameters" in c.metadata.get("tags", []) for c in cells)
    unexecuted = [i for i, c in enumerate(cells) if c.source.strip() and c.execution_count is None]
    assert not unexecuted, f"code cells {unexecuted} have no outputs; re-run the notebook with papermill"
    errors = [o for c in cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"saved with an error: {errors[0].get('ename')}: {errors[0].get('evalue')}"


#: What Jupyter saves for a matplotlib figure it had no image formatter for (a ``Figure`` left as a cell's
#: value without the inline backend, e.g. one made by ``mxfp16.plumbing.plotting.new_figure``): its repr (as matplotlib
#: writes it now, and as older releases did), which the site shows as text where the picture should be.
FIGURE_REPR = re.compile(r"<Figure size [\d.]+x[\d.]+ with \d+ Axes>|<matplotlib\.figure\.Figure at 0x[0-9a-f]+>")


def bare_figures(path):
    """``(cell index, execution count, repr)`` of each saved output that is a Figure's repr and no picture."""
    found = []
    for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            text = data.get("text/plain", "")
            text = ("".join(text) if isinstance(text, list) else text).strip()
            if FIGURE_REPR.fullmatch(text) and not any(kind.startswith("image/") for kind in data):
                found.append((index, cell.get("execution_count"), text))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_saved_figures_are_pictures_not_reprs(path):
    bare = bare_figures(path)
    assert not bare, f"{os.path.basename(path)}: " + "; ".join(
        f"cell {index} (execution count {count}) saved {text!r} instead of the picture" for index, count, text in bare
    ) + ". Show the figure (plt.show() with the inline backend, or display(Image(...)) of a saved PNG) and re-run."


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_cell_prints_a_commands_output_twice(path):
    """A cell ending with ``mxfp16_command(...)`` once saved the whole output again, as the result's repr."""
    twice = [index for index, cell in enumerate(nbformat.read(path, as_version=4).cells) if cell.cell_type == "code"
             for output in cell.get("outputs", []) if output.get("output_type") == "execute_result"
             and "stdout=" in "".join(output.get("data", {}).get("text/plain", ""))]
    assert not twice, f"{os.path.basename(path)}: cells {twice} show a CommandResult with its stdout again"


def _result_file(folder, path):
    return os.path.join(folder, os.path.basename(path)[:-len(".ipynb")] + ".result.json")


class _SmokeRuns:
    """Start the given notebooks' smoke runs at once, at most ``PARALLEL`` at a time; wait per notebook.

    Each result is also written to ``folder`` as JSON, so that under pytest-xdist the one worker that runs the
    notebooks (``gw0``) and the worker whose test checks one of them need not be the same process.
    """

    def __init__(self, folder, paths):
        self.folder = folder
        self.results = {}
        self._done = {path: threading.Event() for path in paths}
        self._slots = threading.Semaphore(PARALLEL)
        # The slowest notebooks (they launch child processes) first, so the tail is short.
        for path in sorted(paths, reverse=True):
            threading.Thread(target=self._run, args=(path,), daemon=True).start()

    def _run(self, path):
        name = os.path.basename(path)[:-len(".ipynb")]
        workdir, scratch = os.path.join(self.folder, name), os.path.join(self.folder, name + ".tmp")
        os.makedirs(workdir)
        os.makedirs(scratch)
        out = os.path.join(workdir, name + ".ipynb")
        # MXNet's numpy shims are noisy. One OpenMP thread per kernel: two smoke runs beside the rest of
        # the suite would otherwise put six spinning OpenMP threads on two cores (SMOKE work is tiny).
        # TMPDIR: the notebook's temporary folders, so that the test can check it removed them.
        env = dict(os.environ, PYTHONWARNINGS="ignore::DeprecationWarning", OMP_NUM_THREADS="1", TMPDIR=scratch)
        argv = [sys.executable, "-m", "papermill", "--no-progress-bar", "-k", "python3", "-p", "SMOKE", "True",
                "--cwd", workdir, "--execution-timeout", str(TIMEOUT), path, out]
        with self._slots:
            start = time.monotonic()
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env=env)
                if proc.returncode and KERNEL_START_DIED in proc.stderr:  # died starting: once more
                    proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env=env)
                    proc.stderr = RETRIED + "\n" + proc.stderr
                self.results[path] = (proc.returncode, proc.stderr, out, time.monotonic() - start)
            except subprocess.TimeoutExpired as err:
                self.results[path] = (None, f"timed out after {TIMEOUT} s: {err}", out, TIMEOUT)
            finally:
                result = self.results.get(path, (None, "the smoke run's thread failed", out, 0))
                staging = _result_file(self.folder, path) + ".tmp"
                with open(staging, "w", encoding="utf-8") as handle:
                    json.dump(list(result), handle)
                os.replace(staging, _result_file(self.folder, path))
                self._done[path].set()

    def wait(self, path):
        self._done[path].wait(TIMEOUT * len(NOTEBOOKS))
        return self.results[path]

    def wait_all(self):
        for path in self._done:
            self.wait(path)


class _RemoteSmokeRuns:
    """Another xdist worker's smoke runs, read from the result files its :class:`_SmokeRuns` writes."""

    def __init__(self, folder):
        self.folder = folder

    def wait(self, path):
        result = _result_file(self.folder, path)
        deadline = time.monotonic() + TIMEOUT * len(NOTEBOOKS)
        while not os.path.exists(result):
            if time.monotonic() > deadline:
                return None, f"no result from the worker that runs the notebooks in {self.folder}", "", 0
            time.sleep(1)
        with open(result, encoding="utf-8") as handle:
            return tuple(json.load(handle))


_STARTED = []


def _shared_folder():
    """The smoke runs' folder: under pytest-xdist every worker of this run names it alike (conftest.py removes it)."""
    return smoke_folder(os.environ.get("PYTEST_XDIST_TESTRUNUID") or os.getpid())


def runs_notebooks_here():
    """Whether this process runs the smoke runs: the only one without xdist, the first worker with it."""
    return os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0"


def start_smoke_runs(paths=NOTEBOOKS):
    """Start the smoke runs of ``paths`` once per session (``conftest.py`` calls this right after collection).

    They are mostly process start-up and imports, so started early they
    overlap with the rest of the suite instead of holding it up here.
    ``conftest.py`` passes only the notebooks the session selected (the
    newest-Python leg runs one). Under pytest-xdist only the first worker
    runs them; the others read its result files (:class:`_RemoteSmokeRuns`).
    """
    if not _STARTED:
        shared = _shared_folder()
        if not runs_notebooks_here():
            _STARTED.append(_RemoteSmokeRuns(shared))
        else:
            os.makedirs(shared, exist_ok=True)
            _STARTED.append(_SmokeRuns(shared, list(paths)))
    return _STARTED[0]


def finish_smoke_runs():
    """Wait for this process's smoke runs (the worker that runs them must outlive them: others read their results)."""
    if _STARTED and isinstance(_STARTED[0], _SmokeRuns):
        _STARTED[0].wait_all()


@pytest.fixture(scope="module")
def smoke_runs():
    pytest.importorskip("papermill")
    return start_smoke_runs()


@pytest.mark.slow
@pytest.mark.parametrize("path", SMOKE)
def test_notebook_runs_in_smoke_mode(path, smoke_runs):
    returncode, stderr, out, seconds = smoke_runs.wait(path)
    error = [line for line in stderr.splitlines() if line.strip()][-25:]
    assert returncode == 0, f"{os.path.basename(path)} failed in SMOKE mode after {seconds:.0f} s:\n" + "\n".join(error)
    if stderr.startswith(RETRIED):
        warnings.warn(f"{os.path.basename(path)}: {RETRIED}", stacklevel=1)
    executed = nbformat.read(out, as_version=4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)
    assert all(c.execution_count is not None for c in executed.cells if c.cell_type == "code" and c.source.strip())
    # A notebook writes only to temporary folders and to data/ (the demo set), which .gitignore covers
    # both at the top of the repository and under notebooks/ (Jupyter's working directory).
    left = sorted(set(os.listdir(os.path.dirname(out))) - {os.path.basename(out)})
    assert set(left) <= {"data"}, f"{os.path.basename(path)} wrote {left} into its working directory"
    # ... and leaves no temporary file behind: run after run, they filled a disk. Its own folder (`mxfp16-nbN-*`,
    # a TemporaryDirectory) goes when its kernel stops, but not where the kernel ends before Python's exit handlers
    # run (once in a CI run: notebook 7's stayed); TMPDIR lies in the session's folder, removed at its end anyway.
    # Not ours: onnxruntime's one 51-byte `.ses` (a fixed name, reused), and the empty `pymp-*` folders of the
    # workers MXNet's DataLoader stops with SIGTERM (multiprocessing removes them only in a process that exits).
    left = [n for n in os.listdir(os.path.dirname(out) + ".tmp")
            if n != ".ses" and not n.startswith(("pymp-", "mxfp16-nb"))]
    assert left == [], f"{os.path.basename(path)} left {left} in its temporary folder"


def test_the_folders_notebooks_write_are_ignored():
    """Run from the repository or from notebooks/ (where Jupyter starts them), the demo set is not committed."""
    for path in ("data/demo/train/circle/0001.jpg", "notebooks/data/demo/train/circle/0001.jpg"):
        proc = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO)
        assert proc.returncode == 0, f"{path} is not ignored by .gitignore"
