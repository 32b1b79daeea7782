"""Smoke runs of ``python -m mxfp16.train`` in float32 and amp-bfloat16: every output file and field."""
import json

from mxfp16.devices import format_ctx, parse_ctx
from mxfp16.train import METRIC_FIELDS, SUMMARY_FIELDS, TrainConfig

import mxnet as mx
import numpy as np
import pytest
from conftest import BFLOAT16, requires_bfloat16
from train_support import QUICK, metrics, ok, position, run_train, summary, tiny_dataset

pytestmark = pytest.mark.slow

EPOCHS = 2
#: amp-bfloat16's run where this CPU runs bfloat16; float32's checks every file and field on every CPU.
PRECISIONS = ["float32", pytest.param("amp-bfloat16", marks=requires_bfloat16)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    data = tiny_dataset(root)
    outs = {}
    for precision in ("float32", "amp-bfloat16") if BFLOAT16.runs else ("float32",):
        out = root / precision
        proc = ok(run_train("--data-dir", data, "--precision", precision, "--out", out, "--epochs", EPOCHS,
                            "--max-batches", 3, *QUICK))
        outs[precision] = (out, proc)
    return outs


@pytest.mark.parametrize("precision", PRECISIONS)
def test_smoke_run_writes_every_file_and_field(runs, precision):
    out, proc = runs[precision]
    records = metrics(out)
    assert [r["epoch"] for r in records] == list(range(1, EPOCHS + 1))
    for record in records:
        assert set(METRIC_FIELDS) <= set(record)
        assert 0.0 <= record["val_top1"] <= record["val_top5"] <= 1.0
        assert np.isfinite(record["train_loss"]) and record["images_per_second"] > 0
    result = summary(out)
    assert set(SUMMARY_FIELDS) <= set(result)
    assert result["precision"] == precision
    assert result["epochs"] == EPOCHS
    assert result["final_val_top1"] == records[-1]["val_top1"]
    assert result["best_val_top1"] == max(r["val_top1"] for r in records)
    assert result["peak_memory_mb"] > 0
    config = json.loads((out / "config.json").read_text())
    assert config["resolved_precision"] == precision and config["epochs"] == EPOCHS
    assert config["resolved_amp_lists"] == config["amp_lists"] == "mxfp16"  # no auto route: the lists asked for
    assert config["ctx"] == "auto" and config["resolved_ctx"] == format_ctx(parse_ctx("auto"))
    # How to reproduce it: the command as typed, and the augmentation `auto` chose.
    assert config["command"].startswith("mxfp16 train ") and f"--precision {precision}" in config["command"]
    assert config["resolved_augment"] in ("imagenet", "light", "none")
    assert TrainConfig.from_dict({k: v for k, v in config.items() if k in TrainConfig().to_dict()}).epochs == EPOCHS
    # The per-epoch summary line and the environment float16 wants are in the log.
    assert "epoch 2/2: train_loss" in proc.stdout
    assert "MXNET_SAFE_ACCUMULATION=1" in proc.stdout


@pytest.mark.parametrize("precision", PRECISIONS)
def test_checkpoint_holds_the_final_parameters_and_the_digest_matches(runs, precision):
    out, _ = runs[precision]
    record = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert position(record) == {"epoch": EPOCHS, "batch": 0, "global_step": EPOCHS * 3}
    assert (out / "checkpoints" / f"{record['tag']}.optimizer").stat().st_size > 0
    assert sorted(record["files"]) == [f"{record['tag']}.optimizer", f"{record['tag']}.params"]
    # Independent digest: sha256 over the saved arrays in sorted-name order, float32 bytes.
    import hashlib

    arrays = mx.nd.load(str(out / "checkpoints" / f"{record['tag']}.params"))
    h = hashlib.sha256()
    for name in sorted(arrays):
        value = np.ascontiguousarray(arrays[name].asnumpy().astype(np.float32))
        h.update(name.encode())
        h.update(str(value.shape).encode())
        h.update(value.tobytes())
    assert summary(out)["params_digest"] == h.hexdigest()


@requires_bfloat16
def test_precisions_train_different_parameters(runs):
    assert summary(runs["float32"][0])["params_digest"] != summary(runs["amp-bfloat16"][0])["params_digest"]
