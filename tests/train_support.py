"""Helpers for the trainer's tests: a tiny data set and ``python -m mxfp16.train`` in a fresh process.

Every training run starts its own process: AMP (amp-bfloat16) patches MXNet
for the whole process, so a float32 run after it in the same process would
not be float32.
"""
import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO, child_env

#: Small enough for seconds per run, big enough to learn: 3 shape classes at 24 px.
TINY = dict(classes=3, per_class=24, test_per_class=8, size=32, seed=0)
#: Flags for quick runs on TINY: the CIFAR ResNet at 16 px, 8 images per step.
QUICK = ["--model", "cifar_resnet20_v1", "--image-size", "16", "--batch-size", "8", "--no-progress"]


def tiny_dataset(root):
    from mxfp16.data import synth_dataset

    return synth_dataset(Path(root) / "tiny", **TINY)


def run_train(*args, timeout=240, env=None):
    """Run ``python -m mxfp16.train ARGS`` and return the CompletedProcess (never raises on failure).

    ``env`` adds variables (:func:`conftest.child_env`).
    """
    return subprocess.run([sys.executable, "-m", "mxfp16.train", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=child_env(env), cwd=REPO)


def run_train_here(*args):
    """``mxfp16 train ARGS`` in this process (:func:`mxfp16.cli.main`); a CompletedProcess as :func:`run_train` gives.

    For the refusals that come before any training (or a float32 one): a fresh
    process would spend its couple of CPU-seconds importing MXNet to print
    one line. AMP must not come on here (it would stay on for the tests after
    this one): a call that switches it on fails the test, so a precision that
    uses AMP needs :func:`run_train`.
    """
    import contextlib
    import io

    from mxfp16.cli import main
    from mxfp16.precision import amp_target

    before = amp_target()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["train", *map(str, args)])
    assert amp_target() == before, f"mxfp16 train {args} switched AMP on in the test process: use run_train"
    return subprocess.CompletedProcess(["mxfp16", "train", *map(str, args)], status, out.getvalue(), err.getvalue())


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def refused(proc, *phrases):
    """A clean refusal: exit status 2, no traceback, and each phrase in the message; returns stderr."""
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    for phrase in phrases:
        assert phrase in proc.stderr, proc.stderr
    return proc.stderr


def metrics(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summary(out):
    return json.loads((Path(out) / "summary.json").read_text())


def position(record):
    """The epoch/batch/global-step position of a checkpoint record (``latest.json``)."""
    return {k: record["progress"][k] for k in ("epoch", "batch", "global_step")}
