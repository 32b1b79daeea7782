"""The one child-process protocol: ``call_in_child`` (a function in a fresh process) over ``run_json_child``."""
import sys

from mxfp16.plumbing.child import call_in_child, run_json_child

CHILD = """import json, os, sys
if sys.argv[1] == "fail":
    print("something broke", file=sys.stderr)
    sys.exit(3)
with open(sys.argv[-1], "w") as handle:  # the path after --result
    json.dump({"args": sys.argv[1:-2], "A": os.environ.get("A"), "B": os.environ.get("B")}, handle)
"""


def test_the_record_arrives_and_env_sets_or_removes_variables(tmp_path, monkeypatch):
    (tmp_path / "echo_child.py").write_text(CHILD)
    monkeypatch.setenv("B", "inherited")
    record, problem = run_json_child("echo_child", ["one", "two"],
                                     env={"PYTHONPATH": str(tmp_path), "A": "set", "B": None})
    assert problem is None and record == {"args": ["one", "two"], "A": "set", "B": None}


def test_a_failed_child_is_a_problem_not_an_exception(tmp_path):
    (tmp_path / "echo_child.py").write_text(CHILD)
    record, problem = run_json_child("echo_child", ["fail"], env={"PYTHONPATH": str(tmp_path)})
    assert record is None and problem.startswith("exit status 3") and "something broke" in problem


FUNCTIONS = """import os
from dataclasses import dataclass


@dataclass
class Spec:
    name: str
    count: int = 1


class Parsed(Spec):
    @classmethod
    def from_json(cls, text):
        import json
        return cls(**dict(json.loads(text), name="from_json"))


def describe(spec):
    return {"type": type(spec).__name__, "spec": vars(spec) if hasattr(spec, "name") else spec,
            "A": os.environ.get("A")}


def nothing():
    return 42


def broken(spec):
    raise ValueError(f"no good: {spec}")
"""


def test_call_in_child_returns_the_value_and_rebuilds_a_dataclass_spec(tmp_path):
    (tmp_path / "child_functions.py").write_text(FUNCTIONS)
    env = {"PYTHONPATH": str(tmp_path), "A": "set"}
    value, problem = call_in_child("child_functions:describe", [1, "two"], env=env)
    assert problem is None and value == {"type": "list", "spec": [1, "two"], "A": "set"}
    assert call_in_child("child_functions:nothing", env=env) == (42, None)
    sys.path.insert(0, str(tmp_path))
    try:
        import child_functions
    finally:
        sys.path.remove(str(tmp_path))
    value, problem = call_in_child(child_functions.describe, child_functions.Spec("x", 3), env=env)
    assert problem is None and value["type"] == "Spec" and value["spec"] == {"name": "x", "count": 3}
    value, _ = call_in_child(child_functions.describe, child_functions.Parsed("x"), env=env)
    assert value["type"] == "Parsed" and value["spec"]["name"] == "from_json"


def test_a_function_that_raises_gives_its_traceback_not_an_exception(tmp_path):
    (tmp_path / "child_functions.py").write_text(FUNCTIONS)
    value, problem = call_in_child("child_functions:broken", "spec", env={"PYTHONPATH": str(tmp_path)})
    assert value is None and problem.startswith("Traceback")
    assert problem.splitlines()[-1] == "ValueError: no good: spec"
    value, problem = call_in_child("child_functions:nothing", timeout=0.01, env={"PYTHONPATH": str(tmp_path)})
    assert value is None and problem == "timed out after 0.01 s"


ENDING = """import atexit, concurrent.futures, sys, threading, time
from mxfp16.plumbing.child import end_process


class Teardown:
    def __del__(self):  # module teardown, after the atexit handlers: what end_process leaves before
        print("teardown ran", flush=True)


kept = Teardown()
atexit.register(print, "atexit ran")
worker = threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished")))
worker.start()
pool = concurrent.futures.ThreadPoolExecutor(1)  # never shut down: its idle worker must not hold the exit
pool.submit(time.sleep, 0.1)
sys.stdout.write("unflushed")  # in the buffer when the process ends
end_process(int(sys.argv[1]))
"""


def test_end_process_runs_what_shutdown_runs_then_leaves_before_teardown(tmp_path):
    import subprocess

    from conftest import child_env

    (tmp_path / "ending.py").write_text(ENDING)
    for code in (0, 3):
        proc = subprocess.run([sys.executable, str(tmp_path / "ending.py"), str(code)], capture_output=True,
                              text=True, env=child_env(), timeout=120)
        assert proc.returncode == code, proc.stderr
        # The thread joined first (the executor's idle worker stopped, as Python's shutdown stops it), the atexit
        # handler after it, the buffered write flushed; the object that only module teardown would collect was
        # not (the process left before teardown and C++'s destructors).
        assert proc.stdout.splitlines() == ["unflushedthread finished", "atexit ran"], proc.stdout


ABORTS_ONCE = """import os, sys
marker = {marker!r}
print("done")
if {every_time} or not os.path.exists(marker):
    open(marker, "w").close()
    print({last_line!r}, file=sys.stderr, flush=True)
    os.abort()
"""


def test_the_suite_reruns_a_snippet_only_for_mxnets_abort_at_exit(tmp_path):
    import pytest
    from conftest import MXNET_EXIT_ABORT, MXNetExitAbort, run_python

    with pytest.warns(MXNetExitAbort):
        proc = run_python(ABORTS_ONCE.format(marker=str(tmp_path / "once"), every_time=False,
                                             last_line=MXNET_EXIT_ABORT))
    assert proc.returncode == 0 and proc.stdout == "done\n"
    with pytest.warns(MXNetExitAbort):  # every time: re-run once, then reported as it is
        proc = run_python(ABORTS_ONCE.format(marker=str(tmp_path / "always"), every_time=True,
                                             last_line=MXNET_EXIT_ABORT), check=False)
    assert proc.returncode < 0
    proc = run_python(ABORTS_ONCE.format(marker=str(tmp_path / "other"), every_time=False,
                                         last_line="some other abort"), check=False)
    assert proc.returncode < 0  # not re-run: a second run would have found the marker and ended well
