"""Optimizers: master weights, the live support table, the Trainer factory."""
import mxnet as mx
import numpy as np
import pytest

from mxfp16 import make_loss_scaler, make_trainer, optimizer_support, resolve_precision
from mxfp16.models import elementwise_mlp
from mxfp16.optim import OptimizerError, format_support_table, registered_optimizers


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
    scaler = make_loss_scaler(None, fp16)
    trainer = make_trainer(net.collect_params(), "SGD", {"learning_rate": 0.1}, fp16, scaler)
    assert trainer._optimizer.multi_precision is True
    assert trainer._kvstore_params["update_on_kvstore"] is False
    fp32 = resolve_precision("float32", mx.cpu())
    plain = make_trainer(net.collect_params(), "adam", {"learning_rate": 0.1}, fp32, make_loss_scaler(None, fp32))
    assert plain._optimizer.multi_precision is False
    with pytest.raises(ValueError, match="update_on_kvstore=False"):
        make_trainer(net.collect_params(), "sgd", {}, fp16, scaler, update_on_kvstore=True)


def test_unknown_optimizer_lists_registry():
    with pytest.raises(OptimizerError) as err:
        make_trainer([], "adamw", {})
    assert "sgd" in str(err.value) and "lamb" in str(err.value)
