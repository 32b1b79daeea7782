"""MXNet's own training loop, ``gluon.contrib.estimator.Estimator``, in mixed precision: one argument to ``fit``.

Each batch is one :meth:`mxfp16.MixedPrecision.train_step`, run by
:class:`MixedPrecisionProcessor`; :class:`MixedPrecisionHandler` takes the
place of Estimator's update handler and puts its processor in the Estimator
(the example and why: docs/porting-gluoncv.md, "MXNet's Estimator").
:class:`MixedPrecisionCheckpointHandler` and :class:`TensorBoardHandler` add
checkpoints that keep the loss scale, and TensorBoard.
"""
from pathlib import Path

from mxnet.gluon.contrib.estimator import (
    BatchEnd,
    BatchProcessor,
    CheckpointHandler,
    EpochEnd,
    GradientUpdateHandler,
    TrainBegin,
    TrainEnd,
)

from .gradients import is_count
from .plumbing.fileio import read_json, write_json

__all__ = ["MixedPrecisionProcessor", "MixedPrecisionHandler", "MixedPrecisionCheckpointHandler",
           "TensorBoardHandler"]


class MixedPrecisionProcessor(BatchProcessor):
    """Estimator's batch processor, through :class:`~mxfp16.MixedPrecision`: one ``train_step`` per batch.

    Parameters
    ----------
    mp : MixedPrecision
        Whose ``prepare`` built the Estimator's trainer.
    **step_options
        Passed to :meth:`MixedPrecision.train_step`.

    Attributes
    ----------
    result : StepResult or None
        The last training step's (loss, loss scale, skipped), for event handlers.
    """

    def __init__(self, mp, **step_options):
        super().__init__()
        self.mp, self.step_options = mp, step_options
        self.result = None
        self._handler = None  # the MixedPrecisionHandler of the fit() in progress

    def fit_batch(self, estimator, train_batch, batch_axis=0):
        """One :meth:`MixedPrecision.train_step` on ``train_batch``.

        Returns
        -------
        (list, list, list, list)
            The data, labels, float32 outputs and per-sample losses per device (for a skipped step, only the data).

        Raises
        ------
        ValueError
            Not inside a ``fit`` with this processor's :class:`MixedPrecisionHandler`.
        """
        if self._handler is None:
            raise ValueError(
                "MixedPrecisionProcessor trains only in a fit() with its MixedPrecisionHandler: without it "
                "Estimator.fit() adds its own GradientUpdateHandler, whose trainer.step() would update the "
                "parameters a second time after this step. Pass event_handlers=[MixedPrecisionHandler(mp)] to "
                "fit() (it installs its own processor), or handler.processor as batch_processor= and the handler "
                "to fit()")
        data, label = self._split(estimator, train_batch, batch_axis)
        losses = []

        def loss_fn(outputs, *labels):
            value = estimator.loss(outputs, *labels)
            losses.append(value)  # per sample and device: what Estimator's loss metric averages
            return value

        self.result = self.mp.train_step(estimator.net, loss_fn, estimator.trainer, data, label, **self.step_options)
        if self.result.skipped:
            return data, [], [], []
        return data, label, list(self.result.outputs), losses[-len(data):]

    def evaluate_batch(self, estimator, val_batch, batch_axis=0):
        """The validation network's float32 outputs (:meth:`MixedPrecision.eval_step`) and their losses."""
        data, label = self._split(estimator, val_batch, batch_axis)
        pred = self.mp.eval_step(estimator.val_net, data)
        return data, label, pred, [estimator.val_loss(y_hat, y) for y_hat, y in zip(pred, label)]

    def _split(self, estimator, batch, batch_axis):
        """The batch cast for the precision and split over the devices (:meth:`MixedPrecision.cast_batch`)."""
        if batch_axis != 0:
            raise ValueError(f"batch_axis={batch_axis}: MixedPrecision.cast_batch splits batches along axis 0; "
                             "give the DataLoader batches with the samples first")
        _check_devices(estimator, self.mp)
        return self.mp.cast_batch(batch[0], batch[1])


class MixedPrecisionHandler(GradientUpdateHandler, TrainBegin, TrainEnd):
    """The one argument an Estimator needs: ``fit(..., event_handlers=[MixedPrecisionHandler(mp)])``.

    It installs its ``processor`` in the Estimator, and replaces Estimator's ``GradientUpdateHandler``.

    Parameters
    ----------
    mp : MixedPrecision
    priority : float
    **step_options
        For :meth:`MixedPrecision.train_step`.

    Raises
    ------
    ValueError
        At the start of ``fit``: an Estimator with another batch processor, or on other devices than ``mp``.
    """

    def __init__(self, mp, priority=-2000, **step_options):
        super().__init__(priority=priority)
        self.mp = mp
        self.processor = MixedPrecisionProcessor(mp, **step_options)

    def train_begin(self, estimator, *args, **kwargs):
        current = estimator.batch_processor
        if type(current) is BatchProcessor:  # Estimator's default: forward and an unscaled backward
            estimator.batch_processor = self.processor
        elif current is not self.processor:
            what = ("another MixedPrecisionProcessor" if isinstance(current, MixedPrecisionProcessor)
                    else f"a batch processor of its own ({type(current).__name__})")
            raise ValueError(
                f"this Estimator has {what}, and MixedPrecisionHandler trains through its own (one "
                "MixedPrecision.train_step per batch). Leave batch_processor= out of Estimator(...), or pass "
                "handler.processor; for a fit_batch of your own, subclass MixedPrecisionProcessor")
        _check_devices(estimator, self.mp)
        self.processor._handler = self

    def batch_end(self, estimator, *args, **kwargs):
        return False  # the processor's train_step applied (or skipped) the update

    def train_end(self, estimator, *args, **kwargs):
        self.processor._handler = None


class MixedPrecisionCheckpointHandler(CheckpointHandler):
    """Estimator's ``CheckpointHandler``, with ``mp.state_dict()`` beside each checkpoint.

    ``<prefix>-epoch<E>batch<B>.mxfp16.json`` (``<prefix>-best.mxfp16.json`` with ``save_best``);
    ``resume_from_checkpoint=True`` restores it into ``mp``.

    Parameters
    ----------
    model_dir : str
    mp : MixedPrecision
    **options
        Everything ``CheckpointHandler`` takes (``model_prefix``, ``epoch_period``, ``save_best`` ...).

    Raises
    ------
    mxfp16.plumbing.fileio.JSONFileError
        Resuming from a checkpoint without its state file (or with a damaged one).
    ValueError
        Resuming a checkpoint of another precision (:meth:`MixedPrecision.load_state_dict`).
    """

    SUFFIX = ".mxfp16.json"

    def __init__(self, model_dir, mp, **options):
        super().__init__(model_dir, **options)
        self.mp = mp

    def state_path(self, prefix):
        """The state file beside the checkpoint files named ``prefix`` (``model-epoch2batch40``)."""
        return Path(self.model_dir) / f"{prefix}{self.SUFFIX}"

    def train_begin(self, estimator, *args, **kwargs):
        super().train_begin(estimator, *args, **kwargs)
        if self.resume_from_checkpoint and self.trained_epoch >= 0:  # the base class found a checkpoint
            path = self.state_path(f"{self.model_prefix}-epoch{self.trained_epoch}batch{self.trained_batch}")
            self.mp.load_state_dict(read_json(
                path, "it holds the loss scale and precision of the checkpoint beside it, written by "
                "MixedPrecisionCheckpointHandler; restore it, resume with MXNet's own CheckpointHandler (the loss "
                "scale then restarts at its initial value), or start without resume_from_checkpoint"))

    def batch_end(self, estimator, *args, **kwargs):
        return self._saving(super().batch_end, estimator, *args, **kwargs)

    def epoch_end(self, estimator, *args, **kwargs):
        return self._saving(super().epoch_end, estimator, *args, **kwargs)

    def _position(self):
        """The newest checkpoint's prefix and the best value so far: what changes when the base class saves."""
        return (self.saved_checkpoints[-1] if self.saved_checkpoints else None), getattr(self, "best", None)

    def _saving(self, event, *args, **kwargs):
        """The base class's ``event``, then the state file beside each checkpoint it wrote."""
        before, best_before = self._position()
        stop = event(*args, **kwargs)
        newest, best = self._position()
        state = self.mp.state_dict()
        if newest is not None and newest != before:
            write_json(self.state_path(newest), state)
        if self.save_best and best != best_before:
            write_json(self.state_path(f"{self.model_prefix}-best"), state)
        return stop


class TensorBoardHandler(TrainBegin, BatchEnd, EpochEnd):
    """An Estimator's run in TensorBoard, through a :class:`mxfp16.TensorBoardLogger`.

    Every ``log_every`` batches the last step; after each epoch every metric (``epoch/<name>``) and the gradients.

    Parameters
    ----------
    logger : mxfp16.TensorBoardLogger
    log_every : int
    priority : float
        After Estimator's metric and validation handlers, so the epoch's
        metrics are complete.

    Raises
    ------
    ValueError
        At the start of ``fit``, without a :class:`MixedPrecisionProcessor` (pass a :class:`MixedPrecisionHandler`).
    """

    def __init__(self, logger, log_every=10, priority=1000):
        if not is_count(log_every):
            raise ValueError(f"log_every={log_every!r}: give the batches between two logged steps, a whole "
                             "number >= 1")
        self.logger, self.log_every, self.priority = logger, log_every, priority
        self.step = 0

    def train_begin(self, estimator, *args, **kwargs):
        # After MixedPrecisionHandler's train_begin (a lower priority), which installs the processor.
        if not isinstance(estimator.batch_processor, MixedPrecisionProcessor):
            raise ValueError("TensorBoardHandler reads the steps of a MixedPrecisionProcessor: pass "
                             "event_handlers=[MixedPrecisionHandler(mp), TensorBoardHandler(logger)] to fit()")
        self.step = 0

    def batch_end(self, estimator, *args, **kwargs):
        self.step += 1
        if self.step % self.log_every == 0:
            processor = estimator.batch_processor
            self.logger.log_step(self.step, processor.result, processor.mp, estimator.trainer)
        return False

    def epoch_end(self, estimator, *args, **kwargs):
        values = {}
        for metric in estimator.train_metrics + estimator.val_metrics:
            names, numbers = metric.get()
            names, numbers = (names, numbers) if isinstance(names, list) else ([names], [numbers])
            values.update(zip(names, numbers))
        self.logger.log_epoch(self.step, values)
        result = estimator.batch_processor.result
        if result is not None:
            self.logger.log_gradients(estimator.net, self.step, result.loss_scale)
        self.logger.flush()
        return False


def _check_devices(estimator, mp):
    if list(estimator.context) != list(mp.ctx):
        raise ValueError(f"the Estimator runs on {estimator.context} but the MixedPrecision on {mp.ctx}: build the "
                         "Estimator with context=mp.ctx")
