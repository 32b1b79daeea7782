"""The reference trainer under ``mxfp16 launch``: two workers, one server, kvstore dist_sync.

Three jobs run at once on a tiny generated set, a few batches each:
float32 and float16 on ``elementwise-mlp`` (the same network, so their
gradient bytes compare), the float16 one with an overflow injected into
worker rank 1's loss at step 2; and amp-bfloat16 on ``cifar_resnet20_v1``.
"""
import json
import re
import sys
from pathlib import Path

from mxfp16 import cli

import numpy as np
import pytest
from conftest import BFLOAT16_RUNS, requires_bfloat16
from dist_support import launch_jobs
from fault_injection import command_prefix
from train_support import tiny_dataset

pytestmark = pytest.mark.slow

LAUNCH_TIMEOUT = 150
BATCHES, OVERFLOW_STEP, IMAGE_SIZE = 3, 2, 16
FLAGS = ["--image-size", IMAGE_SIZE, "--batch-size", 8, "--epochs", 1, "--max-batches", BATCHES,
         "--kvstore", "dist_sync", "--no-progress"]
JOBS = {
    "float32": ["--model", "elementwise-mlp", "--precision", "float32"],
    # A static scale the float16 gradients fit under, so only the injected step overflows.
    "float16": ["--model", "elementwise-mlp", "--precision", "float16", "--allow-cpu-float16", "--loss-scale", 64],
    "amp-bfloat16": ["--model", "cifar_resnet20_v1", "--precision", "amp-bfloat16"],
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("dist-train")
    # float16: the step OVERFLOW_STEP overflows on worker 1 only (tests/fault_injection.py)
    faults = {"float16": command_prefix(overflow_step=OVERFLOW_STEP, overflow_rank=1)}
    commands = {name: [*faults.get(name, []), sys.executable, "-m", "mxfp16.train", "--data-dir", data_dir,
                       "--out", root / name, *FLAGS, *flags] for name, flags in JOBS.items()
                if name != "amp-bfloat16" or BFLOAT16_RUNS}
    results = launch_jobs(commands, workers=2, servers=1, timeout=LAUNCH_TIMEOUT)
    for name, run in results.items():
        run["dir"] = root / name
    return results


def rank_summaries(run):
    assert run["code"] == 0, f"{run['out'][-3000:]}\n{run['err'][-3000:]}"
    found = sorted(p.name for p in run["dir"].glob("summary.rank*.json"))
    assert found == ["summary.rank0.json", "summary.rank1.json"]
    return [json.loads((run["dir"] / name).read_text()) for name in found]


#: amp-bfloat16's job runs where this CPU runs bfloat16; the other jobs check the same on every CPU.
NAMES = [pytest.param(name, marks=requires_bfloat16) if name == "amp-bfloat16" else name for name in JOBS]


@pytest.mark.parametrize("name", NAMES)
def test_every_worker_ends_with_the_same_parameters(runs, name):
    rank0, rank1 = rank_summaries(runs[name])
    assert (rank0["rank"], rank1["rank"], rank0["num_workers"]) == (0, 1, 2)
    assert rank0["precision"] == rank1["precision"] == name
    assert len(rank0["params_digest"]) == 64
    assert rank0["params_digest"] == rank1["params_digest"]


@pytest.mark.parametrize("name", NAMES)
def test_only_rank_0_writes_the_shared_outputs(runs, name):
    run = runs[name]
    rank_summaries(run)
    metrics = [json.loads(line) for line in (run["dir"] / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [m["epoch"] for m in metrics] == [1]  # one epoch, one record: nobody else appended
    summary = json.loads((run["dir"] / "summary.json").read_text())
    assert summary["params_digest"] == json.loads((run["dir"] / "summary.rank0.json").read_text())["params_digest"]
    assert list((run["dir"] / "checkpoints").glob("*.params"))
    # Rank 0 alone reports progress; the launcher prefixes every line with the process it came from.
    done = [line for line in run["out"].splitlines() if re.match(r"\[worker [01]\] +done:", line)]
    assert len(done) == 1


def test_float16_gradients_are_half_the_bytes_of_float32_for_the_same_network(runs, data_dir):
    from mxfp16.models import build_model

    import mxnet as mx

    bytes16 = {s["grad_bytes_pushed_per_step"] for s in rank_summaries(runs["float16"])}
    bytes32 = {s["grad_bytes_pushed_per_step"] for s in rank_summaries(runs["float32"])}
    assert len(bytes16) == len(bytes32) == 1
    # Independent count: BatchNorm's gamma and beta stay float32 when the rest goes float16.
    net = build_model("elementwise-mlp", 3, False, [mx.cpu()], in_shape=(3, IMAGE_SIZE, IMAGE_SIZE))
    trained = {name: p.shape for name, p in net.collect_params().items() if p.grad_req != "null"}
    size = {name: int(np.prod(shape)) for name, shape in trained.items()}
    in_batchnorm = sum(n for name, n in size.items() if "batchnorm" in name)
    total = sum(size.values())
    assert bytes32 == {4 * total}
    assert bytes16 == {2 * (total - in_batchnorm) + 4 * in_batchnorm}
    assert in_batchnorm < total / 50  # so float16 is within 2% of half


def test_an_overflow_on_one_worker_is_skipped_by_both(runs):
    for summary in rank_summaries(runs["float16"]):
        assert summary["skipped_step_numbers"] == [OVERFLOW_STEP]
        assert summary["steps"] == BATCHES


def test_two_bit_compression_is_refused_under_a_dist_kvstore(tmp_path, capsys, data_dir):
    # Gluon 1.9.1 exchanges gradients with pushpull, which dist kvstores cannot compress.
    code = cli.main(["train", "--data-dir", str(data_dir), "--out", str(tmp_path / "run"), "--model", "elementwise-mlp",
                     "--precision", "float16", "--allow-cpu-float16", "--gradient-compression", "2bit",
                     "--kvstore", "dist_sync", "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--gradient-compression 2bit" in err and "--kvstore dist_sync" in err and "PushPull" in err
    assert not (Path(tmp_path) / "run" / "summary.json").exists()


def test_sigterm_to_the_launcher_checkpoints_the_job(tmp_path, data_dir):
    """What a scheduler's kill does: the workers stop after a step, rank 0 writes a checkpoint, exit 143."""
    import os
    import signal
    import subprocess
    import time

    from dist_support import REPO

    out = tmp_path / "job"
    argv = [sys.executable, "-m", "mxfp16", "launch", "--workers", "2", "--servers", "1", "--grace", "20", "--",
            sys.executable, "-m", "mxfp16.train", "--data-dir", str(data_dir), "--out", str(out), "--epochs", "50",
            "--image-size", str(IMAGE_SIZE), "--batch-size", "8", "--kvstore", "dist_sync", "--no-progress",
            *JOBS["float32"]]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.time() + LAUNCH_TIMEOUT
    for line in proc.stdout:  # rank 0's first epoch line: every worker is inside the training loop
        if "epoch 1/50" in line or time.time() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=LAUNCH_TIMEOUT)
    assert proc.returncode == 143, stderr[-2000:]
    assert "SIGTERM: stopping after this step" in stdout
    record = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert record["progress"]["global_step"] >= 1 and (out / "checkpoints" / f"{record['tag']}.params").exists()
