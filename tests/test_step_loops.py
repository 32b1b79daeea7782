"""Loops other than one network and one loss, each against the loop it was ported from.

A GAN's two trainers on one dynamic scaler (MXNet's DCGAN example), a word
language model's gradient clipping (MXNet's word_language_model example) and
SSD's loss normalised over all devices (GluonCV's train_ssd.py): each ported
loop is run beside the original, unscaled, float32 loop, and their parameters
compared. amp-bfloat16 runs in a child process (AMP is process-global).
"""
import json

import mxfp16
from mxfp16 import BatchLoss, LossScaler, StepOrderError, make_trainer, resolve_precision

import mxnet as mx
import numpy as np
import pytest
from conftest import requires_bfloat16, run_python
from mxnet import autograd, gluon

CPU = [mx.cpu()]
FP32 = resolve_precision("float32", CPU)


def _params(*nets):
    return [p.data().asnumpy().astype(np.float64) for net in nets for p in net.collect_params().values()]


def _set_weights(net, seed):
    """Weights drawn by numpy, so every process and every copy starts alike."""
    rng = np.random.RandomState(seed)
    for param in net.collect_params().values():
        param.set_data(mx.nd.array(rng.normal(0, 0.3, param.shape)))
    return net


def _mlp(sizes, seed, ctx=CPU):
    net = gluon.nn.HybridSequential()
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        net.add(gluon.nn.Dense(n_out, in_units=n_in, activation="relu" if i < len(sizes) - 2 else None))
    net.initialize(ctx=ctx)
    return _set_weights(net, seed)


# -- a GAN: two trainers, one scaler --------------------------------------------------------------------------

NOISE, BATCH = 4, 16


def _gan(seed):
    """A generator (noise -> 2-D points) and a discriminator (point -> logit), DCGAN's loop on a small scale."""
    return _mlp([NOISE, 16, 2], seed), _mlp([2, 16, 1], seed + 1)


def _gan_batch(i):
    rng = np.random.RandomState(100 + i)
    real = rng.normal([2.0, -1.0], 0.5, (BATCH, 2)).astype("float32")
    return mx.nd.array(real), mx.nd.array(rng.normal(0, 1, (BATCH, NOISE)).astype("float32"))


LOSS = gluon.loss.SigmoidBinaryCrossEntropyLoss()
REAL, FAKE = mx.nd.ones((BATCH, 1)), mx.nd.zeros((BATCH, 1))


def _gan_iteration(net_g, net_d, trainer_g, trainer_d, scaler, real, noise, poison_g=False):
    """The DCGAN example's iteration through the scaler's seams: the discriminator steps, then the generator."""
    judge = lambda x: mxfp16.to_float32(net_d(x))  # noqa: E731 -- the loss on float32 logits, whatever the precision
    with autograd.record():
        fake = net_g(noise)
        loss_d = LOSS(judge(real), REAL) + LOSS(judge(fake.detach()), FAKE)
    scaler.scale_loss(loss_d).backward()
    skipped_d = scaler.step(trainer_d, BATCH)
    with autograd.record():
        loss_g = LOSS(judge(fake), REAL) * (float("inf") if poison_g else 1.0)
    scaler.scale_loss(loss_g).backward()
    skipped_g = scaler.step(trainer_g, BATCH)
    scaler.update()  # once per iteration, for both trainers
    return skipped_d, skipped_g


def _gan_control(net_g, net_d, trainer_g, trainer_d, real, noise, step_g=True):
    """MXNet's own DCGAN iteration, float32, no scaling."""
    with autograd.record():
        fake = net_g(noise)
        loss_d = LOSS(net_d(real), REAL) + LOSS(net_d(fake.detach()), FAKE)
    loss_d.backward()
    trainer_d.step(BATCH)
    with autograd.record():
        loss_g = LOSS(net_d(fake), REAL)
    loss_g.backward()
    if step_g:
        trainer_g.step(BATCH)


def _gan_trainers(net_g, net_d, scaler=None):
    opt = {"learning_rate": 0.05, "momentum": 0.5}
    return (make_trainer(net_g.collect_params(), "sgd", opt, FP32, scaler),
            make_trainer(net_d.collect_params(), "sgd", opt, FP32, scaler))


def test_a_gan_shares_one_dynamic_scaler_whose_scale_grows_once_per_iteration():
    net_g, net_d = _gan(0)
    control_g, control_d = _gan(0)
    scaler = LossScaler(init_scale=2.0 ** 4, growth_interval=2)
    trainers, controls = _gan_trainers(net_g, net_d, scaler), _gan_trainers(control_g, control_d)
    start = _params(net_g, net_d)
    for i in range(6):
        assert _gan_iteration(net_g, net_d, *trainers, scaler, *_gan_batch(i)) == (False, False)
        _gan_control(control_g, control_d, *controls, *_gan_batch(i))
    # One scale step per iteration: growth after iterations 2, 4 and 6 (an update per trainer would grow it 6 times).
    assert scaler.steps == 6 and list(scaler.history) == [16.0, 32.0, 32.0, 64.0, 64.0, 128.0]
    for a, b, s in zip(_params(net_g, net_d), _params(control_g, control_d), start):
        assert not np.array_equal(a, s)  # both networks trained
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_an_overflow_in_one_trainer_skips_its_step_only_and_backs_the_scale_off_once():
    """GradScaler's rule: each trainer's step follows its own gradients; the iteration's scale backs off once."""
    net_g, net_d = _gan(2)
    control_g, control_d = _gan(2)
    scaler = LossScaler(init_scale=2.0 ** 8, growth_interval=100)
    trainers, controls = _gan_trainers(net_g, net_d, scaler), _gan_trainers(control_g, control_d)
    outcomes = []
    for i in range(4):
        outcomes.append(_gan_iteration(net_g, net_d, *trainers, scaler, *_gan_batch(i), poison_g=(i == 2)))
        _gan_control(control_g, control_d, *controls, *_gan_batch(i), step_g=(i != 2))
    assert outcomes == [(False, False), (False, False), (False, True), (False, False)]
    assert scaler.skipped_at == [3] and scaler.scale == 2.0 ** 7
    for a, b in zip(_params(net_g, net_d), _params(control_g, control_d)):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_several_trainers_keep_the_order_of_the_seams():
    net_g, net_d = _gan(4)
    scaler = LossScaler(init_scale=8.0)
    trainer_g, trainer_d = _gan_trainers(net_g, net_d, scaler)
    real, noise = _gan_batch(0)
    with autograd.record():
        loss_d = LOSS(net_d(real), REAL) + LOSS(net_d(net_g(noise).detach()), FAKE)
    scaler.scale_loss(loss_d).backward()
    scaler.unscale(trainer_d, BATCH)
    with pytest.raises(StepOrderError, match="unscaled or accumulated but not stepped.*scaler.step\\(trainer\\)"):
        scaler.update()
    scaler.step(trainer_d)
    with pytest.raises(StepOrderError, match="step\\(\\) was already called for this trainer in this iteration"):
        scaler.step(trainer_d, BATCH)
    with pytest.raises(StepOrderError, match="clip_global_norm\\(\\) before unscale\\(\\)"):
        scaler.clip_global_norm(trainer_g, 1.0)
    scaler.update()
    assert scaler.steps == 1


GAN_CHILD = """
import json, sys
import mxfp16
sys.path.insert(0, "tests")
mp = mxfp16.MixedPrecision("amp-bfloat16", "cpu", loss_scale="dynamic", init_scale=2.0 ** 4, growth_interval=2)
from test_step_loops import _gan, _gan_batch, _gan_iteration, _params
net_g, net_d = _gan(0)
net_g.hybridize(); net_d.hybridize()
opt = {"learning_rate": 0.05, "momentum": 0.5}
trainers = (mp.prepare(net_g, "sgd", opt), mp.prepare(net_d, "sgd", opt))
outcomes = [_gan_iteration(net_g, net_d, *trainers, mp.scaler, *_gan_batch(i)) for i in range(6)]
print(json.dumps({"outcomes": outcomes, "history": list(mp.scaler.history),
                  "params": [p.tolist() for p in _params(net_g, net_d)]}))
"""


@requires_bfloat16
def test_the_gan_trains_in_amp_bfloat16_with_one_scale_step_per_iteration():
    child = json.loads(run_python(GAN_CHILD, timeout=300).stdout.strip().splitlines()[-1])
    assert child["outcomes"] == [[False, False]] * 6
    assert child["history"] == [16.0, 32.0, 32.0, 64.0, 64.0, 128.0]
    control_g, control_d = _gan(0)
    start = _params(control_g, control_d)
    controls = _gan_trainers(control_g, control_d)
    for i in range(6):
        _gan_control(control_g, control_d, *controls, *_gan_batch(i))
    for a, b, s in zip([np.array(p) for p in child["params"]], _params(control_g, control_d), start):
        # bfloat16 keeps 8 significant bits: the updates agree to a few of its rounding steps, relative to the largest
        assert np.abs((a - s) - (b - s)).max() <= 0.1 * np.abs(b - s).max()


# -- a word language model's clipping -------------------------------------------------------------------------

VOCAB, BPTT, LM_BATCH = 30, 5, 4


class _LM(gluon.Block):
    """MXNet's word_language_model on a small scale: embedding, LSTM, a dense decoder over the vocabulary."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embedding = gluon.nn.Embedding(VOCAB, 8)
            self.rnn = gluon.rnn.LSTM(16, input_size=8)
            self.decoder = gluon.nn.Dense(VOCAB, in_units=16, flatten=False)

    def forward(self, tokens):  # (time, batch)
        return self.decoder(self.rnn(self.embedding(tokens)))


def _lm(seed):
    net = _LM()
    net.initialize(ctx=CPU)
    return _set_weights(net, seed)


def _lm_batch(i):
    tokens = np.random.RandomState(200 + i).randint(0, VOCAB, (BPTT + 1, LM_BATCH)).astype("float32")
    return mx.nd.array(tokens[:-1]), mx.nd.array(tokens[1:]).reshape((-1,))


def _lm_loss(net, data, target):
    return gluon.loss.SoftmaxCrossEntropyLoss()(net(data).reshape((-1, VOCAB)), target)


def test_clipping_the_scaled_gradients_of_the_word_language_model_is_caught():
    """The example's own clipping line, left where it was: between the scaled backward and the step."""
    net = _lm(0)
    scaler = LossScaler(init_scale=2.0 ** 10)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1.0}, update_on_kvstore=False)
    caught = None
    for i in range(3):
        data, target = _lm_batch(i)
        before = _params(net)
        with autograd.record():
            loss = _lm_loss(net, data, target)
            scaler.scale_loss(loss).backward()
        grads = [p.grad() for p in net.collect_params().values()]
        gluon.utils.clip_global_norm(grads, 0.25)
        try:
            scaler.step(trainer, LM_BATCH)
        except StepOrderError as err:
            caught = (i, str(err), before)
            break
        scaler.update()
    assert caught is not None, "the clip while scaled went through"
    step, message, before = caught
    assert step == 1  # the first step learns the trainer; from the second, every step is read
    assert "changed between the scaled backward pass and unscale()" in message
    assert "scaler.clip_global_norm(trainer, max_norm)" in message and "divided by the batch size" in message
    for a, b in zip(_params(net), before):  # the refused step applied nothing
        np.testing.assert_array_equal(a, b)
    with pytest.raises(StepOrderError, match="received a gradient"):
        scaler.step(trainer, LM_BATCH)  # nor can a retry


def test_the_scale_aware_clip_matches_the_unscaled_float32_script():
    """``clip * bptt * batch_size`` on Gluon's summed gradients is ``clip * bptt`` on the batch-averaged ones."""
    net, control = _lm(1), _lm(1)
    clip, lr = 0.05, 1.0
    scaler = LossScaler(init_scale=2.0 ** 12)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr}, update_on_kvstore=False)
    t_control = gluon.Trainer(control.collect_params(), "sgd", {"learning_rate": lr})
    for i in range(4):
        data, target = _lm_batch(i)
        with autograd.record():
            loss = _lm_loss(net, data, target)
            scaler.scale_loss(loss).backward()
        scaler.unscale(trainer, LM_BATCH)
        norm = scaler.clip_global_norm(trainer, clip * BPTT)
        assert scaler.step(trainer) is False
        scaler.update()
        with autograd.record():  # the example's own lines
            loss = _lm_loss(control, data, target)
            loss.backward()
        grads = [p.grad() for p in control.collect_params().values()]
        summed = gluon.utils.clip_global_norm(grads, clip * BPTT * LM_BATCH)
        t_control.step(LM_BATCH)
        assert norm.item() == pytest.approx(summed / LM_BATCH, rel=1e-5)
        assert norm.item() > clip * BPTT  # the clip engaged
    for a, b in zip(_params(net), _params(control)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_reading_or_accumulating_gradients_is_not_taken_for_a_clip_but_changing_them_is():
    net = _lm(2)
    scaler = LossScaler(init_scale=2.0 ** 10)
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.5}, FP32, scaler)
    for i in range(3):
        for micro in range(2):
            data, target = _lm_batch(10 * i + micro)
            with autograd.record():
                loss = _lm_loss(net, data, target)
            scaler.scale_loss(loss).backward()
            _ = [p.grad().asnumpy() for p in net.collect_params().values()]  # a look, not a change
            scaler.accumulate(trainer)
        if i == 2:  # a clip after the last micro-batch, before unscale: its gradients are still scaled
            gluon.utils.clip_global_norm([p.grad() for p in net.collect_params().values()], 1.0)
        grads = scaler.unscale(trainer, 2 * LM_BATCH)
        grads.clip_(1.0)  # after unscale: the right place
        if i == 2:
            with pytest.raises(StepOrderError, match="changed between the scaled backward pass and unscale"):
                scaler.step(trainer)
        else:
            assert scaler.step(trainer) is False
            scaler.update()
    assert scaler.steps == 2


# -- SSD's loss, normalised over every device --------------------------------------------------------------------

TWO_CPUS = [mx.cpu(0), mx.cpu(1)]
ANCHORS, CLASSES = 8, 3


class _TinySSD(gluon.HybridBlock):
    """SSD's outputs on a small scale: class scores (batch, anchors, classes + 1) and boxes (batch, anchors, 4)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = gluon.nn.Dense(16, in_units=6, activation="relu")
            self.cls = gluon.nn.Dense(ANCHORS * (CLASSES + 1), in_units=16)
            self.box = gluon.nn.Dense(ANCHORS * 4, in_units=16)

    def hybrid_forward(self, F, x):
        h = self.features(x)
        return self.cls(h).reshape((0, ANCHORS, CLASSES + 1)), self.box(h).reshape((0, ANCHORS, 4))


def _ssd(seed):
    net = _TinySSD()
    net.initialize(ctx=TWO_CPUS)
    return _set_weights(net, seed)


def _ssd_batch(i):
    """Eight images; the two halves hold 9 and 2 positive anchors, so per-device normalisation differs."""
    rng = np.random.RandomState(300 + i)
    cls_target = np.zeros((8, ANCHORS), "float32")
    for image, count in zip(range(8), (3, 3, 2, 1, 1, 0, 1, 0)):
        cls_target[image, rng.choice(ANCHORS, count, replace=False)] = rng.randint(1, CLASSES + 1, count)
    return (mx.nd.array(rng.normal(0, 1, (8, 6))), mx.nd.array(cls_target),
            mx.nd.array(rng.normal(0, 0.5, (8, ANCHORS, 4))))


def _mbox_loss():
    return mxfp16.import_gluoncv().loss.SSDMultiBoxLoss()


def _ssd_loss(mbox):
    def ssd_loss(outputs, labels):
        sum_loss, _, _ = mbox([o[0] for o in outputs], [o[1] for o in outputs], [y[0] for y in labels],
                              [y[1] for y in labels])
        return sum_loss
    return ssd_loss


def _ssd_trainer(net, scaler=None):
    return make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, FP32, scaler)


def _ssd_script(net, trainer, mbox, x, cls_target, box_target):
    """GluonCV's train_ssd.py: forward per device, the loss over all devices' lists, backward, step(1)."""
    data, cls_targets, box_targets = [gluon.utils.split_and_load(a, TWO_CPUS) for a in (x, cls_target, box_target)]
    with autograd.record():
        cls_preds, box_preds = zip(*[net(d) for d in data])
        sum_loss, _, _ = mbox(list(cls_preds), list(box_preds), cls_targets, box_targets)
        autograd.backward(sum_loss)
    trainer.step(1)


@pytest.mark.parametrize("how", ["train_step", "seams"])
def test_ssd_loss_over_two_devices_matches_the_scripts_normalisation(how):
    net, control = _ssd(0), _ssd(0)
    mbox = _mbox_loss()
    scaler = LossScaler(init_scale=2.0 ** 6)
    trainer, t_control = _ssd_trainer(net, scaler), _ssd_trainer(control)
    for i in range(3):
        x, cls_target, box_target = _ssd_batch(i)
        data, label = mxfp16.cast_batch(x, (cls_target, box_target), "float32", TWO_CPUS)
        if how == "train_step":
            result = mxfp16.train_step(net, BatchLoss(_ssd_loss(mbox)), trainer, data, label, scaler, batch_size=1)
            assert result.skipped is False and result.loss_scale == 2.0 ** 6
        else:
            with autograd.record():
                outputs = [net(d) for d in data]
                sum_loss = _ssd_loss(mbox)(outputs, label)
            scaler.scale_loss(sum_loss).backward()
            assert scaler.step(trainer, 1) is False
            scaler.update()
        _ssd_script(control, t_control, mbox, x, cls_target, box_target)
    for a, b in zip(_params(net), _params(control)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_ssd_loss_per_device_would_normalise_differently():
    """What BatchLoss is for: the same loss called per device divides by each device's own positives."""
    net, control = _ssd(1), _ssd(1)
    mbox = _mbox_loss()
    trainer, t_control = _ssd_trainer(net), _ssd_trainer(control)
    x, cls_target, box_target = _ssd_batch(0)
    data, label = mxfp16.cast_batch(x, (cls_target, box_target), "float32", TWO_CPUS)
    per_device = lambda out, ct, bt: mbox([out[0]], [out[1]], [ct], [bt])[0][0]  # noqa: E731
    mxfp16.train_step(net, per_device, trainer, data, label, batch_size=1)
    _ssd_script(control, t_control, mbox, x, cls_target, box_target)
    gap = max(np.abs(a - b).max() for a, b in zip(_params(net), _params(control)))
    assert gap > 1e-3


def test_a_batch_loss_returns_one_entry_per_device():
    net = _ssd(2)
    x, cls_target, box_target = _ssd_batch(0)
    data, label = mxfp16.cast_batch(x, (cls_target, box_target), "float32", TWO_CPUS)
    first_only = BatchLoss(lambda outputs, labels: [outputs[0][0].sum(axis=(1, 2))])
    with pytest.raises(ValueError, match="returned 1 entries for 2 device\\(s\\).*one entry per device"):
        mxfp16.train_step(net, first_only, _ssd_trainer(net), data, label, batch_size=1)
    with pytest.raises(TypeError, match="BatchLoss takes a function"):
        BatchLoss(3)
