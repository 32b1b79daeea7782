"""The environment MXNet reads is checked once, before MXNet loads; help and version never need MXNet.

Issue 37's cases: ``OMP_NUM_THREADS`` of 0, -1, ``abc`` or ``2,2`` and
``MXNET_OMP_MAX_THREADS=abc`` raised at ``import mxfp16`` (so ``--help``
failed too); ``MXNET_ENGINE_TYPE=Garbage`` failed even ``--help``;
``MXNET_CPU_WORKER_NTHREADS=abc`` aborted every command; ``OMP_NUM_THREADS=4096``
was obeyed; and every ``--help`` waited seconds for MXNet to load. That last one
is checked by what ``--help`` and ``--version`` import (no MXNet, no other heavy
package), not by timing them: a CPU-time budget fails on a slow or busy machine,
and speed goals live in the benchmarks.
"""
import os
import subprocess
import sys

from mxfp16.cli import main
from mxfp16.machine import environment
from mxfp16.machine.environment import available_cores, check_environment, plan_threads

import pytest
from conftest import REPO

CORES = available_cores()
#: Each value that once raised at import (or aborted a command), and a word of the one-line message for it.
BAD = {
    ("OMP_NUM_THREADS", "0"): "must be a whole number >= 1",
    ("OMP_NUM_THREADS", "-1"): "must be a whole number >= 1",
    ("OMP_NUM_THREADS", "abc"): "such as 2,2",
    ("MXNET_OMP_MAX_THREADS", "abc"): "is not a whole number",
    ("MXNET_ENGINE_TYPE", "Garbage"): "ThreadedEnginePerDevice",
    ("MXNET_CPU_WORKER_NTHREADS", "abc"): "it aborts otherwise",
    ("MXNET_CPU_WORKER_NTHREADS", "0"): "MXNet hangs with 0 threads",
    ("MXNET_MKLDNN_ENABLED", "yes"): "is not a boolean (true, false, 1 or 0)",
}


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MXNET_OMP_MAX_THREADS", "MXFP16_THREADS_SET")}
    env["PYTHONPATH"] = REPO
    env.update(extra)
    return env


def _child(args, **extra):
    """Run ``python ARGS`` with ``extra`` in the environment; the CompletedProcess."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, env=_env(**extra),
                          cwd=REPO)


#: Packages that take a second or more to import (MXNet most of all): ``mxfp16 --help`` and ``--version`` load none.
HEAVY = ("mxnet", "gluoncv", "cv2", "matplotlib", "onnx", "onnxruntime", "torch", "scipy", "sklearn", "pandas",
         "IPython")
#: ``python -m mxfp16 ARGS`` in the child, reporting at exit which of HEAVY it imported.
AS_MXFP16 = f"""
import atexit, runpy, sys
atexit.register(lambda: sys.__stderr__.write(
    "HEAVY MODULES LOADED: " + " ".join(m for m in {HEAVY!r} if m in sys.modules) + "\\n"))
sys.argv = ["mxfp16", *{{args!r}}]
runpy.run_module("mxfp16", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("name, value", sorted(BAD), ids=[f"{n}={v}" for n, v in sorted(BAD)])
def test_a_bad_value_is_one_line_with_the_fix_and_nothing_runs(monkeypatch, capsys, tmp_path, name, value):
    monkeypatch.setenv(name, value)
    assert main(["data", "synth", "--out", str(tmp_path / "set"), "--classes", "1", "--per-class", "1",
                 "--test-per-class", "0", "--size", "16"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("mxfp16: error:")]
    assert len(lines) == 1 and f"{name}={value!r}" in lines[0] and BAD[(name, value)] in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "set").exists()


def test_import_never_raises_and_help_and_version_answer_without_mxnet_whatever_the_environment_holds():
    # Every bad value of BAD at once (one per variable), in fresh processes.
    bad = {name: value for name, value in sorted(BAD)}
    code = "import mxfp16, sys; print('mxnet' in sys.modules)"
    proc = _child(["-c", code], **bad)
    assert proc.returncode == 0 and proc.stdout.split() == ["False"], proc.stderr
    for args, expected in ((["--help"], "usage: mxfp16"), (["--version"], "mxfp16 "),
                           (["train", "--help"], "--batch-size")):
        proc = _child(["-c", AS_MXFP16.format(args=args)], **bad)
        assert proc.returncode == 0 and expected in proc.stdout, proc.stderr
        loaded = proc.stderr.split("HEAVY MODULES LOADED:", 1)[1].split()
        assert loaded == [], f"mxfp16 {' '.join(args)} imported {loaded}: it should answer without them"
    proc = _child(["-m", "mxfp16", "no-such-command"], **bad)
    assert proc.returncode == 2 and "invalid choice: 'no-such-command'" in proc.stderr


def test_a_nested_openmp_count_is_understood_by_import_help_and_mxnet():
    # OMP_NUM_THREADS=2,2 is valid OpenMP (threads per nesting level): imported, answered and run, not refused.
    code = ("import mxfp16, mxnet as mx, os\n"
            "print(os.environ['OMP_NUM_THREADS'], mx.nd.ones((2, 3)).sum().asscalar())")
    proc = _child(["-c", code], OMP_NUM_THREADS="2,2")
    assert proc.returncode == 0, proc.stderr
    count, total = proc.stdout.split()[-2:]
    # Read as the outer level's count (mxfp16 hands MXNet that many threads), never refused.
    assert 1 <= int(count.split(",")[0]) <= max(2, os.cpu_count() or 1) and float(total) == 6.0
    proc = _child(["-m", "mxfp16", "--help"], OMP_NUM_THREADS="2,2")
    assert proc.returncode == 0 and "usage: mxfp16" in proc.stdout, proc.stderr


def test_parsers_are_built_without_mxnet():
    proc = _child(["-c", "import sys, mxfp16.cli as c; c.build_parser(); print(sorted(m for m in "
                            "('mxnet', 'cv2', 'gluoncv') if m in sys.modules))"])
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


def test_loading_mxnet_through_mxfp16_refuses_a_value_that_would_abort_it():
    code = ("import mxfp16\nfrom mxfp16.machine.stack import import_mxnet\ntry:\n    import_mxnet()\n"
            "except ImportError as err:\n    print('refused:', err)\nimport sys; print('mxnet' in sys.modules)")
    proc = _child(["-c", code], MXNET_CPU_WORKER_NTHREADS="abc")
    assert proc.returncode == 0, proc.stderr  # not -6 (SIGABRT)
    assert "refused: MXNET_CPU_WORKER_NTHREADS='abc' is not a whole number" in proc.stdout
    assert proc.stdout.split()[-1] == "False"


def test_thread_counts_above_the_cores_are_lowered_like_threads_is():
    check = check_environment({"OMP_NUM_THREADS": "4096", "MXNET_CPU_WORKER_NTHREADS": "4096"}, cores=2)
    assert not check.errors
    assert check.settings == {"OMP_NUM_THREADS": "2", "MXNET_CPU_WORKER_NTHREADS": "2"}
    assert all("may run on 2 core(s)" in note for note in check.notes) and len(check.notes) == 2
    nested = check_environment({"OMP_NUM_THREADS": "8,3"}, cores=2)
    assert nested.settings == {"OMP_NUM_THREADS": "2,2"} and not nested.errors
    assert plan_threads(environ={"OMP_NUM_THREADS": "2,2"}).threads == min(2, CORES)  # understood, not refused
    assert check_environment({"OMP_NUM_THREADS": "1", "MXNET_SAFE_ACCUMULATION": "1",
                              "MXNET_ENGINE_TYPE": "NaiveEngine", "MXNET_NOT_READ_BY_MXNET": "x"}, cores=2) \
        == environment.EnvironmentCheck()


def test_omp_num_threads_4096_reaches_mxnet_as_the_cores():
    code = ("import mxfp16, mxnet\nfrom mxfp16.machine import environment as e\n"
            "print(e.mxnet_threads(), '|'.join(e.PREPARED['check'].notes))")
    proc = _child(["-c", code], OMP_NUM_THREADS="4096")
    assert proc.returncode == 0, proc.stderr
    threads, notes = proc.stdout.strip().split(" ", 1)
    assert int(threads) == CORES and f"OMP_NUM_THREADS=4096: this process may run on {CORES} core(s)" in notes


def test_the_command_line_warns_about_a_lowered_count(monkeypatch, capsys):
    monkeypatch.setitem(environment.PREPARED, "check", check_environment({"OMP_NUM_THREADS": "4096"}, cores=2))
    assert main(["info", "--json"]) == 0
    assert "mxfp16: warning: OMP_NUM_THREADS=4096: this process may run on 2 core(s); using 2" in \
        capsys.readouterr().err


def test_the_table_generator_reads_each_default_as_dmlc_parses_it(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "tools"))
    try:
        import mxnet_variables
    finally:
        sys.path.pop(0)
    (tmp_path / "src" / "engine").mkdir(parents=True)
    (tmp_path / "include").mkdir()
    (tmp_path / "src" / "engine" / "a.cc").write_text(
        'int n = dmlc::GetEnv("MXNET_A_NTHREADS", 1);\n'
        'if (dmlc::GetEnv("MXNET_B_FLAG", true) && GetGPUCount() > 0) {}\n'
        'size_t b = dmlc::GetEnv("MXNET_C_BOUND", 1000 * 1000);\n'
        'double p = dmlc::GetEnv("MXNET_D_PENALTY", 0.7);\n'
        'auto s = dmlc::GetEnv("MXNET_E_BACKEND", std::string());\n'
        'bool t = dmlc::GetEnv("MXNET_F_TC",\n        dmlc::optional<bool>(default_value)).value();\n'
        'int f = dmlc::GetEnv("MXNET_G_FWD", dmlc::GetEnv("MXNET_H_ALL", 15));\n')
    assert mxnet_variables.scan(tmp_path) == {
        "MXNET_A_NTHREADS": "int", "MXNET_B_FLAG": "bool", "MXNET_C_BOUND": "int", "MXNET_D_PENALTY": "float",
        "MXNET_E_BACKEND": "string", "MXNET_F_TC": "bool", "MXNET_G_FWD": "int", "MXNET_H_ALL": "int"}
    # The checked-in table, generated from MXNet 1.9.1's sources, on two variables the issue named.
    VARIABLES = environment.MXNET_VARIABLES  # the generated table, read from mxfp16/machine/mxnet_variables.json
    assert VARIABLES["MXNET_CPU_WORKER_NTHREADS"] == "int" and VARIABLES["MXNET_MKLDNN_ENABLED"] == "bool"
    assert len(VARIABLES) > 80
    with open(os.path.join(REPO, "mxfp16", "machine", "mxnet_variables.json"), encoding="utf-8") as handle:
        assert mxnet_variables.render(VARIABLES, "1.9.1") == handle.read()  # the tool writes exactly what ships
