"""Distributed workers agree on their settings or all stop; a stalled job stops; a busy port is named.

Issue 37's cases: workers launched with ``--batch-size 8`` and ``16`` waited
until ``--timeout``, whose default 0 meant forever; ``launch --port`` on a
busy port printed the scheduler's "bind failed" traceback. The job with
mismatched flags is real (scheduler, server, two trainers); the stall is
shown with workers that report progress once and then hang, without MXNet.
"""
import argparse
import dataclasses
import io
import os
import re
import socket
import sys
import time

from mxfp16.cli import main
from mxfp16.distributed import heartbeat, launch, local_plan
from mxfp16.distributed.agree import differences
from mxfp16.distributed.plan import LaunchPlanError, check_port_free

import pytest
from conftest import REPO
from train_support import tiny_dataset

pytestmark = pytest.mark.slow


def test_workers_with_different_batch_sizes_stop_within_seconds_naming_the_field(tmp_path):
    data = tiny_dataset(tmp_path)
    command = [sys.executable, "-m", "mxfp16.train", "--data-dir", str(data), "--out", str(tmp_path / "run"),
               "--model", "elementwise-mlp", "--image-size", "16", "--epochs", "1", "--max-batches", "2",
               "--precision", "float32", "--kvstore", "dist_sync", "--no-progress", "--batch-size"]
    slots = local_plan([*command, "8"], workers=2, servers=1)
    workers = [i for i, s in enumerate(slots) if s.role == "worker"]
    slots[workers[1]] = dataclasses.replace(slots[workers[1]], argv=(*command, "16"))
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    result = launch(slots, timeout=300, grace=3, stdout=out, stderr=err)
    elapsed = time.monotonic() - started
    assert result.reason == "failed" and result.returncode == 2, (result, err.getvalue()[-3000:])
    text = err.getvalue()
    assert re.search(r"batch_size: worker 0 (8|16), worker 1 (8|16)", text), text[-3000:]
    assert "run with different settings" in text and "Traceback" not in text
    assert elapsed < 240  # stopped by the check, not by the timeout
    assert not (tmp_path / "run" / "config.json").exists()  # refused before the run's files were written


def test_a_job_whose_workers_all_stop_making_progress_is_stopped_saying_what_it_waited_for(tmp_path):
    # Each worker reports one step, as mxfp16 train does, then hangs (as in a gradient exchange that never ends).
    code = ("import os, sys, time\nsys.path.insert(0, os.environ['MXFP16_REPO'])\n"
            "from mxfp16.distributed.heartbeat import beat\nbeat(sys.argv[1], 'epoch 1 step 7')\ntime.sleep(120)")
    slots = local_plan([sys.executable, "-c", code, "0"], workers=2, servers=1)
    workers = [i for i, s in enumerate(slots) if s.role == "worker"]
    slots[workers[1]] = dataclasses.replace(slots[workers[1]], argv=(sys.executable, "-c", code, "1"))
    # No scheduler or server: nothing here uses the kvstore, and a process that idles forever stands in for them.
    idle = (sys.executable, "-c", "import time; time.sleep(120)")
    slots = [dataclasses.replace(s, argv=idle) if s.role != "worker" else s for s in slots]
    err = io.StringIO()
    started = time.monotonic()
    result = launch(slots, timeout=100, grace=2, stdout=io.StringIO(), stderr=err, stall=3,
                    env=dict(os.environ, MXFP16_REPO=REPO))
    assert result.reason == "stalled" and result.returncode == 124, err.getvalue()
    assert time.monotonic() - started < 60
    assert "no worker made progress for 3 s (--stall-timeout)" in result.message
    assert "worker 0 at epoch 1 step 7" in result.message and "worker 1 at epoch 1 step 7" in result.message


def test_the_stall_clock_starts_only_when_every_worker_has_reported(tmp_path):
    watch = heartbeat.Watch(tmp_path, workers=2, stall=5)
    (tmp_path / "worker-0").write_text("epoch 1 step 1\n")
    assert watch.stalled(now=time.time() + 3600) is None  # worker 1 is still starting
    (tmp_path / "worker-1").write_text("epoch 1 step 1\n")
    assert watch.stalled() is None and "no worker made progress" in watch.stalled(now=time.time() + 6)
    assert heartbeat.Watch(tmp_path, 2, stall=0).stalled(now=time.time() + 3600) is None


def test_the_command_line_stops_a_stalled_job_by_default():
    from mxfp16.commands import launch as command

    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = parser.parse_args(["launch", "--workers", "1", "--servers", "1", "--", "true"])
    assert args.stall_timeout == heartbeat.DEFAULT_STALL == 600


def test_a_busy_port_is_named_before_anything_starts(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LaunchPlanError, match=f"--port {port} is taken"):
            check_port_free(port)
        code = main(["launch", "--workers", "1", "--servers", "1", "--port", str(port), "--", "true"])
    err = capsys.readouterr().err
    assert code == 2 and f"--port {port} is taken: another process listens on 127.0.0.1:{port}" in err
    assert "ss -ltnp" in err and "Traceback" not in err and "started" not in err


def test_differences_name_each_field_and_every_workers_value():
    assert differences([{"a": "1", "b": "2"}, {"a": "1", "b": "3"}, {"a": "1"}]) == {"b": ["2", "3", "(absent)"]}
    assert differences([{"a": "1"}, {"a": "1"}]) == {}
