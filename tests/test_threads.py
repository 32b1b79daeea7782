"""Threads: decided once, before MXNet loads, and read back from MXNet's OpenMP runtime.

Subprocess tests start from an environment without OMP_NUM_THREADS,
MXNET_OMP_MAX_THREADS or mxfp16's own marker (this test process has them,
since conftest imported mxfp16), and read the count back with
``mxfp16.machine.environment.mxnet_threads`` (libgomp's ``omp_get_max_threads``,
which MXNet sets when it loads).
"""
import json
import os
import platform
import subprocess
import sys

from mxfp16.machine import stack
from mxfp16.machine.environment import ThreadsError, available_cores, plan_threads

import pytest
from conftest import REPO, last_line_json
from train_support import QUICK, tiny_dataset

CORES = available_cores()


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MXNET_OMP_MAX_THREADS", "MXFP16_THREADS_SET")}
    env["PYTHONPATH"] = REPO
    env.update(extra)
    return env


def _python(code, **extra):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=_clean_env(**extra), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return proc


def _mxnet_threads_after(first_import, **extra):
    code = (f"import {first_import}\nimport mxnet\nimport mxfp16.machine.environment as e\n"
            "import json; print(json.dumps(e.check_threads(warn=False)))")
    return last_line_json(_python(code, **extra).stdout)


def test_plan_precedence_and_refusals():
    assert plan_threads(environ={}) == plan_threads(environ={"OMP_NUM_THREADS": " "})
    assert plan_threads(environ={}).threads == CORES and plan_threads(environ={}).source == "default"
    both = {"OMP_NUM_THREADS": "1", "MXNET_OMP_MAX_THREADS": "3"}
    assert (plan_threads(environ=both).threads, plan_threads(environ=both).source) == (1, "OMP_NUM_THREADS")
    assert plan_threads(environ={"MXNET_OMP_MAX_THREADS": "1"}).source == "MXNET_OMP_MAX_THREADS"
    assert plan_threads(1, environ=both).source == "--threads"  # the flag wins over the environment
    more = plan_threads(CORES + 3, environ={})
    assert more.threads == CORES and f"using {CORES}" in more.note
    for bad in (0, -2, "two", "1.5"):
        with pytest.raises(ThreadsError, match="whole number >= 1"):
            plan_threads(bad, environ={})
    with pytest.raises(ThreadsError, match="OMP_NUM_THREADS"):
        plan_threads(environ={"OMP_NUM_THREADS": "0"})


def test_import_mxfp16_first_gives_mxnet_every_core():
    report = _mxnet_threads_after("mxfp16")
    assert report["threads"] == report["planned"] == CORES and report["source"] == "default"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="MXNet halves the count on x86 only")
@pytest.mark.skipif(bool(stack.SUPPLIED), reason="on numpy 1.24+ MXNet 1.9.1 cannot load before mxfp16 at all")
def test_mxnet_alone_runs_half_the_cores_which_is_why_mxfp16_sets_them():
    report = _mxnet_threads_after("mxnet")  # MXNet loaded before mxfp16 could set anything
    assert report["threads"] == max(1, CORES // 2) and report["planned"] == CORES


def test_the_environment_wins_over_the_default():
    report = _mxnet_threads_after("mxfp16", OMP_NUM_THREADS="1")
    assert report["threads"] == 1 and report["source"] == "OMP_NUM_THREADS"


def test_threads_on_the_command_line_reach_mxnet_and_the_run_files(tmp_path):
    data = tiny_dataset(tmp_path)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "mxfp16.train", "--threads", "1", "--data-dir", str(data),
                           "--out", str(out), "--precision", "float32", "--epochs", "1", "--max-batches", "1", *QUICK],
                          capture_output=True, text=True, timeout=240, env=_clean_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["threads"] == 1
    assert config["resolved_threads"] == {"threads": 1, "planned": 1, "source": "--threads", "available_cores": CORES}
    assert json.loads((out / "summary.json").read_text())["threads"] == 1
    assert "MXNet runs 1 OpenMP thread(s)" in proc.stdout


def test_bad_threads_are_refused_before_anything_runs(tmp_path):
    for value in ("0", "-1", "many"):
        proc = subprocess.run([sys.executable, "-m", "mxfp16", "bench", "--threads", value, "--out", str(tmp_path)],
                              capture_output=True, text=True, timeout=120, env=_clean_env(), cwd=REPO)
        assert proc.returncode == 2 and "whole number >= 1" in proc.stderr and "Traceback" not in proc.stderr
    assert not os.listdir(tmp_path)
