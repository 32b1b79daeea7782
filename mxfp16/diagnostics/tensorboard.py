"""TensorBoard events for a mixed-precision run, under tag names that do not depend on the precision.

:class:`TensorBoardLogger` writes the loss scale, the skipped steps and the gradients' binary exponents beside the
usual loss, learning rate, speed and accuracy, with tensorboardX, for a loop of your own, ``mxfp16 train`` and MXNet's
Estimator. docs/training.md (``tensorboard/``) lists the tags; docs/porting-gluoncv.md ("TensorBoard") shows a loop.
"""
import importlib.util
import json
import math
import os
import time

import numpy as np

from .._lazy import module

mx = module("mxnet")

__all__ = ["TensorBoardLogger", "TensorBoardUnavailableError", "tensorboard_available", "STEP_TAGS", "EXPONENTS",
           "INSTALL_HINT"]

#: The per-step values :meth:`TensorBoardLogger.log_training` takes, and their tags.
STEP_TAGS = {"loss": "train/loss", "lr": "train/lr", "loss_scale": "precision/loss_scale",
             "skipped_steps": "precision/skipped_steps", "images_per_second": "speed/images_per_second"}
#: The binary exponents of float32's non-zero finite magnitudes, subnormals included: one histogram bucket each.
EXPONENTS = np.arange(-149, 128)
#: How to get the writer.
INSTALL_HINT = "pip install 'mxfp16[tensorboard]' (or pip install tensorboardX)"


class TensorBoardUnavailableError(ImportError):
    """tensorboardX, which writes the event files, is not installed."""


def tensorboard_available():
    """Whether tensorboardX can be imported (without importing it)."""
    return importlib.util.find_spec("tensorboardX") is not None


class TensorBoardLogger:
    """Write a run's numbers as TensorBoard event files in ``logdir``.

    Parameters
    ----------
    logdir : str or Path
        The folder of this run's event files (one per run); created when missing.
    purge_step : int, optional
        Hide what earlier writers left in ``logdir`` from this step on (a resumed run's first step; 0 on restart).
    flush_secs : float
        How often the writer's thread flushes to disk.

    Raises
    ------
    TensorBoardUnavailableError
        tensorboardX is not installed.
    """

    def __init__(self, logdir, purge_step=None, flush_secs=30):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise TensorBoardUnavailableError(f"writing TensorBoard events needs tensorboardX: {INSTALL_HINT}") \
                from None
        self.logdir = str(logdir)
        # tensorboardX names a file by the second it was opened, and a second writer in that second would
        # truncate the first's file; TensorBoard reads a folder's files in name order, which this suffix keeps.
        suffix = f".{time.time_ns() % 10 ** 9:09d}.{os.getpid()}"
        self._writer = SummaryWriter(self.logdir, purge_step=purge_step, flush_secs=flush_secs,
                                     filename_suffix=suffix)
        self._previous = None  # (step, time) of the last log_step(), for images per second

    def log_training(self, step, loss=None, lr=None, loss_scale=None, skipped_steps=None, images_per_second=None):
        """The per-step scalars, from numbers already on the host (no device read here).

        Parameters
        ----------
        step : int
        loss, lr, loss_scale, skipped_steps, images_per_second : float, optional
            Written under :data:`STEP_TAGS`; ``None``, inf and NaN are left out (a skipped step's loss is inf).
        """
        for tag, value in zip(STEP_TAGS.values(), (loss, lr, loss_scale, skipped_steps, images_per_second)):
            if value is not None and math.isfinite(value):
                self._writer.add_scalar(tag, float(value), step)

    def log_step(self, step, result, mp, trainer=None):
        """One step of a loop of your own, from its :class:`~mxfp16.StepResult`.

        Reads ``result.loss``: one host wait (call it every N steps to wait once per N). Images per second count this
        step's batch for each step since the previous call.

        Parameters
        ----------
        step : int
        result : StepResult
        mp : MixedPrecision
            For the loss scale and the skipped steps (its scaler's).
        trainer : gluon.Trainer, optional
            For the learning rate.
        """
        loss = None if result.skipped else float(result.loss.item())
        now, speed = time.perf_counter(), None
        if self._previous is not None and step > self._previous[0] and now > self._previous[1]:
            speed = _batch_images(result) * (step - self._previous[0]) / (now - self._previous[1])
        self._previous = (step, now)
        self.log_training(step, loss=loss, lr=None if trainer is None else float(trainer.learning_rate),
                          loss_scale=mp.scaler.scale, skipped_steps=mp.scaler.skipped_steps,
                          images_per_second=speed)

    def log_epoch(self, step, values):
        """Each number of ``values`` as ``epoch/<name>`` (spaces become ``_``); ``None``, inf and NaN are left out."""
        for name, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self._writer.add_scalar(f"epoch/{name.replace(' ', '_')}", float(value), step)

    def log_gradients(self, net, step, loss_scale=1.0):
        """Histograms of the binary exponents of ``net``'s parameter gradients as they are now (the last step's).

        Divided by ``loss_scale``, the scale of the step that made them. A magnitude within a rounding of ``2**k`` may
        count in the next binade; zeros, inf and NaN in none (``gradients/zero_fraction``).

        Parameters
        ----------
        net : gluon.Block
        step : int
        loss_scale : float
        """
        prefix = net.prefix
        names, rows, elements = [], [], 0
        for name, param in sorted(net.collect_params().items()):
            if param.grad_req == "null":
                continue
            grad = param.list_grad()[0]
            rows.append(_exponent_counts(grad, loss_scale).as_in_context(mx.cpu()))
            elements += grad.size
            # The network's prefix carries a per-process counter: without it the tags match across runs.
            names.append(name[len(prefix):] if name.startswith(prefix) else name)
        if not rows:
            return
        table = mx.nd.stack(*rows).asnumpy()  # the one host read
        for name, row in [("all", table.sum(axis=0))] + list(zip(names, table)):
            histogram = _exponent_histogram(row[:-1])
            if histogram is not None:
                self._writer.add_histogram_raw(f"gradients/{name}", global_step=step, **histogram)
        self._writer.add_scalar("gradients/zero_fraction", float(table[:, -1].sum()) / elements, step)

    def log_config(self, config, step=0):
        """The run's configuration (a dict) as the text ``config``, JSON in a code block."""
        self._writer.add_text("config", "```\n" + json.dumps(config, indent=2, sort_keys=True, default=str) + "\n```",
                              step)

    def flush(self):
        """Write what is queued to the event file now."""
        self._writer.flush()

    def close(self):
        """Flush and close the event file."""
        self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"TensorBoardLogger({self.logdir!r})"


def _batch_images(result):
    """The samples of the step's batch: the first dimension of each device's (first) output."""
    def first(out):
        return first(out[0]) if isinstance(out, (tuple, list)) else out

    return sum(first(out).shape[0] for out in result.outputs)


def _exponent_counts(grad, loss_scale):
    """Per binary exponent of float32 (:data:`EXPONENTS`), how many of ``|grad| / loss_scale`` have it; then the
    exact zeros. A float64 NDArray on ``grad``'s device, nothing read."""
    if isinstance(grad, mx.np.ndarray):
        grad = grad.as_nd_ndarray()
    work = grad.reshape((-1,)).astype("float32")  # a copy: the gradient itself is left as it is
    if loss_scale != 1.0:
        work /= loss_scale
    mx.nd.abs(work, out=work)
    zeros = (work == 0).sum()
    # floor(log2|g|) is the binade's exponent; zeros give -inf and inf or NaN stay so: outside every bucket.
    mx.nd.floor(mx.nd.log2(work, out=work), out=work)
    # Python floats: numpy 2 prints its scalars as np.float64(...), which MXNet's parameter parser refuses.
    counts, _ = mx.nd.histogram(work, bins=len(EXPONENTS), range=(float(EXPONENTS[0]) - 0.5,
                                                                 float(EXPONENTS[-1]) + 0.5))
    return mx.nd.concat(counts.astype("float64"), zeros.reshape((1,)).astype("float64"), dim=0)


def _exponent_histogram(counts):
    """``add_histogram_raw``'s arguments for counts per :data:`EXPONENTS`, empty ends dropped; ``None`` if all are."""
    filled = np.flatnonzero(counts)
    if not len(filled):
        return None
    counts = np.asarray(counts[filled[0]:filled[-1] + 1], dtype=np.float64)
    lower = EXPONENTS[filled[0]:filled[-1] + 1].astype(np.float64)
    centres = lower + 0.5
    return {"min": float(lower[0]), "max": float(lower[-1] + 1), "num": float(counts.sum()),
            "sum": float((centres * counts).sum()), "sum_squares": float((centres ** 2 * counts).sum()),
            "bucket_limits": (lower + 1).tolist(), "bucket_counts": counts.tolist()}
