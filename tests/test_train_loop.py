"""The epoch loop in this process: counting, callbacks, interruption and an exact resume.

The elementwise network (float32, dynamic loss scale, one injected overflow)
trains for two epochs on in-memory batches through
:func:`mxfp16.train.train_epoch`. No subprocess, no data folder: the loop
and the checkpoint are tested as library code.
"""
import itertools

from mxfp16 import MixedPrecision
from mxfp16.optim import lr_schedule
from mxfp16.train import Callback, Progress, TrainingDivergedError, params_digest, train_epoch
from mxfp16.train.checkpoint import CheckpointError, CheckpointMismatchError, load_checkpoint, write_checkpoint
from mxfp16.train.parts import PartsSpec, build_parts

import mxnet as mx
import numpy as np
import pytest
from fault_injection import InjectOverflow, InterruptAtStep

CLASSES, SIZE, BATCH, STEPS, EPOCHS = 3, 4, 8, 5, 2
FINGERPRINT = {"model": "elementwise-mlp"}


def _data():
    rng = np.random.RandomState(0)
    labels = np.repeat(np.arange(CLASSES), BATCH * STEPS // CLASSES + 1)[:BATCH * STEPS]
    centres = rng.normal(0, 1.5, (CLASSES, 3 * SIZE * SIZE))
    images = centres[labels] + rng.normal(0, 1.0, (len(labels), 3 * SIZE * SIZE))
    return images.reshape(-1, 3, SIZE, SIZE).astype(np.float32), labels.astype(np.float32)


IMAGES, LABELS = _data()


def batches(epoch, start):
    """A fixed permutation per epoch, from batch ``start`` on (what Loaders.train_batches promises)."""
    order = np.random.RandomState(epoch).permutation(len(LABELS))
    for b in range(start, STEPS):
        idx = order[b * BATCH:(b + 1) * BATCH]
        yield mx.nd.array(IMAGES[idx]), mx.nd.array(LABELS[idx])


def make_parts(loss_scale="dynamic"):
    spec = PartsSpec(model="elementwise-mlp", classes=CLASSES, image_size=SIZE, batch_size=BATCH,
                     optimizer="sgd", lr=0.2, seed=0)
    mixed = MixedPrecision("float32", "cpu", loss_scale=loss_scale)
    return build_parts(spec, mixed, lr_scheduler=lr_schedule(0.2, EPOCHS, 0, STEPS))


def train_until_done_or_stopped(parts, progress, callbacks, out=None):
    while progress.epoch < EPOCHS:
        remaining = itertools.islice(batches(progress.epoch, progress.batch), STEPS - progress.batch)
        if not train_epoch(parts, remaining, progress, callbacks, log_every=2):
            write_checkpoint(out, parts, progress, FINGERPRINT)
            return False
        progress.epoch_finished()
    return True


class Recorder(Callback):
    """Keeps each step's outputs and the sums after every read: an independent view of what the loop counted."""

    def __init__(self):
        self.correct = 0
        self.images = 0
        self.reads = 0

    def on_step_end(self, progress, result):
        if not result.skipped:
            predicted = np.concatenate([o.asnumpy().argmax(axis=1) for o in result.outputs])
            self.correct += int((predicted == self.labels).sum())
            self.images += len(predicted)

    def on_read(self, progress):
        self.reads += 1


def test_the_loop_counts_what_the_steps_did():
    parts = make_parts()
    progress = Progress()
    recorder = Recorder()
    order = np.random.RandomState(0).permutation(len(LABELS))

    class Labels(Callback):
        def on_step_end(self, progress, result):  # before the recorder's: the labels of the step just taken
            b = progress.batch - 1
            recorder.labels = LABELS[order[b * BATCH:(b + 1) * BATCH]]

    callbacks = [Labels(), InjectOverflow(parts, 3), recorder]
    assert train_epoch(parts, batches(0, 0), progress, callbacks, log_every=2)
    sums = progress.sums
    assert (progress.epoch, progress.batch, progress.global_step) == (0, STEPS, STEPS)
    assert parts.scaler.skipped_at == [3] and parts.scaler.skipped_steps == 1
    assert sums.seen == STEPS * BATCH and sums.images == (STEPS - 1) * BATCH == recorder.images
    assert sums.correct == recorder.correct
    assert recorder.reads == 3  # after steps 2 and 4 (log_every=2), and the final read of step 5
    assert parts.scaler.scale == 2.0 ** 15 and parts.scaler.skipped_steps == 1
    assert 0 < sums.loss_sum / sums.images < 5 and sums.train_seconds > 0


def test_interrupted_and_resumed_training_is_exact(tmp_path):
    whole = make_parts()
    whole_progress = Progress()
    assert train_until_done_or_stopped(whole, whole_progress, [InjectOverflow(whole, 3)])

    first = make_parts()
    progress = Progress()
    stop_at = STEPS + 2  # epoch 2, after its second batch
    assert not train_until_done_or_stopped(first, progress, [InjectOverflow(first, 3), InterruptAtStep(stop_at)],
                                           tmp_path)
    assert (progress.epoch, progress.batch, progress.global_step) == (1, 2, stop_at)

    second = make_parts()  # a fresh process would build these the same way
    resumed = load_checkpoint(tmp_path, second, FINGERPRINT)
    assert resumed == progress
    assert train_until_done_or_stopped(second, resumed, [InjectOverflow(second, 3)])

    assert params_digest(second.net) == params_digest(whole.net)
    assert second.scaler.state_dict() == whole.scaler.state_dict()
    assert resumed.state_dict() == whole_progress.state_dict()
    assert second.scaler.skipped_at == [3] and resumed.global_step == EPOCHS * STEPS
    assert second.trainer.learning_rate == pytest.approx(whole.trainer.learning_rate)


def test_a_non_finite_loss_without_a_scaler_names_the_step_and_epoch():
    parts = make_parts(loss_scale="none")
    progress = Progress(epoch=1, global_step=STEPS)
    with pytest.raises(TrainingDivergedError) as err:
        train_epoch(parts, batches(1, 0), progress, [InjectOverflow(parts, STEPS + 2)], log_every=1)
    assert (err.value.step, err.value.epoch) == (STEPS + 2, 1)
    assert "the loss became" in str(err.value)


def test_progress_round_trips_and_refuses_a_damaged_record():
    progress = Progress()
    progress.step_taken()
    progress.add_read(8, float("inf"), 0, skipped=True)
    progress.step_taken()
    progress.add_read(8, 0.5, 6, skipped=False)
    assert progress.tag() == "epoch-0001-batch-00002"
    assert (progress.sums.seen, progress.sums.images, progress.sums.loss_sum) == (16, 8, 4.0)
    again = Progress.from_state_dict(progress.state_dict())
    assert again == progress and again.epoch_first_step == 1
    progress.epoch_finished(peak_memory_mb=12.5)
    assert (progress.tag(), progress.sums.seen, progress.peak_memory_mb) == ("epoch-0001", 0, 12.5)
    broken = progress.state_dict()
    del broken["sums"]["seen"]
    with pytest.raises(ValueError, match="incomplete or malformed"):
        Progress.from_state_dict(broken)
    with pytest.raises(ValueError, match="negative"):
        Progress.from_state_dict(dict(progress.state_dict(), batch=-1))


def test_a_checkpoint_that_cannot_be_written_keeps_the_previous_one(tmp_path, monkeypatch):
    parts, progress = make_parts(), Progress()
    train_epoch(parts, batches(0, 0), progress, log_every=2)
    progress.epoch_finished({"epoch": 1})
    write_checkpoint(tmp_path, parts, progress, FINGERPRINT)
    before = (tmp_path / "checkpoints" / "latest.json").read_text()

    def disk_full(path):  # what MXNet raises when the disk fills up
        raise mx.base.MXNetError("[12:00:00] src/io/local_filesys.cc:xx: Check failed: FileStream.Write incomplete")

    monkeypatch.setattr(parts.net, "save_parameters", disk_full)
    train_epoch(parts, batches(1, 0), progress, log_every=2)
    progress.epoch_finished({"epoch": 2})
    with pytest.raises(CheckpointError, match=r"could not write checkpoint epoch-0002 .*Write incomplete; \d+ MB free"):
        write_checkpoint(tmp_path, parts, progress, FINGERPRINT)
    assert (tmp_path / "checkpoints" / "latest.json").read_text() == before
    assert not list((tmp_path / "checkpoints").glob("*.tmp")) and not list((tmp_path / "checkpoints").glob("*0002*"))


def test_a_checkpoint_of_another_run_is_refused_naming_the_differences(tmp_path):
    parts, progress = make_parts(), Progress()
    train_epoch(parts, batches(0, 0), progress, log_every=2)
    progress.epoch_finished()
    write_checkpoint(tmp_path, parts, progress, dict(FINGERPRINT, image_size=4))
    with pytest.raises(CheckpointMismatchError, match="image_size: checkpoint 4, this run 8"):
        load_checkpoint(tmp_path, make_parts(), dict(FINGERPRINT, image_size=8))


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    parts, progress = make_parts(), Progress()
    for epoch in range(3):
        train_epoch(parts, batches(epoch, 0), progress, log_every=2)
        progress.epoch_finished()
        write_checkpoint(tmp_path, parts, progress, FINGERPRINT, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["epoch-0002.json", "epoch-0002.optimizer", "epoch-0002.params", "epoch-0003.json",
                     "epoch-0003.optimizer", "epoch-0003.params", "latest.json"]
