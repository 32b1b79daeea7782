"""The float16 paths that need a GPU: a ResNet step against float32, the trainer, several devices.

Skipped where MXNet sees no GPU (the CPU wheel, or no CUDA device); run with
``pytest -m gpu`` on a GPU machine with ``mxfp16[gpu]``. The CPU paths
differ from these only in device and dtype, and are tested everywhere else.
"""
import json

from mxfp16 import MixedPrecision, cast_batch, train_step
from mxfp16.devices import resolve_devices
from mxfp16.machine.hardware import gpu_count
from mxfp16.precision import Precision, resolve_precision
from mxfp16.train.outputs import structural_names
from mxfp16.train.parts import PartsSpec, build_parts

import mxnet as mx
import numpy as np
import pytest
from conftest import requires_gpu
from train_support import QUICK, ok, run_train, summary, tiny_dataset

pytestmark = [pytest.mark.gpu, requires_gpu]

CLASSES, SIZE, BATCH = 10, 32, 32


def _batch(seed=0):
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, CLASSES, BATCH)
    # Class-dependent means make the batch learnable, so the loss must fall.
    images = rng.normal(0, 1, (BATCH, 3, SIZE, SIZE)) + labels[:, None, None, None] * 0.3
    return mx.nd.array(images.astype(np.float32)), mx.nd.array(labels.astype(np.float32))


def _parts(precision, ctx="gpu:0"):
    ctx = resolve_devices(ctx)
    precision = precision if isinstance(precision, Precision) else resolve_precision(precision, ctx)
    return build_parts(PartsSpec(model="cifar_resnet20_v1", classes=CLASSES, image_size=SIZE, batch_size=BATCH,
                                 optimizer="sgd", lr=0.05, momentum=0.9, wd=0.0, seed=0),
                       MixedPrecision(precision, ctx))


def _same_start(source, target, tmp_path):
    path = str(tmp_path / "start.params")
    source.net.save_parameters(path)
    target.net.load_parameters(path, ctx=target.ctx, cast_dtype=True, dtype_source="current")


def test_float16_resnet_steps_track_a_float32_control(tmp_path):
    f32, f16 = _parts("float32"), _parts("float16")
    _same_start(f32, f16, tmp_path)
    assert {p.dtype for name, p in f16.net.collect_params().items() if "batchnorm" not in name} == {np.float16}
    x, y = _batch()
    losses = {"float32": [], "float16": []}
    for _ in range(20):
        for name, parts in (("float32", f32), ("float16", f16)):
            data, label = cast_batch(x, y, parts.precision.data_dtype, parts.ctx)
            result = train_step(parts.net, parts.loss, parts.trainer, data, label, parts.scaler)
            losses[name].append(result.loss.item())
    assert all(np.isfinite(losses["float16"]))
    assert f16.scaler.skipped_steps <= 2  # the dynamic scale may back off once or twice at the start
    for name, trace in losses.items():
        assert trace[-1] < 0.7 * trace[0], (name, trace)
    assert losses["float16"][-1] == pytest.approx(losses["float32"][-1], rel=0.15, abs=0.05)


def test_float16_trainer_smoke_run(tmp_path):
    data = tiny_dataset(tmp_path)
    out = tmp_path / "f16"
    ok(run_train("--data-dir", data, "--precision", "float16", "--ctx", "gpu:0", "--out", out, "--epochs", 2,
                 "--max-batches", 3, *QUICK))
    result = summary(out)
    assert result["precision"] == "float16" and result["final_loss_scale"] >= 1
    config = json.loads((out / "config.json").read_text())
    assert config["resolved_ctx"] == "gpu:0" and config["resolved_precision"] == "float16"


def test_ctx_auto_takes_every_visible_gpu(tmp_path):
    data = tiny_dataset(tmp_path)
    out = tmp_path / "auto"
    ok(run_train("--data-dir", data, "--precision", "auto", "--out", out, "--epochs", 1, "--max-batches", 2, *QUICK))
    config = json.loads((out / "config.json").read_text())
    assert config["resolved_ctx"] == "gpu:" + ",".join(str(i) for i in range(gpu_count()))
    assert config["resolved_precision"] == "float16"


@pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs")
def test_a_batch_split_over_two_gpus_updates_like_one_gpu(tmp_path):
    one, two = _parts("float32", "gpu:0"), _parts("float32", "gpu:0,1")
    _same_start(one, two, tmp_path)
    x, y = _batch()
    halves, _ = cast_batch(x, y, "float32", two.ctx)
    assert [h.shape[0] for h in halves] == [BATCH // 2, BATCH // 2] and halves[1].context == mx.gpu(1)
    for parts in (one, two):
        data, label = cast_batch(x, y, "float32", parts.ctx)
        train_step(parts.net, parts.loss, parts.trainer, data, label, parts.scaler)
    # BatchNorm sees half batches on two devices, so the updates agree closely, not bit for bit.
    a, b = structural_names(one.net), structural_names(two.net)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_allclose(b[name].data(mx.gpu(0)).asnumpy(), a[name].data(mx.gpu(0)).asnumpy(),
                                   rtol=5e-2, atol=5e-3, err_msg=name)
        if b[name].grad_req != "null":  # one reduced gradient, one update: the two copies are identical
            np.testing.assert_array_equal(b[name].data(mx.gpu(0)).asnumpy(), b[name].data(mx.gpu(1)).asnumpy())
