"""The shared training step: scaled float16 against a float32 control, clipping, learning."""
from mxfp16 import cast_batch, cast_net, make_loss_scaler, make_trainer, resolve_precision, train_step
from mxfp16.gradients import clip_global_norm_, grads_are_finite
from mxfp16.models import elementwise_mlp
from mxfp16.scaler import LossScaler

import mxnet as mx
import numpy as np
import pytest
from conftest import requires_bfloat16
from mxnet import gluon

CPU = [mx.cpu()]


def _xor_data(n, seed):
    rng = np.random.RandomState(seed)
    x = rng.uniform(-1, 1, (n, 2)).astype("float32")
    y = (x[:, 0] * x[:, 1] > 0).astype("float32")
    return x, y


def _net(seed, dtype):
    mx.random.seed(seed)
    net = elementwise_mlp(2, [16, 16], 2, batchnorm=False)
    net.initialize(ctx=CPU)
    return cast_net(net, dtype)


def _params(net):
    return [p.data().astype("float32").asnumpy() for p in net.collect_params().values()]


class _InjectInf:
    """A loss whose value is multiplied by inf on chosen calls, so every gradient overflows."""

    def __init__(self, steps):
        self.steps, self.calls, self.base = set(steps), 0, gluon.loss.SoftmaxCrossEntropyLoss()

    def __call__(self, out, y):
        loss = self.base(out, y)
        self.calls += 1
        return loss * float("inf") if self.calls in self.steps else loss


def test_overflow_step_skipped_and_params_track_float32_control():
    fp16 = resolve_precision("float16", CPU, allow_cpu_float16=True)
    fp32 = resolve_precision("float32", CPU)
    half, full = _net(1, "float16"), _net(1, "float32")
    for a, b in zip(half.collect_params().values(), full.collect_params().values()):
        b.set_data(a.data().astype("float32"))  # identical start
    scaler = LossScaler(init_scale=2.0 ** 10, growth_interval=1000)
    control_scaler = make_loss_scaler(fp32)
    opt = {"learning_rate": 0.05, "momentum": 0.9}
    t_half = make_trainer(half.collect_params(), "sgd", opt, fp16, scaler)
    t_full = make_trainer(full.collect_params(), "sgd", opt, fp32, control_scaler)
    inject_at = 7
    loss_half, loss_full = _InjectInf([inject_at]), gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = _xor_data(40 * 32, seed=0)
    before = None
    for step in range(1, 41):
        xb, yb = mx.nd.array(x[(step - 1) * 32:step * 32]), mx.nd.array(y[(step - 1) * 32:step * 32])
        if step == inject_at:
            before = _params(half)
        r = train_step(half, loss_half, t_half, *cast_batch(xb, yb, fp16.data_dtype, CPU), scaler)
        assert r.skipped == (step == inject_at)
        if step == inject_at:
            assert r.loss_scale == 2.0 ** 10
            # Skipped means untouched: no NaN reached the weights.
            for b, a in zip(before, _params(half)):
                np.testing.assert_array_equal(a, b)
            continue  # the control skips the same batch
        train_step(full, loss_full, t_full, *cast_batch(xb, yb, "float32", CPU), control_scaler)
    assert scaler.skipped_steps == 1
    assert scaler.scale == 2.0 ** 9           # backed off once, never grown (interval 1000)
    for a, b in zip(_params(half), _params(full)):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, atol=2e-2, rtol=2e-2)


def test_disabled_scaler_step_equals_plain_gluon_step():
    fp32 = resolve_precision("float32", CPU)
    a, b = _net(3, "float32"), _net(3, "float32")
    scaler = make_loss_scaler(fp32)
    ta = make_trainer(a.collect_params(), "sgd", {"learning_rate": 0.1}, fp32, scaler)
    tb = gluon.Trainer(b.collect_params(), "sgd", {"learning_rate": 0.1})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = _xor_data(64, seed=1)
    xb, yb = mx.nd.array(x), mx.nd.array(y)
    for _ in range(3):
        result = train_step(a, loss_fn, ta, [xb], [yb], scaler)
        with mx.autograd.record():
            loss = loss_fn(b(xb), yb)
        loss.backward()
        tb.step(64)
        assert result.loss.item() == pytest.approx(loss.mean().asscalar(), rel=1e-6)
    for pa, pb in zip(_params(a), _params(b)):
        np.testing.assert_allclose(pa, pb, rtol=1e-6, atol=1e-7)


def test_clip_global_norm_matches_numpy_float64():
    rng = np.random.RandomState(0)
    arrays = [rng.randn(5, 3) * 30, rng.randn(7) * 100, rng.randn(4, 4)]
    scale = 64.0
    grads = [mx.nd.array(a * scale, dtype="float16") for a in arrays[:2]] + [mx.nd.array(arrays[2] * scale)]
    stored = [g.asnumpy().astype(np.float64) / scale for g in grads]  # what float16 actually holds
    assert all(np.isfinite(s).all() for s in stored)
    # Squares of these overflow float16 (and sums of them float16 accumulation).
    assert max(np.abs(g.asnumpy()).max() for g in grads[:2]) ** 2 > 65504
    norm = np.sqrt(sum((s ** 2).sum() for s in stored))
    got = clip_global_norm_(grads, max_norm=10.0, scale=scale)
    assert got.asscalar() == pytest.approx(norm, rel=1e-5)
    assert norm > 10.0
    for g, s in zip(grads, stored):
        np.testing.assert_allclose(g.asnumpy().astype(np.float64) / scale, s * 10.0 / norm, rtol=2e-3, atol=1e-3,
                                   equal_nan=False)
    # Below the threshold nothing changes.
    small = [mx.nd.array([0.3, 0.4])]
    clip_global_norm_(small, max_norm=10.0)
    np.testing.assert_allclose(small[0].asnumpy(), [0.3, 0.4])


def test_finite_check_over_mixed_dtypes():
    ok = [mx.nd.ones((3,), dtype="float16"), mx.nd.ones((2, 2))]
    assert grads_are_finite(ok).asscalar() == 1.0
    for bad in (np.inf, np.nan):
        arrays = ok + [mx.nd.array([1.0, bad], dtype="float16")]
        assert grads_are_finite(arrays).asscalar() == 0.0
    many = [mx.nd.ones((2,)) for _ in range(300)] + [mx.nd.array([np.inf])]
    assert grads_are_finite(many).asscalar() == 0.0


def test_float16_network_learns_on_cpu():
    fp16 = resolve_precision("float16", CPU, allow_cpu_float16=True)
    net = _net(0, "float16")
    scaler = make_loss_scaler(fp16)
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9}, fp16, scaler)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = _xor_data(1000, seed=2)
    for _ in range(8):
        for i in range(0, 1000, 50):
            data, label = cast_batch(mx.nd.array(x[i:i + 50]), mx.nd.array(y[i:i + 50]), "float16", CPU)
            train_step(net, loss_fn, trainer, data, label, scaler, clip_grad_norm=5.0)
    assert all(np.dtype(p.dtype) == np.float16 for p in net.collect_params().values())
    xt, yt = _xor_data(500, seed=3)
    pred = net(mx.nd.array(xt, dtype="float16")).argmax(axis=1).asnumpy()
    assert (pred == yt).mean() > 0.9  # chance is 0.5


@requires_bfloat16
def test_small_cnn_learns_with_amp_bfloat16(python_child):
    proc = python_child("""
        import mxfp16
        import mxnet as mx, numpy as np
        from mxnet import gluon
        ctx = [mx.cpu()]
        p = mxfp16.resolve_precision("amp-bfloat16", ctx)
        mxfp16.activate(p)
        rng = np.random.RandomState(0)
        def stripes(n):
            # class 0: horizontal stripes, class 1: vertical, with noise and random phase
            y = rng.randint(0, 2, n)
            idx = np.arange(16)
            x = np.empty((n, 1, 16, 16), "float32")
            for i in range(n):
                wave = np.sin(idx * 1.2 + rng.uniform(0, 6))
                img = np.tile(wave[:, None], (1, 16)) if y[i] == 0 else np.tile(wave[None, :], (16, 1))
                x[i, 0] = img + rng.randn(16, 16) * 0.5
            return mx.nd.array(x), mx.nd.array(y.astype("float32"))
        mx.random.seed(0)
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
                gluon.nn.MaxPool2D(2), gluon.nn.Conv2D(16, 3, padding=1), gluon.nn.Activation("relu"),
                gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(2))
        net.initialize(mx.init.Xavier(), ctx=ctx)
        net.hybridize(static_alloc=True, static_shape=True)
        scaler = mxfp16.make_loss_scaler(p)
        trainer = mxfp16.make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9}, p, scaler)
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        for step in range(60):
            x, y = stripes(32)
            r = mxfp16.train_step(net, loss_fn, trainer, *mxfp16.cast_batch(x, y, p.data_dtype, ctx), scaler)
        x, y = stripes(400)
        acc = (net(x).astype("float32").argmax(axis=1) == y).mean().asscalar()
        print("params", sorted({np.dtype(q.dtype).name for q in net.collect_params().values()}))
        print("accuracy", acc)
    """, timeout=240)
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert lines["params"] == "['float32']"          # AMP keeps parameters float32
    assert float(lines["accuracy"]) > 0.9            # chance is 0.5
