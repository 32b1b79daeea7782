"""The one child-process protocol: ``python -m MODULE ARGS --result FILE``, read by ``run_json_child``."""
from mxfp16.plumbing.child import run_json_child

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
