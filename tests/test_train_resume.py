"""An interrupted run, resumed, reproduces the uninterrupted run (metrics, parameters, loss scale, LR).

Float32 with a dynamic loss scale and one injected overflow, so the loss
scale (halved at step 2) and the skipped-step count must survive the
checkpoint too. workers=0 and a fixed seed make the batches identical.
"""
import json

import mxnet as mx
import numpy as np
import pytest
from fault_injection import environment
from train_support import QUICK, metrics, ok, position, run_train, summary, tiny_dataset

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH = 4
COMMON = ["--precision", "float32", "--loss-scale", "dynamic", "--epochs", 3,
          "--max-batches", STEPS_PER_EPOCH, "--warmup-epochs", 1, "--log-every", 3, *QUICK]
INTERRUPT_STEP = 6  # epoch 2, after its second batch


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    data = tiny_dataset(root)
    whole = root / "whole"
    ok(run_train("--data-dir", data, "--out", whole, *COMMON, env=environment(overflow_step=2)))
    parts = root / "parts"
    first = run_train("--data-dir", data, "--out", parts, *COMMON,
                      env=environment(overflow_step=2, interrupt_step=INTERRUPT_STEP))
    interrupted_record = json.loads((parts / "checkpoints" / "latest.json").read_text())
    interrupted_metrics = metrics(parts)
    second = ok(run_train("--data-dir", data, "--out", parts, "--resume", *COMMON, env=environment(overflow_step=2)))
    return {"whole": whole, "parts": parts, "first": first, "second": second,
            "record": interrupted_record, "interrupted_metrics": interrupted_metrics}


def test_interruption_writes_a_mid_epoch_checkpoint(runs):
    assert runs["first"].returncode == 130, runs["first"].stderr
    assert "--resume" in runs["first"].stderr
    record = runs["record"]
    assert position(record) == {"epoch": 1, "batch": INTERRUPT_STEP - STEPS_PER_EPOCH, "global_step": INTERRUPT_STEP}
    scaler = record["mixed_precision"]["scaler"]
    assert scaler["scale"] == 2.0 ** 15 and scaler["skipped_steps"] == 1
    assert [r["epoch"] for r in runs["interrupted_metrics"]] == [1]


def test_resumed_metrics_continue_and_match(runs):
    whole, parts = metrics(runs["whole"]), metrics(runs["parts"])
    assert [r["epoch"] for r in parts] == [1, 2, 3]
    for a, b in zip(whole, parts):
        for key in ("train_loss", "train_top1", "val_top1", "val_top5", "lr", "loss_scale"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (a["epoch"], key)
        assert a["skipped_steps"] == b["skipped_steps"]
    assert [r["skipped_steps"] for r in whole] == [1, 0, 0]
    assert "resuming" in runs["second"].stdout


def _final_arrays(out):
    record = json.loads((out / "checkpoints" / "latest.json").read_text())
    return mx.nd.load(str(out / "checkpoints" / f"{record['tag']}.params"))


def test_resumed_parameters_and_scaler_match(runs):
    whole, parts = _final_arrays(runs["whole"]), _final_arrays(runs["parts"])
    assert sorted(whole) == sorted(parts)
    for name in whole:
        np.testing.assert_allclose(parts[name].asnumpy(), whole[name].asnumpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    a, b = summary(runs["whole"]), summary(runs["parts"])
    assert (a["final_loss_scale"], a["skipped_steps"]) == (b["final_loss_scale"], b["skipped_steps"]) == (2.0 ** 15, 1)


def test_the_resumed_run_continues_its_tensorboard_events(runs):
    """One series per tag over the interruption: the epochs' numbers at their steps, as the whole run logged them."""
    pytest.importorskip("tensorboardX")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series = {}
    for name in ("whole", "parts"):
        events = EventAccumulator(str(runs[name] / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
        events.Reload()
        series[name] = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
        series[name]["config"] = [e.step for e in events.Tensors("config/text_summary")]
    whole, parts = series["whole"], series["parts"]
    epoch_ends = [STEPS_PER_EPOCH * e for e in (1, 2, 3)]
    for tag in ("epoch/val_top1", "epoch/train_loss", "epoch/loss_scale", "epoch/skipped_steps"):
        assert [s for s, _ in parts[tag]] == epoch_ends
        assert [v for _, v in parts[tag]] == pytest.approx([v for _, v in whole[tag]], rel=1e-4, abs=1e-5)
    steps = [s for s, _ in parts["precision/loss_scale"]]
    assert steps == sorted(set(steps)) and steps[-1] == 3 * STEPS_PER_EPOCH  # each step once, in order
    assert parts["config"] == [0, INTERRUPT_STEP] and whole["config"] == [0]  # the resumption says its settings
