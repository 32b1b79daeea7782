"""train_step on the shapes real models have: several inputs, a network that returns its loss, weighted losses,
an unused head; eval_step; and the step's refusals of library misuse.

Each model here stands in for one of the real clients (examples/real_clients: GluonNLP's BERT classifier takes
tokens, segments and valid lengths; a GluonTS training network returns its own loss from two inputs; d2l's BERT
trained on next-sentence prediction alone leaves its masked-LM head unused) and is checked against a plain Gluon
step on a copy of it.
"""
import mxfp16
from mxfp16 import UnusedParameterError, cast_batch, make_loss_scaler, make_trainer, resolve_precision, train_step

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

CPU = [mx.cpu()]
FP32 = resolve_precision("float32", CPU)
VOCAB = 5000  # ids above 2048, which float16 cannot hold exactly


class TokenClassifier(gluon.HybridBlock):
    """BERT's interface in miniature: tokens, segments and valid lengths in, class scores out."""

    def __init__(self, classes=3, **kwargs):
        super().__init__(**kwargs)
        self.tokens = gluon.nn.Embedding(VOCAB, 8)
        self.segments = gluon.nn.Embedding(2, 8)
        self.head = gluon.nn.Dense(classes, flatten=False)

    def hybrid_forward(self, F, tokens, segments, valid_length):
        h = self.tokens(tokens) + self.segments(segments)                     # (N, T, 8)
        h = F.SequenceMask(h, sequence_length=valid_length, use_sequence_length=True, axis=1)
        pooled = F.broadcast_div(h.sum(axis=1), valid_length.reshape((-1, 1)))
        return self.head(pooled)


def _same_start(*nets):
    """Give every network the first one's parameters."""
    source = [p.data().copy() for p in nets[0].collect_params().values()]
    for net in nets[1:]:
        for p, value in zip(net.collect_params().values(), source):
            p.set_data(value)


def _params(net):
    return [p.data().asnumpy() for p in net.collect_params().values()]


def _token_batch(n=6, seed=0):
    rng = np.random.RandomState(seed)
    tokens = mx.nd.array(rng.randint(2049, VOCAB, (n, 5)), dtype="int32")
    segments = mx.nd.array(rng.randint(0, 2, (n, 5)), dtype="int32")
    valid = mx.nd.array(rng.randint(1, 6, n), dtype="float32")
    labels = mx.nd.array(rng.randint(0, 3, n), dtype="int32")
    return (tokens, segments, valid), labels


def test_several_inputs_train_like_a_plain_gluon_step():
    net, control = TokenClassifier(), TokenClassifier()
    for block in (net, control):
        block.initialize(mx.init.Xavier(), ctx=CPU)
        block(*_token_batch()[0])
    _same_start(net, control)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.5}, FP32, make_loss_scaler(FP32))
    t_control = gluon.Trainer(control.collect_params(), "sgd", {"learning_rate": 0.5})
    for step in range(3):
        inputs, labels = _token_batch(seed=step)
        data, label = cast_batch(inputs, labels, FP32.data_dtype, CPU)
        assert isinstance(data[0], tuple) and data[0][0].dtype == np.int32 and label[0].dtype == np.int32
        result = train_step(net, loss_fn, trainer, data, label)
        with autograd.record():
            loss = loss_fn(control(*inputs), labels)
        loss.backward()
        t_control.step(6)
        assert result.loss.item() == pytest.approx(loss.mean().asscalar(), rel=1e-6)
    for a, b in zip(_params(net), _params(control)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_token_ids_above_2048_reach_their_own_rows_under_float16():
    """float16 rounds 3001 to 3000: a cast id would train another token's embedding."""
    fp16 = resolve_precision("float16", CPU, allow_cpu_float16=True)
    net = gluon.nn.Embedding(VOCAB, 4)
    net.initialize(ctx=CPU)
    mxfp16.cast_net(net, fp16)
    before = net.weight.data().astype("float32").asnumpy()
    ids = mx.nd.array([[3001, 4093]], dtype="int32")
    data, label = cast_batch(ids, mx.nd.zeros((1, 2, 4)), fp16.data_dtype, CPU)
    assert data[0].dtype == np.int32 and data[0].asnumpy().tolist() == [[3001, 4093]]
    scaler = make_loss_scaler(fp16)
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 1.0}, fp16, scaler)
    assert not train_step(net, gluon.loss.L2Loss(), trainer, data, label, scaler).skipped
    changed = np.flatnonzero(np.abs(net.weight.data().astype("float32").asnumpy() - before).sum(axis=1))
    assert changed.tolist() == [3001, 4093]


class OwnLoss(gluon.HybridBlock):
    """A GluonTS-style training network: past and future values in, the per-sample loss out."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.forecast = gluon.nn.Dense(3)

    def hybrid_forward(self, F, past, future):
        return F.mean(F.square(self.forecast(past) - future), axis=1)


def test_a_network_that_returns_its_own_loss_needs_no_loss_function():
    net, control = OwnLoss(), OwnLoss()
    rng = np.random.RandomState(0)
    past, future = mx.nd.array(rng.normal(size=(8, 5))), mx.nd.array(rng.normal(size=(8, 3)))
    for block in (net, control):
        block.initialize(ctx=CPU)
        block(past, future)
    _same_start(net, control)
    scaler = make_loss_scaler(FP32, "dynamic")  # the scale must cancel exactly
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, FP32, scaler)
    data, label = cast_batch((past, future), None, "float32", CPU)
    assert label is None
    result = train_step(net, None, trainer, data, scaler=scaler)
    t_control = gluon.Trainer(control.collect_params(), "sgd", {"learning_rate": 0.1})
    with autograd.record():
        loss = control(past, future)
    loss.backward()
    t_control.step(8)
    assert result.loss.item() == pytest.approx(loss.mean().asscalar(), rel=1e-6)
    for a, b in zip(_params(net), _params(control)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


class TwoHeads(gluon.HybridBlock):
    """Pre-training's shape: one trunk, two heads, a loss each; ``use_b=False`` leaves head b unused."""

    def __init__(self, use_b=True, **kwargs):
        super().__init__(**kwargs)
        self.use_b = use_b
        self.trunk = gluon.nn.Dense(6, activation="tanh")
        self.head_a = gluon.nn.Dense(3)
        self.head_b = gluon.nn.Dense(2)

    def hybrid_forward(self, F, x):
        h = self.trunk(x)
        return (self.head_a(h), self.head_b(h)) if self.use_b else (self.head_a(h), None)


def _two_heads(use_b):
    net = TwoHeads(use_b)
    net.initialize(ctx=CPU)
    net.head_b(net.trunk(mx.nd.ones((1, 4))))  # materialise head b even when the forward skips it
    net(mx.nd.ones((1, 4)))
    return net


def test_weighted_losses_are_summed_as_one_objective():
    net, control = _two_heads(True), _two_heads(True)
    _same_start(net, control)
    ce = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(1)
    x = mx.nd.array(rng.normal(size=(8, 4)))
    ya, yb = mx.nd.array(rng.randint(0, 3, 8)), mx.nd.array(rng.randint(0, 2, 8))
    weights = (1.0, 0.25)
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.3}, FP32)
    data, label = cast_batch(x, (ya, yb), "float32", CPU)
    result = train_step(net, lambda out, a, b: (ce(out[0], a), ce(out[1], b)), trainer, data, label,
                        loss_weights=weights)
    with autograd.record():
        out_a, out_b = control(x)
        loss = weights[0] * ce(out_a, ya) + weights[1] * ce(out_b, yb)
    loss.backward()
    gluon.Trainer(control.collect_params(), "sgd", {"learning_rate": 0.3}).step(8)
    assert result.loss.item() == pytest.approx(loss.mean().asscalar(), rel=1e-6)
    assert [m.item() for m in result.losses] == pytest.approx([ce(out_a, ya).mean().asscalar(),
                                                              ce(out_b, yb).mean().asscalar()], rel=1e-6)
    for a, b in zip(_params(net), _params(control)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="1 loss weight\\(s\\) for 2 loss term"):
        train_step(net, lambda out, a, b: (ce(out[0], a), ce(out[1], b)), trainer, data, label, loss_weights=[1])


def test_an_unused_head_is_named_with_the_option_that_skips_it():
    net = _two_heads(False)
    ce = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.3}, FP32)
    data, label = cast_batch(mx.nd.ones((4, 4)), mx.nd.zeros(4), "float32", CPU)
    head_b = _params(net.head_b)
    with pytest.raises(UnusedParameterError, match=f"{net.head_b.weight.name}.*skip_unused_params=True"):
        train_step(net, lambda out, y: ce(out[0], y), trainer, data, label)
    trunk = _params(net.trunk)
    for _ in range(2):  # the second step: stale gradients stay out
        train_step(net, lambda out, y: ce(out[0], y), trainer, data, label, skip_unused_params=True)
    assert all((a == b).all() for a, b in zip(_params(net.head_b), head_b))
    assert not any((a == b).all() for a, b in zip(_params(net.trunk), trunk))


@pytest.mark.parametrize("ctx", [CPU, [mx.cpu(0), mx.cpu(1)]], ids=["one device", "two devices"])
def test_an_unused_head_never_initialised_sits_out_until_it_is_used(ctx):
    """d2l's BERT trained on next-sentence prediction alone: its masked-LM head never runs, so Gluon never learns
    its shape; the trainer's kvstore and update must pass it by, and take it up once a forward pass reaches it."""
    net = TwoHeads(False)
    net.initialize(ctx=ctx)
    ce = gluon.loss.SoftmaxCrossEntropyLoss()
    scaler = make_loss_scaler(FP32, 8)
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.3}, FP32, scaler)
    data, label = cast_batch(mx.nd.ones((4, 4)), mx.nd.zeros(4), "float32", ctx)
    with pytest.raises(UnusedParameterError, match=f"{net.head_b.weight.name}.*skip_unused_params=True"):
        train_step(net, lambda out, y: ce(out[0], y), trainer, data, label, scaler)
    trunk = _params(net.trunk)
    train_step(net, lambda out, y: ce(out[0], y), trainer, data, label, scaler, skip_unused_params=True)
    assert not any((a == b).all() for a, b in zip(_params(net.trunk), trunk))
    assert net.head_b.weight.grad_req == "write"  # put back: the first forward through the head makes its gradient
    net.use_b = True  # the head joins: initialised by this forward pass, trained from this step on
    both = lambda out, y: ce(out[0], y) + ce(out[1], y)  # noqa: E731
    train_step(net, both, trainer, data, label, scaler, skip_unused_params=True)
    head_b = _params(net.head_b)
    train_step(net, both, trainer, data, label, scaler)
    assert not any((a == b).all() for a, b in zip(_params(net.head_b), head_b))
    assert scaler.steps == 3 and scaler.skipped_steps == 0


@pytest.mark.parametrize("loss_fn, labels, bad", [
    (gluon.loss.SoftmaxCrossEntropyLoss(), [0, 7, 1, 2], "7"),
    (gluon.loss.SoftmaxCrossEntropyLoss(), [0, -1, 1, 2], "-1"),
    (mxfp16.losses.classification_loss(3, label_smoothing=0.1), [0, 1, 3, 2], "3"),
], ids=["past the last class", "negative", "smoothed loss"])
def test_a_label_the_output_has_no_class_for_is_refused_on_the_first_step(loss_fn, labels, bad):
    net = gluon.nn.Dense(3, in_units=5)
    net.initialize(ctx=CPU)
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, FP32)
    before = _params(net)
    data, label = cast_batch(mx.nd.ones((4, 5)), mx.nd.array(labels), "float32", CPU)
    with pytest.raises(ValueError, match=f"label {bad} has no class.*numbers 0 to 2 \\(the 3 values on axis -1"):
        train_step(net, loss_fn, trainer, data, label)
    assert all((a == b).all() for a, b in zip(_params(net), before))  # nothing trained
    data, label = cast_batch(mx.nd.ones((4, 5)), mx.nd.array([0, 1, 2, 2]), "float32", CPU)
    assert np.isfinite(train_step(net, loss_fn, trainer, data, label).loss.item())


def test_labels_that_are_not_class_numbers_are_not_judged():
    net = gluon.nn.Dense(3)
    net.initialize(ctx=CPU)
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, FP32)
    targets = mx.nd.array([[0.2, 0.5, 0.3]] * 4)  # distributions: sparse_label=False
    data, label = cast_batch(mx.nd.ones((4, 5)), targets, "float32", CPU)
    train_step(net, gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False), trainer, data, label)
    data, label = cast_batch(mx.nd.ones((4, 5)), mx.nd.ones((4, 3)) * 9, "float32", CPU)
    train_step(net, gluon.loss.L2Loss(), trainer, data, label)  # regression targets of any size


def test_scaler_none_is_a_plain_step():
    net, control = _two_heads(True), _two_heads(True)
    _same_start(net, control)
    ce = gluon.loss.SoftmaxCrossEntropyLoss()
    data, label = cast_batch(mx.nd.ones((4, 4)), mx.nd.zeros(4), "float32", CPU)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.3})
    both = lambda out, y: ce(out[0], y) + ce(out[1], y)  # noqa: E731
    result = train_step(net, both, trainer, data, label, scaler=None)
    assert result.loss_scale == 1.0 and not result.skipped
    c_trainer = make_trainer(control.collect_params(), "sgd", {"learning_rate": 0.3}, loss_scaler=None)
    train_step(control, both, c_trainer, data, label, make_loss_scaler(FP32, "none"))
    for a, b in zip(_params(net), _params(control)):
        np.testing.assert_array_equal(a, b)


# -- misuse ------------------------------------------------------------------------------------------------

def _small():
    net = gluon.nn.Dense(2)
    net.initialize(ctx=CPU)
    return net, gluon.loss.SoftmaxCrossEntropyLoss()


def test_empty_or_mismatched_data_lists_are_named():
    net, loss_fn = _small()
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, FP32)
    with pytest.raises(ValueError, match="empty data list.*one batch slice per device"):
        train_step(net, loss_fn, trainer, [], [])
    x, y = mx.nd.ones((2, 3)), mx.nd.zeros(2)
    with pytest.raises(ValueError, match="1 data slice\\(s\\) but 2 label slice\\(s\\)"):
        train_step(net, loss_fn, trainer, [x], [y, y])
    with pytest.raises(TypeError, match="list with one entry per device"):
        train_step(net, loss_fn, trainer, x, [y])
    with pytest.raises(ValueError, match="empty batch"):
        cast_batch(mx.nd.array(np.empty((0, 3))), mx.nd.zeros(1), "float32", CPU)
    with pytest.raises(ValueError, match="different batch sizes"):
        cast_batch((mx.nd.ones((2, 3)), mx.nd.ones((3, 3))), y, "float32", CPU)


def test_a_loss_function_that_returns_a_number_is_named():
    net, loss_fn = _small()
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, FP32)
    with pytest.raises(TypeError, match="loss_fn got a numpy float32 .* left the autograd graph"):
        train_step(net, lambda out, y: loss_fn(out, y).mean().asscalar(), trainer, [mx.nd.ones((2, 3))],
                   [mx.nd.zeros(2)])


def test_update_on_kvstore_beside_a_dynamic_scaler_is_refused_with_the_reason():
    net, loss_fn = _small()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, update_on_kvstore=True)
    with pytest.raises(ValueError, match="update_on_kvstore=True.*before the loss scaler could check"):
        train_step(net, loss_fn, trainer, [mx.nd.ones((2, 3))], [mx.nd.zeros(2)], make_loss_scaler(FP32, "dynamic"))
    with pytest.raises(ValueError, match="loss scaling needs update_on_kvstore=False"):
        make_trainer(net.collect_params(), "sgd", {}, FP32, make_loss_scaler(FP32, "dynamic"), update_on_kvstore=True)


# -- evaluation --------------------------------------------------------------------------------------------

def test_eval_step_gives_float32_outputs_in_inference_mode():
    from mxfp16.models import elementwise_mlp

    fp16 = resolve_precision("float16", CPU, allow_cpu_float16=True)
    net = elementwise_mlp(2, [8], 2, batchnorm=False)
    net.add(gluon.nn.Dropout(0.5))
    net.initialize(ctx=CPU)
    mxfp16.cast_net(net, fp16)
    data, label = cast_batch(mx.nd.ones((4, 2)), mx.nd.zeros(4), fp16.data_dtype, CPU)
    assert data[0].dtype == np.float16 and net(data[0]).dtype == np.float16
    first, second = mxfp16.eval_step(net, data), mxfp16.eval_step(net, data)
    assert first[0].dtype == np.float32
    np.testing.assert_array_equal(first[0].asnumpy(), second[0].asnumpy())  # no dropout: inference mode
    metric = mx.metric.Accuracy()
    metric.update(label, first)
    assert 0.0 <= metric.get()[1] <= 1.0


def test_eval_step_and_the_step_result_read_with_item_in_numpy_mode():
    from mxnet import npx

    npx.set_np()
    try:
        net = gluon.nn.Dense(3)
        net.initialize(ctx=CPU)
        x, y = mx.np.ones((4, 2)), mx.np.array([0.0, 1.0, 2.0, 0.0])
        data, label = cast_batch(x, y, "float32", CPU)
        trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, FP32)
        scaler = make_loss_scaler(FP32, "dynamic")  # the overflow check reads numpy-mode gradients
        result = train_step(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, data, label, scaler,
                            clip_grad_norm=1.0)
        assert result.loss.item() > 0 and result.grad_norm.item() >= 0
        outputs = mxfp16.eval_step(net, data)
        assert isinstance(outputs[0], mx.np.ndarray) and outputs[0].dtype == np.float32
        accuracy = (outputs[0].argmax(axis=1).astype("float32") == label[0]).mean().item()
        assert 0.0 <= accuracy <= 1.0
    finally:
        npx.reset_np()
