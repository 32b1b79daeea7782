"""A step of one's own from the loss scaler's seams: accumulation, two losses, clipping, and the order they keep.

Each user step is checked against an independent computation: the same
update taken as one large batch (float32, to 1e-6), or the gradient worked
out in numpy float64. amp-bfloat16 runs in a child process (AMP is
process-global) against the float32 step taken here.
"""

import mxfp16
from mxfp16 import LossScaler, StepOrderError, make_trainer, resolve_precision

import mxnet as mx
import numpy as np
import pytest
from conftest import last_line_json, requires_bfloat16, run_python
from mxnet import autograd, gluon

CPU = [mx.cpu()]
FP32 = resolve_precision("float32", CPU)


def _mlp(seed):
    """Dense-ReLU-Dense with weights drawn by numpy, so any process builds the same network."""
    rng = np.random.RandomState(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu", in_units=6), gluon.nn.Dense(4, in_units=16))
    net.initialize(ctx=CPU)
    for param in net.collect_params().values():
        param.set_data(mx.nd.array(rng.normal(0, 0.5, param.shape)))
    return net


def _batch(n, seed):
    rng = np.random.RandomState(seed)
    return rng.normal(0, 1, (n, 6)).astype("float32"), rng.randint(0, 4, n).astype("float32")


def _params(net):
    return [p.data().asnumpy().astype(np.float64) for p in net.collect_params().values()]


def _accumulated_step(net, trainer, scaler, x, y, micro):
    """The docs' gradient accumulation: k micro-batches, one update over all their samples."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for i in range(0, len(x), micro):
        with autograd.record():
            loss = loss_fn(mxfp16.to_float32(net(mx.nd.array(x[i:i + micro]))), mx.nd.array(y[i:i + micro]))
        scaler.scale_loss(loss).backward()
        scaler.accumulate(trainer)
    skipped = scaler.step(trainer, batch_size=len(x))
    scaler.update()
    return skipped


def test_accumulated_micro_batches_equal_the_large_batch_step_in_float32():
    small, large = _mlp(0), _mlp(0)
    opt = {"learning_rate": 0.5, "momentum": 0.9}
    scaler = LossScaler(init_scale=2.0 ** 10, growth_interval=1000)  # enabled: the scale is divided back out
    t_small = make_trainer(small.collect_params(), "sgd", opt, FP32, scaler)
    t_large = make_trainer(large.collect_params(), "sgd", opt, FP32)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(3):
        x, y = _batch(32, seed=step)
        assert _accumulated_step(small, t_small, scaler, x, y, micro=8) is False
        mxfp16.train_step(large, loss_fn, t_large, [mx.nd.array(x)], [mx.nd.array(y)])
    for a, b in zip(_params(small), _params(large)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert scaler.steps == 3 and scaler.skipped_steps == 0


def _linear(seed):
    rng = np.random.RandomState(seed)
    net = gluon.nn.Dense(3, in_units=5)
    net.initialize(ctx=CPU)
    w, b = rng.normal(0, 0.5, (3, 5)), rng.normal(0, 0.5, 3)
    net.weight.set_data(mx.nd.array(w))
    net.bias.set_data(mx.nd.array(b))
    return net, w, b


def _two_loss_update_float64(w, b, x, t, weights, lr, max_norm=None):
    """SGD on w_a * L2 + w_b * L1 of a linear layer, averaged over the batch, in float64; and the gradient norm."""
    x, t = x.astype(np.float64), t.astype(np.float64)
    pred = x @ w.T + b
    n, j = pred.shape
    # gluon's L2Loss is 0.5 * mean_j (p - t)^2 per sample, L1Loss mean_j |p - t|.
    g = (weights[0] * (pred - t) / j + weights[1] * np.sign(pred - t) / j) / n
    dw, db = g.T @ x, g.sum(axis=0)
    norm = np.sqrt((dw ** 2).sum() + (db ** 2).sum())
    factor = min(1.0, max_norm / (norm + 1e-6)) if max_norm is not None else 1.0
    return w - lr * factor * dw, b - lr * factor * db, norm


def test_two_losses_and_clipping_in_an_own_step_match_numpy_float64():
    net, w, b = _linear(1)
    rng = np.random.RandomState(2)
    x, t = rng.normal(0, 1, (10, 5)).astype("float32"), rng.normal(0, 3, (10, 3)).astype("float32")
    weights, lr, max_norm = (1.0, 0.5), 0.1, 0.05
    scaler = LossScaler(init_scale=2.0 ** 12)
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": lr}, FP32, scaler)
    with autograd.record():
        pred = net(mx.nd.array(x))
        l2, l1 = gluon.loss.L2Loss()(pred, mx.nd.array(t)), gluon.loss.L1Loss()(pred, mx.nd.array(t))
        loss = weights[0] * l2 + weights[1] * l1
    scaler.scale_loss(loss).backward()
    grads = scaler.unscale(trainer, batch_size=10)
    norm = grads.clip_(max_norm)
    assert scaler.step(trainer) is False
    scaler.update()
    w_new, b_new, norm_64 = _two_loss_update_float64(w, b, x, t, weights, lr, max_norm)
    assert norm_64 > max_norm  # the clipping did something
    assert norm.item() == pytest.approx(norm_64, rel=1e-5)
    np.testing.assert_allclose(net.weight.data().asnumpy(), w_new, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.bias.data().asnumpy(), b_new, rtol=1e-5, atol=1e-6)


def test_unscaled_gradients_read_as_the_optimizer_applies_them():
    net, w, b = _linear(3)
    x, t = np.ones((4, 5), "float32"), np.zeros((4, 3), "float32")
    scaler = LossScaler(init_scale=2.0 ** 8)
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, FP32, scaler)
    with autograd.record():
        loss = gluon.loss.L2Loss()(net(mx.nd.array(x)), mx.nd.array(t))
    scaler.scale_loss(loss).backward()
    grads = scaler.unscale(trainer, batch_size=4)
    assert grads.divisor == 4 * 2.0 ** 8 and sorted(grads.names) == sorted([net.weight.name, net.bias.name])
    _, _, norm_64 = _two_loss_update_float64(w, b, x, t, (1.0, 0.0), 0.1)
    dw = grads.unscaled()[grads.names.index(net.weight.name)].asnumpy()
    expected = ((x @ w.T + b) / 3 / 4).T @ x
    np.testing.assert_allclose(dw, expected, rtol=1e-5)
    assert grads.norm().item() == pytest.approx(norm_64, rel=1e-5)
    scaler.step(trainer)
    scaler.update()


class _InfAt:
    """Softmax cross-entropy, times inf on the chosen calls: every gradient of that step overflows."""

    def __init__(self, calls):
        self.calls, self.count, self.base = set(calls), 0, gluon.loss.SoftmaxCrossEntropyLoss()

    def __call__(self, out, y):
        self.count += 1
        loss = self.base(out, y)
        return loss * float("inf") if self.count in self.calls else loss


def test_injected_overflows_are_skipped_and_the_scale_follows_growth_and_backoff():
    """PyTorch's GradScaler test: final scale = init * growth**g * backoff**s, parameters equal a control."""
    net, control = _mlp(4), _mlp(4)
    scaler = LossScaler(init_scale=2.0 ** 10, growth_interval=3)
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.2}, FP32, scaler)
    t_control = make_trainer(control.collect_params(), "sgd", {"learning_rate": 0.2}, FP32)
    inject, loss_fn, plain = {4, 9}, _InfAt({4, 9}), gluon.loss.SoftmaxCrossEntropyLoss()
    scales = []
    for step in range(1, 13):
        x, y = (mx.nd.array(a) for a in _batch(8, seed=10 + step))
        with autograd.record():
            loss = loss_fn(net(x), y)
        scaler.scale_loss(loss).backward()
        scaler.unscale(trainer, 8)
        assert scaler.step(trainer) == (step in inject)
        scales.append(scaler.scale)
        scaler.update()
        if step not in inject:
            mxfp16.train_step(control, plain, t_control, [x], [y])
    # clean runs: steps 1-3 grow, 4 backs off, 5-7 grow, 8 clean, 9 backs off, 10-12 grow
    assert scaler.scale == 2.0 ** 10 * 2.0 ** 3 * 0.5 ** 2 == 2.0 ** 11
    assert scaler.skipped_at == [4, 9] and scales[3] == 2.0 ** 11
    for a, b in zip(_params(net), _params(control)):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


# -- the order of the seams --------------------------------------------------------------------------------

@pytest.fixture
def one_step():
    """A network, its trainer and an enabled scaler, with one backward pass done."""
    net = _mlp(5)
    scaler = LossScaler(init_scale=2.0 ** 4)
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, FP32, scaler)

    def backward():
        x, y = (mx.nd.array(a) for a in _batch(4, seed=0))
        with autograd.record():
            loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
        scaler.scale_loss(loss).backward()

    backward()
    return net, trainer, scaler, backward


def test_unscale_twice_is_refused(one_step):
    _, trainer, scaler, _ = one_step
    scaler.unscale(trainer, 4)
    with pytest.raises(StepOrderError, match="unscale\\(\\) was already called"):
        scaler.unscale(trainer, 4)


def test_step_before_backward_is_refused():
    net = _mlp(6)
    scaler = LossScaler()
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, FP32, scaler)
    with pytest.raises(StepOrderError, match="call backward first"):
        scaler.step(trainer, 4)


def test_step_twice_and_unscale_after_step_are_refused(one_step):
    _, trainer, scaler, backward = one_step
    scaler.step(trainer, 4)
    with pytest.raises(StepOrderError, match="step\\(\\) was already called"):
        scaler.step(trainer, 4)
    with pytest.raises(StepOrderError, match="unscale\\(\\) after step\\(\\)"):
        scaler.unscale(trainer, 4)
    backward()  # the next iteration's loss, with update() forgotten: scaling it is allowed (another trainer's?) ...
    with pytest.raises(StepOrderError, match="once between two update\\(\\)s. Call scaler.update\\(\\)"):
        scaler.step(trainer, 4)  # ... stepping the same trainer again is not


def test_a_second_scale_update_in_one_step_is_refused(one_step):
    _, trainer, scaler, backward = one_step
    scaler.step(trainer, 4)
    scaler.update()
    with pytest.raises(StepOrderError, match="update\\(\\) was called twice in one iteration"):
        scaler.update()
    assert scaler.steps == 1
    backward()  # the next step works as usual
    scaler.step(trainer, 4)
    scaler.update()
    assert scaler.steps == 2


def test_accumulate_keeps_its_order(one_step):
    _, trainer, scaler, backward = one_step
    assert scaler.accumulate(trainer) == 4
    with pytest.raises(StepOrderError, match="accumulate\\(\\) before backward"):
        scaler.accumulate(trainer)
    scaler.unscale(trainer, 4)
    with pytest.raises(StepOrderError, match="accumulate\\(\\) after unscale\\(\\)"):
        scaler.accumulate(trainer)


def test_update_before_step_is_refused():
    with pytest.raises(StepOrderError, match="update\\(\\) before step\\(\\)"):
        LossScaler().update()


def test_a_second_update_after_train_step_is_refused_with_train_step_named():
    net = _mlp(7)
    scaler = LossScaler()
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, FP32, scaler)
    x, y = (mx.nd.array(a) for a in _batch(4, seed=1))
    mxfp16.train_step(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, [x], [y], scaler)
    with pytest.raises(StepOrderError, match="train_step\\(\\) already updates the scale"):
        scaler.update()


def test_an_outcome_given_for_a_step_that_already_recorded_one_is_refused():
    """Issue 42, case 10: update(overflow=False) after train_step would count the step twice (growth twice as fast)."""
    net = _mlp(7)
    scaler = LossScaler(init_scale=2.0 ** 4, growth_interval=2)
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, FP32, scaler)
    x, y = (mx.nd.array(a) for a in _batch(4, seed=1))
    mxfp16.train_step(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, [x], [y], scaler)
    with pytest.raises(StepOrderError, match="already recorded.*count it twice.*Drop this call"):
        scaler.update(overflow=False)
    assert (scaler.steps, scaler.scale) == (1, 2.0 ** 4)
    # A step checked by other means gives its outcome once: after its own scaled loss, or on its own.
    scaler.scale_loss(mx.nd.ones(1))
    assert scaler.update(overflow=False) is False
    assert scaler.update(overflow=True) is True
    assert scaler.steps == 3 and scaler.skipped_at == [3]


@pytest.mark.parametrize("loss", [0.69, np.float32(0.69), 1])
def test_a_number_as_the_loss_is_refused_naming_why(loss):
    with pytest.raises(TypeError, match="as the loss, not an MXNet array.*left the autograd graph"):
        LossScaler().scale_loss(loss)


def test_a_disabled_scaler_keeps_the_order_too(one_step):
    net = _mlp(8)
    scaler = LossScaler(enabled=False)
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, FP32, scaler)
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(mx.nd.ones((2, 6))), mx.nd.zeros(2))
    assert scaler.scale_loss(loss) is loss  # scale 1: nothing multiplied
    loss.backward()
    scaler.unscale(trainer, 2)
    with pytest.raises(StepOrderError):
        scaler.unscale(trainer, 2)


def test_scale_loss_outside_record_still_reaches_the_parameters():
    net = _mlp(9)
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(mx.nd.ones((2, 6))), mx.nd.zeros(2))
    scaled = LossScaler(init_scale=8.0).scale_loss(loss)  # after the record scope closed
    scaled.backward()
    first = net[0].weight.grad().asnumpy()
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(mx.nd.ones((2, 6))), mx.nd.zeros(2))
    loss.backward()
    np.testing.assert_allclose(first, 8.0 * net[0].weight.grad().asnumpy(), rtol=1e-6)


BFLOAT16_CHILD = """
import json, sys
import mxfp16  # before mxnet: on numpy 2 MXNet needs the names it supplies
sys.path.insert(0, "tests")
mp = mxfp16.MixedPrecision("amp-bfloat16", "cpu")
from test_step_seams import _accumulated_step, _batch, _mlp, _params
net = _mlp(0)
net.hybridize()
trainer = mp.prepare(net, "sgd", {"learning_rate": 0.5, "momentum": 0.9})
for step in range(3):
    x, y = _batch(32, seed=step)
    _accumulated_step(net, trainer, mp.scaler, x, y, micro=8)
print(json.dumps([p.tolist() for p in _params(net)]))
"""


@requires_bfloat16
def test_accumulation_in_amp_bfloat16_matches_float32_within_the_layer_tolerance():
    """The float32 large-batch step here, the amp-bfloat16 accumulated one in a child; updates within 3%."""
    child = run_python(BFLOAT16_CHILD, timeout=240)
    low = [np.array(p) for p in last_line_json(child.stdout)]
    start, large = _params(_mlp(0)), _mlp(0)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = make_trainer(large.collect_params(), "sgd", {"learning_rate": 0.5, "momentum": 0.9}, FP32)
    for step in range(3):
        x, y = _batch(32, seed=step)
        mxfp16.train_step(large, loss_fn, trainer, [mx.nd.array(x)], [mx.nd.array(y)])
    for a, b, s in zip(low, _params(large), start):
        update = b - s
        # tests/test_amp_layers.py's tolerance: a few bfloat16 rounding steps, relative to the largest value
        assert np.abs((a - s) - update).max() <= 0.03 * np.abs(update).max()
