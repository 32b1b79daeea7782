"""The epoch loop: :func:`mxfp16.train_step` over the batches, numbers read from the device in batches.

:func:`train_epoch` knows nothing of files, progress bars or signals (those are :class:`Callback` objects). Where
it waits for the device, and why: docs/training.md, "Host synchronisation".
"""
import math
import time

import mxnet as mx

from ..casting import cast_batch, to_float32
from ..scaler import LossScaleDivergedError
from ..step import train_step

__all__ = ["Callback", "train_epoch", "evaluate", "TrainingDivergedError"]


class TrainingDivergedError(FloatingPointError):
    """The loss became NaN/inf (without a loss scaler), or the loss scale diverged, at global ``step`` (from 1) of
    0-based ``epoch``."""

    def __init__(self, message, step=None, epoch=None):
        super().__init__(message)
        self.step, self.epoch = step, epoch


class Callback:
    """Hooks :func:`train_epoch` calls; each does nothing unless overridden."""

    def on_epoch_begin(self, progress):
        """Before the first step of the epoch (or of its remainder, after a resume)."""

    def on_step_end(self, progress, result):
        """After each step, with its :class:`~mxfp16.StepResult` (device arrays, unread)."""

    def on_read(self, progress):
        """After the queued numbers were read into ``progress.sums``."""

    def on_epoch_end(self, progress):
        """After the epoch's last step, a stop or an error."""

    def on_epoch_record(self, progress, record):
        """After the epoch was evaluated and checkpointed, with its metrics record (``fit`` calls it)."""

    def stop_requested(self, progress):
        """``True`` to end the epoch after the current step (a checkpoint can then be written)."""
        return False


class _Reads:
    """Device values waiting to be read, and the one host read that empties them."""

    def __init__(self):
        self._steps = []  # (step, epoch, loss, correct, images, skipped); loss and correct on a device

    def __len__(self):
        return len(self._steps)

    def add(self, step, epoch, result, labels, images):
        cpu = mx.cpu()
        # argmax/compare/sum are queued on the devices; nothing waits here.
        counts = [(out.argmax(axis=1) == y).sum().as_in_context(cpu) for out, y in zip(result.outputs, labels)]
        correct = mx.nd.add_n(*counts) if len(counts) > 1 else counts[0]
        self._steps.append((step, epoch, result.loss.as_nd_ndarray().as_in_context(cpu), correct, images,
                            result.skipped))

    def read_into(self, progress):
        """One ``asnumpy`` for every queued loss and count; raise on a non-finite loss."""
        if not self._steps:
            return
        steps, self._steps = self._steps, []
        arrays = [s[2] for s in steps] + [s[3] for s in steps]
        values = mx.nd.concat(*[a.astype("float32").reshape((1,)) for a in arrays], dim=0).asnumpy()
        for (step, epoch, _, _, images, skipped), loss, correct in zip(steps, values[:len(steps)],
                                                                       values[len(steps):]):
            # A skipped step changed nothing; its loss may be inf by design.
            if not skipped and not math.isfinite(float(loss)):
                raise TrainingDivergedError(f"the loss became {float(loss)} at step {step}", step=step, epoch=epoch)
            progress.add_read(images, float(loss), float(correct), skipped)


def train_epoch(parts, batches, progress, callbacks=(), log_every=10, workers=1, clip_grad_norm=None):
    """Train on ``batches`` from ``progress``'s position; return ``False`` when a callback asked to stop.

    Parameters
    ----------
    parts : mxfp16.train.parts.Parts
    batches : iterable of (NDArray, NDArray)
        float32 data and labels for the rest of the epoch.
    progress : Progress
        Advanced in place: position, sums, skipped steps.
    callbacks : sequence of Callback
    log_every : int
        Steps between host reads of the queued numbers.
    workers : int
        Workers of a dist kvstore job; the optimizer divides the summed gradients by ``batch x workers``.
    clip_grad_norm : float, optional

    Returns
    -------
    bool
        ``True`` when the batches ran out, ``False`` after a stop request.

    Raises
    ------
    TrainingDivergedError
        A non-finite loss on a step that was not skipped, or a diverged loss scale.
    """
    reads = _Reads()
    for cb in callbacks:
        cb.on_epoch_begin(progress)
    tic = time.perf_counter()
    finished = True
    try:
        for data, label in batches:
            x, y = cast_batch(data, label, parts.precision.data_dtype, parts.ctx)
            try:
                result = train_step(parts.net, parts.loss, parts.trainer, x, y, parts.scaler,
                                    batch_size=data.shape[0] * workers, clip_grad_norm=clip_grad_norm)
            except LossScaleDivergedError as err:
                raise TrainingDivergedError(str(err), step=progress.global_step + 1, epoch=progress.epoch) from None
            progress.step_taken()
            reads.add(progress.global_step, progress.epoch, result, y, data.shape[0])
            if len(reads) >= log_every:
                reads.read_into(progress)
                for cb in callbacks:
                    cb.on_read(progress)
            for cb in callbacks:
                cb.on_step_end(progress, result)
            if any(cb.stop_requested(progress) for cb in callbacks):
                finished = False
                break
        reads.read_into(progress)
        for cb in callbacks:
            cb.on_read(progress)
        mx.nd.waitall()  # the epoch's time must include the work still queued
        progress.sums.train_seconds += time.perf_counter() - tic
    finally:
        for cb in callbacks:
            cb.on_epoch_end(progress)
    return finished


def evaluate(parts, batches, classes):
    """``(top-1, top-5)`` accuracy over ``batches``, BatchNorm in inference mode (no autograd recording)."""
    top1 = mx.metric.Accuracy()
    top5 = mx.metric.TopKAccuracy(top_k=min(5, classes)) if classes > 1 else mx.metric.Accuracy()
    for data, label in batches:
        x, y = cast_batch(data, label, parts.precision.data_dtype, parts.ctx)
        outputs = [to_float32(parts.net(part)) for part in x]
        top1.update(y, outputs)
        top5.update(y, outputs)
    return float(top1.get()[1]), float(top5.get()[1])
