"""Optimizers: master weights, the live support table, the Trainer factory."""
from mxfp16 import make_loss_scaler, make_trainer, optimizer_support, resolve_precision
from mxfp16._internals import trainer_update_on_kvstore_setting
from mxfp16.models import elementwise_mlp
from mxfp16.optim import OptimizerError, format_support_table, registered_optimizers

import mxnet as mx
import numpy as np
import pytest


def _sgd_step(multi_precision):
    opt = mx.optimizer.SGD(learning_rate=1e-4, multi_precision=multi_precision)
    weight = mx.nd.ones((1,), dtype="float16")
    state = opt.create_state_multi_precision(0, weight)
    opt.update_multi_precision(0, weight, mx.nd.ones((1,), dtype="float16"), state)
    return weight, state


def test_small_update_swallowed_without_master_weights():
    weight, _ = _sgd_step(multi_precision=False)
    # float16 spacing just below 1.0 is 2**-11 ~ 4.9e-4: 1 - 1e-4 rounds back to 1.
    assert weight.asscalar() == 1.0
    assert np.float16(1.0 - 1e-4) == np.float16(1.0)


def test_small_update_kept_by_master_weights():
    weight, state = _sgd_step(multi_precision=True)
    master = [s for s in state if isinstance(s, mx.nd.NDArray) and s.dtype == np.float32][0]
    assert master.asscalar() == pytest.approx(1.0 - 1e-4, abs=1e-7)
    # Ten thousand such steps move the float16 weight too.
    opt = mx.optimizer.SGD(learning_rate=1e-4, multi_precision=True)
    w = mx.nd.ones((1,), dtype="float16")
    st = opt.create_state_multi_precision(0, w)
    for _ in range(1000):
        opt.update_multi_precision(0, w, mx.nd.ones((1,), dtype="float16"), st)
    assert w.asscalar() == pytest.approx(0.9, abs=1e-3)


def test_support_table_covers_registry_and_each_claim_runs():
    rows = optimizer_support()
    assert [r.name for r in rows] == registered_optimizers()
    assert len(rows) >= 15
    for row in rows:
        if not row.multi_precision:
            continue
        # Re-run the claimed mode independently: a float16 weight stays float16 and moves in float32.
        opt = mx.optimizer.create(row.name, learning_rate=0.01, multi_precision=True)
        w = mx.nd.ones((4, 4), dtype="float16")
        state = opt.create_state_multi_precision(0, w)
        opt.update_multi_precision(0, w, mx.nd.ones((4, 4), dtype="float16"), state)
        assert w.dtype == np.float16, row.name
        assert np.isfinite(w.asnumpy()).all(), row.name
    by_name = {r.name: r for r in rows}
    # Fused means a mixed-precision kernel was seen in the profiler, generic means a Cast.
    assert by_name["sgd"].kernel == "fused" and any("mp_" in op for op in by_name["sgd"].operators)
    assert by_name["adam"].kernel == "generic" and "Cast" in by_name["adam"].operators
    assert by_name["sgd"].master_keeps_small_update and by_name["sgd"].float16_alone_keeps_small_update is False
    assert "sgd" in format_support_table(rows)


def test_make_trainer_sets_master_weights_and_kvstore_mode():
    net = elementwise_mlp(2, [4], 2)
    net.initialize()
    fp16 = resolve_precision("float16", mx.cpu(), allow_cpu_float16=True)
    scaler = make_loss_scaler(fp16)
    trainer = make_trainer(net.collect_params(), "SGD", {"learning_rate": 0.1}, fp16, scaler)
    assert trainer.optimizer.multi_precision is True
    assert trainer_update_on_kvstore_setting(trainer) is False
    fp32 = resolve_precision("float32", mx.cpu())
    plain = make_trainer(net.collect_params(), "adam", {"learning_rate": 0.1}, fp32, make_loss_scaler(fp32))
    assert plain.optimizer.multi_precision is False
    with pytest.raises(ValueError, match="update_on_kvstore=False"):
        make_trainer(net.collect_params(), "sgd", {}, fp16, scaler, update_on_kvstore=True)


def test_unknown_optimizer_lists_registry():
    with pytest.raises(OptimizerError) as err:
        make_trainer([], "adamw", {})
    assert "sgd" in str(err.value) and "lamb" in str(err.value)


def _expected_lr(n, lr, warmup_iters, main_iters, kind="cosine", drops=()):
    """gluoncv's documented formulas, written out: linear warm-up from 0, then cosine to 0 or x0.1 steps."""
    import math

    n = min(n, warmup_iters + main_iters - 1)  # past the end the last rate holds
    if n < warmup_iters:
        return lr * n / (warmup_iters - 1)
    t = n - warmup_iters
    if kind == "step":
        return lr * 0.1 ** sum(1 for d in drops if d <= n)
    return lr * (1 + math.cos(math.pi * t / (main_iters - 1))) / 2


def test_lr_schedule_warms_up_then_decays_as_the_formulas_say():
    from mxfp16.optim import lr_schedule

    cosine = lr_schedule(0.1, epochs=6, warmup_epochs=2, steps_per_epoch=5, kind="cosine")
    for n in range(0, 40):
        assert cosine(n) == pytest.approx(_expected_lr(n, 0.1, 10, 20), abs=1e-12), n
    assert cosine(9) == pytest.approx(0.1) and cosine(29) == pytest.approx(0.0, abs=1e-12)
    # step: drops at the starts of epochs 3 and 5 (counted from the run's start), i.e. updates 10 and 20.
    step = lr_schedule(0.1, epochs=6, warmup_epochs=1, steps_per_epoch=5, kind="step", step_epochs=(3, 5))
    for n in range(0, 40):
        assert step(n) == pytest.approx(_expected_lr(n, 0.1, 5, 25, "step", drops=(15, 25)), abs=1e-12), n
    # Phases shorter than two updates are constant rather than a division by zero.
    assert lr_schedule(0.05, epochs=1, warmup_epochs=0, steps_per_epoch=1)(0) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="choose one of"):
        lr_schedule(0.1, 2, 0, 4, kind="linear")


def test_optimizer_params_give_momentum_only_where_it_is_taken():
    from mxfp16.optim import optimizer_params

    assert optimizer_params("sgd", 0.1, 1e-4, 0.9) == {"learning_rate": 0.1, "wd": 1e-4, "momentum": 0.9}
    assert "momentum" not in optimizer_params("adam", 0.1, 0.0, 0.9)
    with pytest.raises(OptimizerError, match="registers"):
        optimizer_params("adamw", 0.1)


def test_gradient_compression_rules():
    from mxfp16.optim import check_compression

    fp32 = resolve_precision("float32", mx.cpu())
    fp16 = resolve_precision("float16", mx.cpu(), allow_cpu_float16=True)
    assert check_compression(None, "local", fp16) is None
    assert check_compression("2bit", "device", fp32) == {"type": "2bit", "threshold": 0.5}
    for kvstore in ("local", "dist_sync", "nccl"):
        with pytest.raises(OptimizerError, match=f"--kvstore {kvstore} .*--kvstore device"):
            check_compression("2bit", kvstore, fp32)
    with pytest.raises(OptimizerError, match="float32 gradients only.*float16"):
        check_compression("2bit", "device", fp16)
    with pytest.raises(OptimizerError, match="only '2bit'"):
        check_compression("1bit", "device", fp32)
    net = elementwise_mlp(2, [4], 2)
    net.initialize()
    with pytest.raises(OptimizerError, match="float32 gradients only"):  # the trainer factory applies the rules too
        make_trainer(net.collect_params(), "sgd", {}, fp16, compression_params={"type": "2bit", "threshold": 0.5})
