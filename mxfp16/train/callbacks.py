"""What the trainer hangs on the epoch loop (each a :class:`~mxfp16.train.loop.Callback`): progress bar, Ctrl-C."""
import contextlib
import signal
import time
from pathlib import Path

from tqdm.auto import tqdm

from ..diagnostics.tensorboard import TensorBoardLogger, tensorboard_available
from ..distributed.heartbeat import beat
from ..float_formats import format_scale
from .config import ConfigError
from .loop import Callback

__all__ = ["ProgressBar", "StopOnSignal", "AgreedStop", "Heartbeat", "TensorBoard", "tensorboard_folder",
           "open_tensorboard", "CALLBACKS_VARIABLE", "callbacks_from_environment"]


class ProgressBar(Callback):
    """A tqdm bar per epoch: batches done, running loss, images/s and the loss scale.

    Parameters
    ----------
    epochs, steps_per_epoch : int
    scaler : LossScaler
        Read for its scale when the numbers are read (no extra sync).
    workers : int
        Workers of the job: images/s counts all of them.
    enabled : bool
        ``False``: no bar (``--no-progress``, or a rank other than 0).
    """

    def __init__(self, epochs, steps_per_epoch, scaler, workers=1, enabled=True):
        self.epochs, self.steps, self.scaler, self.workers, self.enabled = (epochs, steps_per_epoch, scaler, workers,
                                                                            enabled)
        self._bar, self._tic = None, 0.0

    def on_epoch_begin(self, progress):
        self._bar = tqdm(total=self.steps, initial=progress.batch, desc=f"epoch {progress.epoch + 1}/{self.epochs}",
                         unit="batch", leave=False, dynamic_ncols=True, disable=True if not self.enabled else None)
        self._tic = time.perf_counter() - progress.sums.train_seconds

    def on_step_end(self, progress, result):
        self._bar.update(1)

    def on_read(self, progress):
        sums = progress.sums
        elapsed = max(time.perf_counter() - self._tic, 1e-9)
        self._bar.set_postfix(loss=f"{sums.loss_sum / max(sums.images, 1):.4f}",
                              img_s=f"{sums.seen * self.workers / elapsed:.1f}",
                              loss_scale=format_scale(self.scaler.scale), refresh=False)

    def on_epoch_end(self, progress):
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class StopOnSignal(Callback):
    """Turn the first Ctrl-C or SIGTERM into a request to stop after the current step; a second one aborts.

    Stopping between steps keeps parameters, optimizer state and loss scale consistent for the checkpoint then
    written. A context manager; outside the main thread it installs nothing. ``requested``: the signal's name.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    #: What a process stopped by each signal exits with (128 + the signal number, the shell's convention).
    EXIT_STATUS = {"SIGINT": 130, "SIGTERM": 143}

    def __init__(self, say=print):
        self.requested, self._say, self._previous = None, say, {}

    def _handle(self, signum, frame):
        if self.requested is not None:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        what = "Ctrl-C" if signum == signal.SIGINT else self.requested
        self._say(f"{what}: stopping after this step and writing a checkpoint (a second one aborts without one)")

    def __enter__(self):
        for sig in self.SIGNALS:
            with contextlib.suppress(ValueError):  # not the main thread
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def stop_requested(self, progress):
        return self.requested is not None


class AgreedStop(Callback):
    """Stop a job's workers together: each read of the loop's numbers votes (``StopVote``) with ``signals``' request."""

    def __init__(self, signals, vote):
        self.signals, self.vote, self.agreed = signals, vote, False

    def on_read(self, progress):
        # Every worker reads at the same steps (the same log_every, the same batches per epoch).
        self.agreed = self.agreed or self.vote.agree(self.signals.requested is not None)

    def stop_requested(self, progress):
        return self.agreed


class Heartbeat(Callback):
    """Tell ``mxfp16 launch`` this worker makes progress (:mod:`mxfp16.distributed.heartbeat`; else nothing)."""

    def __init__(self, rank):
        self.rank = rank

    def on_read(self, progress, result=None):
        beat(self.rank, f"epoch {progress.epoch + 1} step {progress.global_step}")

    on_step_end = on_read


class TensorBoard(Callback):
    """The run's numbers as TensorBoard events (:class:`~mxfp16.diagnostics.tensorboard.TensorBoardLogger`).

    It reads nothing from the device in a step: it logs at each read of the queued numbers and after each epoch.
    """

    def __init__(self, logger, parts, workers=1):
        self.logger, self.parts, self.workers = logger, parts, workers
        self._mark = None
        self._scale = parts.scaler.scale  # of the last step: the gradients in memory are multiplied by it

    @staticmethod
    def _position(progress):
        sums = progress.sums
        return sums.images, sums.loss_sum, sums.seen, time.perf_counter()

    def on_epoch_begin(self, progress):
        self._mark = self._position(progress)

    def on_step_end(self, progress, result):
        self._scale = result.loss_scale

    def on_read(self, progress):
        now = self._position(progress)
        images, loss_sum, seen, seconds = (b - a for a, b in zip(self._mark, now))
        if not seen:
            return
        self._mark = now
        scaler = self.parts.scaler
        self.logger.log_training(progress.global_step, loss=loss_sum / images if images else None,
                                 lr=float(self.parts.trainer.learning_rate), loss_scale=scaler.scale,
                                 skipped_steps=scaler.skipped_steps,
                                 images_per_second=seen * self.workers / seconds if seconds > 0 else None)

    def on_epoch_end(self, progress):
        self.logger.flush()

    def on_epoch_record(self, progress, record):
        self.logger.log_epoch(progress.global_step, record)
        self.logger.log_gradients(self.parts.net, progress.global_step, self._scale)
        self.logger.flush()


def tensorboard_folder(config):
    """Where the run's TensorBoard events go: ``--tensorboard``, else ``<out>/tensorboard`` with tensorboardX;
    ``None`` when off."""
    if not config.tensorboard:
        return None
    if config.tensorboard_dir is not None:
        return Path(config.tensorboard_dir)
    return Path(config.out) / "tensorboard" if tensorboard_available() else None


@contextlib.contextmanager
def open_tensorboard(run):
    """The run's :class:`TensorBoard` callback while it trains (``None`` when off, or on a rank other than 0).

    It starts with ``config.json`` as text; steps a resumed run logged after its checkpoint are hidden
    (``purge_step``), as they are logged again.
    """
    folder = tensorboard_folder(run.config) if run.cluster.rank == 0 else None
    if folder is None:
        yield None
        return
    step = run.progress.global_step
    with TensorBoardLogger(folder, purge_step=step + 1 if step else 0) as logger:
        logger.log_config(run.outputs.read_config() or run.config.to_dict(), step)
        yield TensorBoard(logger, run.parts, run.cluster.num_workers)


#: ``module:function`` whose ``function(run)`` returns callbacks for every run of this process
#: and of the workers it launches (the command line's way to add a callback; the test suite
#: injects faults with it, tests/fault_injection.py).
CALLBACKS_VARIABLE = "MXFP16_TRAIN_CALLBACKS"


def callbacks_from_environment(run, environ=None):
    """The callbacks ``$MXFP16_TRAIN_CALLBACKS`` (``module:function``) builds for ``run``; none when unset.

    Raises
    ------
    ConfigError
        The variable is malformed, or its module or function cannot be loaded.
    """
    import importlib
    import os

    spec = (os.environ if environ is None else environ).get(CALLBACKS_VARIABLE, "").strip()
    if not spec:
        return []
    module_name, _, function_name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigError(f"{CALLBACKS_VARIABLE}={spec!r} cannot be loaded ({err}); it names module:function, "
                          "importable from PYTHONPATH, whose function(run) returns a list of callbacks") from None
    return list(factory(run))
