"""MXNet's Estimator in mixed precision through mxfp16.estimator: the same step as a loop of one's own, skipped
steps skipped and counted, the loss scale through checkpoints, TensorBoard events, and the set-ups refused.

float32 and float16 (``allow_cpu_float16`` with the elementwise MLP, which trains in float16 on a CPU) run in
this process: neither switches AMP on. amp-bfloat16 runs in a child process where this CPU has bfloat16.
"""
import json

import mxfp16
from mxfp16.estimator import (
    MixedPrecisionCheckpointHandler,
    MixedPrecisionHandler,
    MixedPrecisionProcessor,
    TensorBoardHandler,
)
from mxfp16.models import elementwise_mlp
from mxfp16.plumbing.fileio import JSONFileError

import mxnet as mx
import numpy as np
import pytest
from conftest import requires_bfloat16, run_python
from mxnet import gluon
from mxnet.gluon.contrib.estimator import BatchBegin, BatchEnd, BatchProcessor, Estimator, TrainBegin

BATCH, STEPS = 16, 4  # one epoch: four batches
INJECT_AT = 3         # the call of the loss, and so the step, whose gradients are all inf


class InfAt(gluon.loss.SoftmaxCrossEntropyLoss):
    """Estimator takes a gluon Loss: this one is inf on chosen calls (one call per step on one device)."""

    def __init__(self, calls=()):
        super().__init__()
        self.calls, self.count = set(calls), 0

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        self.count += 1
        loss = super().hybrid_forward(F, pred, label, sample_weight)
        return loss * float("inf") if self.count in self.calls else loss


def _loader(epochs_of_data=1, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.uniform(-1, 1, (BATCH * STEPS * epochs_of_data, 2)).astype("float32")
    y = (x[:, 0] * x[:, 1] > 0).astype("float32")
    return gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=BATCH)


def _set_up(precision, seed=0, **scaler):
    mp = mxfp16.MixedPrecision(precision, "cpu", allow_cpu_float16=True, **scaler)
    mx.random.seed(seed)
    net = elementwise_mlp(2, [8], 2, batchnorm=False)
    net.initialize(mx.init.Xavier(), ctx=mp.ctx)
    trainer = mp.prepare(net, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    return mp, net, trainer


def _params(net):
    return [p.data().astype("float32").asnumpy() for p in net.collect_params().values()]


class Record(TrainBegin, BatchBegin, BatchEnd):
    """What each batch saw: the parameters before and after it, the loss scale at the start of training."""

    priority = 500  # after every handler that changes them

    def __init__(self, mp, net):
        self.mp, self.net, self.before, self.after, self.scale_at_start = mp, net, [], [], None

    def train_begin(self, estimator, *args, **kwargs):
        self.scale_at_start = self.mp.scaler.scale

    def batch_begin(self, estimator, *args, **kwargs):
        self.before.append(_params(self.net))

    def batch_end(self, estimator, *args, **kwargs):
        self.after.append(_params(self.net))
        return False


def test_an_estimator_takes_the_step_a_loop_of_ones_own_takes():
    """float32: the handler adds nothing and loses nothing: the parameters and the loss metric are a hand loop's."""
    mp, net, trainer = _set_up("float32")
    est = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer=trainer, context=mp.ctx)
    est.logger.disabled = True
    est.fit(_loader(), epochs=2, event_handlers=[MixedPrecisionHandler(mp)])

    mp2, net2, trainer2 = _set_up("float32")
    losses = []
    for _ in range(2):
        for x, y in _loader():
            result = mp2.train_step(net2, gluon.loss.SoftmaxCrossEntropyLoss(), trainer2, *mp2.cast_batch(x, y))
            losses.append(result.loss.item())
    for a, b in zip(_params(net), _params(net2)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not np.allclose(_params(net)[0], _params(_set_up("float32")[1])[0])  # it trained
    # Estimator's loss metric averages the per-sample losses the processor hands it: the last epoch's mean.
    metric = dict(m.get() for m in est.train_metrics)
    assert metric["training softmaxcrossentropyloss"] == pytest.approx(np.mean(losses[-STEPS:]), rel=1e-5)
    assert isinstance(est.batch_processor, MixedPrecisionProcessor)  # and it stays for a later evaluate()
    est.evaluate(_loader(seed=1))
    assert 0.0 <= dict(m.get() for m in est.val_metrics)["validation accuracy"] <= 1.0


@pytest.fixture(scope="module")
def float16_run(tmp_path_factory):
    """One float16 epoch with a dynamic loss scale, an overflow at step 3, checkpoints and TensorBoard."""
    root = tmp_path_factory.mktemp("estimator")
    mp, net, trainer = _set_up("float16", loss_scale="dynamic", init_scale=2.0 ** 10, growth_interval=2)
    loss = InfAt([INJECT_AT])
    est = Estimator(net, loss, trainer=trainer, context=mp.ctx)
    est.logger.disabled = True
    record = Record(mp, net)
    logger = mxfp16.TensorBoardLogger(root / "tensorboard")
    checkpoints = MixedPrecisionCheckpointHandler(str(root / "checkpoints"), mp, batch_period=2, epoch_period=None)
    est.fit(_loader(), batches=STEPS, event_handlers=[MixedPrecisionHandler(mp), checkpoints,
                                                      TensorBoardHandler(logger, log_every=1), record])
    logger.close()
    return {"root": root, "mp": mp, "net": net, "est": est, "record": record, "loss": loss}


def test_an_overflowing_step_is_skipped_and_counted(float16_run):
    mp, record, est = float16_run["mp"], float16_run["record"], float16_run["est"]
    assert mp.precision.name == "float16" and mp.scaler.enabled
    assert mp.scaler.skipped_at == [INJECT_AT] and mp.scaler.skipped_steps == 1
    # 2**10: two clean steps grow it to 2**11, the overflow halves it to 2**10, one clean step leaves it.
    assert mp.scaler.scale == 2.0 ** 10 and list(mp.scaler.history) == [2.0 ** 10, 2.0 ** 11, 2.0 ** 10, 2.0 ** 10]
    skipped = INJECT_AT - 1
    for a, b in zip(record.before[skipped], record.after[skipped]):
        np.testing.assert_array_equal(a, b)  # untouched: no inf reached the weights
    assert all(np.isfinite(p).all() for p in record.after[-1])
    assert not all(np.array_equal(a, b) for a, b in zip(record.before[-1], record.after[-1]))  # others updated
    # The skipped batch reached no metric: the accuracy counts three batches of samples.
    accuracy = next(m for m in est.train_metrics if "accuracy" in m.name)
    assert accuracy.num_inst == (STEPS - 1) * BATCH


def test_the_precision_state_is_written_beside_each_checkpoint(float16_run):
    folder = float16_run["root"] / "checkpoints"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["model-epoch0batch1.mxfp16.json", "model-epoch0batch1.params", "model-epoch0batch1.states",
                     "model-epoch0batch3.mxfp16.json", "model-epoch0batch3.params", "model-epoch0batch3.states"]
    first = json.loads((folder / "model-epoch0batch1.mxfp16.json").read_text())
    last = json.loads((folder / "model-epoch0batch3.mxfp16.json").read_text())
    assert first["precision"] == "float16" and first["scaler"]["scale"] == 2.0 ** 11  # after two clean steps
    assert last["scaler"] == float16_run["mp"].state_dict()["scaler"]  # after the fourth: the overflow in it


def test_resume_from_a_checkpoint_restores_the_loss_scale(float16_run):
    folder = str(float16_run["root"] / "checkpoints")
    saved = json.loads((float16_run["root"] / "checkpoints" / "model-epoch0batch3.mxfp16.json").read_text())
    mp, net, trainer = _set_up("float16", seed=5, loss_scale="dynamic")  # a fresh scaler starts at 2**16
    assert mp.scaler.scale == 2.0 ** 16
    est = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer=trainer, context=mp.ctx)
    est.logger.disabled = True
    record = Record(mp, net)
    est.fit(_loader(), batches=STEPS + 1, event_handlers=[
        MixedPrecisionHandler(mp), record,
        MixedPrecisionCheckpointHandler(folder, mp, batch_period=2, epoch_period=None, resume_from_checkpoint=True)])
    assert record.scale_at_start == saved["scaler"]["scale"] == 2.0 ** 10
    assert mp.scaler.skipped_at == [INJECT_AT]  # the run's skipped step came along; the one batch left added none
    assert mp.scaler.steps == STEPS + 1
    np.testing.assert_array_equal(record.before[0][0], _params(float16_run["net"])[0])  # the checkpoint's weights


def test_resume_without_the_precision_state_is_refused_naming_the_file(tmp_path):
    mp, net, trainer = _set_up("float32")
    est = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer=trainer, context=mp.ctx)
    est.logger.disabled = True
    net.save_parameters(str(tmp_path / "model-epoch0batch1.params"))
    trainer.save_states(str(tmp_path / "model-epoch0batch1.states"))  # a checkpoint of MXNet's own handler
    with pytest.raises(JSONFileError, match=r"model-epoch0batch1\.mxfp16\.json is missing.*resume_from_checkpoint"):
        est.fit(_loader(), batches=3, event_handlers=[MixedPrecisionHandler(mp), MixedPrecisionCheckpointHandler(
            str(tmp_path), mp, batch_period=1, epoch_period=None, resume_from_checkpoint=True)])


def test_the_estimator_run_reads_back_in_tensorboard(float16_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(float16_run["root"] / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    scalars = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    assert scalars["precision/skipped_steps"] == {1: 0, 2: 0, 3: 1, 4: 1}
    assert scalars["precision/loss_scale"] == {1: 2 ** 10, 2: 2 ** 11, 3: 2 ** 10, 4: 2 ** 10}
    assert sorted(scalars["train/loss"]) == [1, 2, 4]  # the skipped step's loss is inf: left out
    assert scalars["train/lr"][4] == pytest.approx(0.1)
    assert sorted(scalars["speed/images_per_second"]) == [2, 3, 4]
    metric = dict(m.get() for m in float16_run["est"].train_metrics)
    assert scalars["epoch/training_accuracy"][STEPS] == pytest.approx(metric["training accuracy"])
    assert "gradients/all" in events.Tags()["histograms"]


def test_a_processor_without_its_handler_is_refused_before_any_update():
    mp, net, trainer = _set_up("float32")
    est = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer=trainer, context=mp.ctx,
                    batch_processor=MixedPrecisionProcessor(mp))
    est.logger.disabled = True
    before = _params(net)
    with pytest.raises(ValueError, match=r"GradientUpdateHandler.*second time.*event_handlers=\[MixedPrecisionHandler"):
        est.fit(_loader(), epochs=1)
    for a, b in zip(before, _params(net)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("setting, phrase", [
    ("own processor", r"a batch processor of its own \(Custom\).*subclass MixedPrecisionProcessor"),
    ("other devices", r"runs on \[cpu\(0\), cpu\(1\)\].*context=mp.ctx"),
])
def test_an_estimator_set_up_the_handler_cannot_serve_is_refused(setting, phrase):
    class Custom(BatchProcessor):
        pass

    mp, net, trainer = _set_up("float32")
    options = ({"batch_processor": Custom()} if setting == "own processor" else
               {"context": [mx.cpu(0), mx.cpu(1)]})
    est = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer=trainer, **dict({"context": mp.ctx}, **options))
    with pytest.raises(ValueError, match=phrase):
        est.fit(_loader(), epochs=1, event_handlers=[MixedPrecisionHandler(mp)])


@requires_bfloat16
def test_an_estimator_trains_in_amp_bfloat16_with_loss_scaling():
    proc = run_python("""
        import json
        import mxfp16
        import mxnet as mx, numpy as np
        from mxnet import gluon
        from mxnet.gluon.contrib.estimator import Estimator
        from mxfp16.estimator import MixedPrecisionHandler

        mp = mxfp16.MixedPrecision("amp-bfloat16", "cpu", loss_scale="dynamic")
        mx.random.seed(0)
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(32, activation="relu"), gluon.nn.Dense(2))
        net.initialize(mx.init.Xavier(), ctx=mp.ctx)
        trainer = mp.prepare(net, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
        rng = np.random.RandomState(0)
        x = rng.uniform(-1, 1, (512, 2)).astype("float32"); y = (x[:, 0] * x[:, 1] > 0).astype("float32")
        data = gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=32)
        est = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer=trainer, context=mp.ctx)
        est.logger.disabled = True
        est.fit(data, data, epochs=6, event_handlers=[MixedPrecisionHandler(mp)])
        print(json.dumps({"precision": mp.precision.name, "scaler": mp.scaler.enabled, "steps": mp.scaler.steps,
                          "val": dict(m.get() for m in est.val_metrics)["validation accuracy"]}))
    """)
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome["precision"] == "amp-bfloat16" and outcome["scaler"] and outcome["steps"] == 6 * 16
    assert outcome["val"] > 0.8
