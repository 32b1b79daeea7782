"""The reference training run: epochs of :func:`mxfp16.train_step`, evaluation, outputs.

Read :meth:`Run.fit` top to bottom: for each epoch, train over the batches,
evaluate, write a metrics record and a checkpoint. :class:`Run`'s
constructor is the set-up story: configuration, devices, precision, data,
model, loss scaler, trainer, and (with ``resume``) the checkpoint.

Host synchronisation in the training loop, and why each is there:

* the step itself, only with an enabled loss scaler: one read of the
  overflow flag per step (see :func:`mxfp16.train_step`);
* every ``log_every`` steps, one read of the queued losses and correct
  counts (one ``asnumpy`` of a small concatenation): the progress bar, the
  epoch's sums and the non-finite-loss check need numbers;
* at the end of an epoch, ``waitall`` so the epoch's time includes its
  queued work, then the evaluation (which reads its metric per batch).
"""
import hashlib
import json
import math
import random
import signal
import time
from dataclasses import asdict, dataclass

import mxnet as mx
import numpy as np
from tqdm.auto import tqdm

from .. import cast_batch, cast_net, make_loss_scaler, make_trainer, train_step
from .._internals import trainer_params
from ..casting import to_float32
from ..models import build_model
from ..precision import activate, as_context_list, resolve_precision
from ..scaler import LossScaleDivergedError
from . import checkpoint as ckpt
from .config import ConfigError, TrainConfig
from .outputs import RunOutputs, params_digest, peak_memory_mb, structural_names
from .setup import (Objective, check_devices, compression_params, grad_bytes_per_step, lr_schedule, open_kvstore,
                    optimizer_params, set_float16_environment)

__all__ = ["train", "Run", "TrainingDivergedError", "TrainingInterrupted"]


class TrainingDivergedError(FloatingPointError):
    """The loss became NaN/inf (without a loss scaler), or the loss scale diverged."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or the ``interrupt_at_step`` testing aid): a checkpoint was written first."""


@dataclass
class EpochSums:
    """Running sums of one epoch; saved in a mid-epoch checkpoint so a resumed epoch reports the whole epoch."""

    loss_sum: float = 0.0
    correct: float = 0.0
    images: int = 0            # images of the steps that updated the parameters
    seen: int = 0              # every image fed to the network this epoch
    train_seconds: float = 0.0
    skipped_at_start: int = 0  # the scaler's skipped_steps when the epoch began


class _StopOnCtrlC:
    """Turn the first Ctrl-C into a request to stop after the current step.

    Stopping between steps keeps the parameters, the optimizer state and the
    loss scale consistent for the checkpoint; a second Ctrl-C aborts at once.
    Outside the main thread (where signals cannot be handled) this does nothing.
    """

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        tqdm.write("Ctrl-C: stopping after this step and writing a checkpoint (Ctrl-C again aborts without one)")

    def __enter__(self):
        try:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:
            self._previous = None
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


@dataclass
class _Pending:
    step: int
    loss: object
    correct: list
    images: int
    skipped: bool


def train(config, log=None):
    """Train a network as ``mxfp16 train`` does and return the summary.

    Parameters
    ----------
    config : TrainConfig or dict
        ``None`` fields are filled from the demo or data-set profile.
    log : callable, optional
        Receives each log line (default: printed above the progress bar).

    Returns
    -------
    dict
        The contents of ``summary.json`` (``precision``, ``model``, ``epochs``,
        ``final_val_top1``, ``best_val_top1``, ``images_per_second``,
        ``peak_memory_mb``, ``skipped_steps``, ``final_loss_scale``,
        ``params_digest`` and a few more).

    Raises
    ------
    ConfigError, mxfp16.PrecisionError, mxfp16.data.DataError, mxfp16.models.ModelError
        Bad input, before anything is written.
    checkpoint.CheckpointError
        ``resume`` without a checkpoint, or one from a different run.
    TrainingDivergedError
        NaN/inf loss or a diverged loss scale; the last good checkpoint stays.
    TrainingInterrupted
        Ctrl-C; a checkpoint of the current position was written.
    """
    if isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    return Run(config.resolve(), log=log, from_profile=config.open_fields()).fit()


class Run:
    """One training run, set up from a resolved :class:`TrainConfig`."""

    def __init__(self, config, log=None, from_profile=()):
        from ..data import demo_dataset, make_loaders

        self.config = config
        self._from_profile = set(from_profile)
        self._log = log or tqdm.write
        self.ctx = check_devices(as_context_list(config.ctx))
        self.environment = set_float16_environment()
        self.precision = resolve_precision(config.precision, self.ctx, allow_cpu_float16=config.allow_cpu_float16)
        compression = compression_params(config, self.precision)
        self.kvstore, self.rank, self.num_workers = open_kvstore(config.kvstore)
        self.distributed = self.num_workers > 1 or config.kvstore.startswith("dist")
        self.outputs = RunOutputs(config.out, self.rank, self.distributed)
        if self.outputs.has_run() and not config.resume and self.rank == 0:
            if not config.overwrite:
                raise ConfigError(f"{config.out} already holds a run; continue it with --resume, replace it with "
                                  "--overwrite, or choose another --out")
            self.outputs.remove_run()
        activate(self.precision)  # AMP patches MXNet: before the network exists
        mx.random.seed(config.seed)
        np.random.seed(config.seed)
        random.seed(config.seed)

        self.source = config.data_dir or str(demo_dataset(config.data_root))
        self.loaders = make_loaders(self.source, image_size=config.image_size, batch_size=config.batch_size,
                                    workers=config.workers, pipeline=config.pipeline, seed=config.seed,
                                    shard=(self.rank, self.num_workers))
        self.classes = len(self.loaders.classes)
        self.steps_per_epoch = self.loaders.train_batches_per_epoch
        if config.max_batches:
            self.steps_per_epoch = min(self.steps_per_epoch, config.max_batches)

        self.net = build_model(config.model, self.classes, config.pretrained, self.ctx,
                               in_shape=(3, config.image_size, config.image_size))
        cast_net(self.net, self.precision.param_dtype)
        self.net.hybridize(static_alloc=True, static_shape=True)
        self.scaler = make_loss_scaler(config.loss_scale, self.precision)
        self.trainer = make_trainer(
            self.net.collect_params(), config.optimizer, optimizer_params(config, lr_schedule(config, self.steps_per_epoch)),
            self.precision, self.scaler, kvstore=self.kvstore,
            # Updates run here, not on parameter servers: the skip decision, the LR schedule and
            # the optimizer state (master weights) stay with the worker and its checkpoint.
            update_on_kvstore=False if self.distributed else None,
            compression_params=compression)
        self.objective = Objective(self.classes, config.label_smoothing)

        self.global_step = 0
        self.skipped_step_numbers = []
        self.start_epoch, self.start_batch, self.partial = 0, 0, None
        self.peak_memory_mb = 0.0
        if config.resume:
            self._resume()
        if self.distributed:
            from ..dist import sync_parameters

            sync_parameters(self.trainer)  # every worker starts from rank 0's parameters (see mxfp16.dist.sync)
        self.outputs.write_config(dict(config.to_dict(), resolved_precision=self.precision.name,
                                       classes=self.loaders.classes, source=self.source))

    # ---- set-up helpers ---------------------------------------------------
    def fingerprint(self):
        """What a checkpoint must match to continue this run (see :data:`checkpoint.FINGERPRINT_FIELDS`)."""
        shapes = [(name, list(p.shape), np.dtype(p.dtype).name) for name, p in structural_names(self.net).items()]
        return {
            "model": self.config.model, "precision": self.precision.name, "param_dtype": self.precision.param_dtype,
            "image_size": self.config.image_size, "classes": self.loaders.classes,
            "batch_size": self.config.batch_size, "num_workers": self.num_workers,
            "parameters": hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16],
        }

    def _resume(self):
        record = ckpt.load_checkpoint(self.config.out, self.net, self.trainer, self.scaler, self.fingerprint(), self.ctx)
        position = record["position"]
        self.start_epoch, self.start_batch = position["epoch"], position["batch"]
        self.global_step = position["global_step"]
        self.partial = EpochSums(**record["partial"]) if record.get("partial") else None
        self.skipped_step_numbers = list(record.get("skipped_step_numbers", []))
        self.peak_memory_mb = float(record.get("peak_memory_mb", 0.0))
        self.outputs.keep_metrics_through(self.start_epoch)
        previous = self.outputs.read_config() or {}
        changed = [k for k, v in self.config.to_dict().items()
                   if k in previous and previous[k] != v and k not in ("resume", "interrupt_at_step")]
        if changed:
            self.log("resume: these settings differ from the original run: "
                     + ", ".join(f"{k} {previous[k]!r} -> {getattr(self.config, k)!r}" for k in changed))
        self.log(f"resuming {self.config.out} at epoch {self.start_epoch + 1}, batch {self.start_batch} "
                 f"(step {self.global_step}, loss scale {self.scaler.scale:g}, lr {self.trainer.learning_rate:.4g})")

    def log(self, message):
        if self.rank == 0:
            self._log(message)

    def _describe(self):
        c = self.config
        data = f"demo set {self.source}" if c.data_dir is None else f"{c.pipeline} {self.source}"
        self.log(f"data: {data}: {self.classes} classes, {self.loaders.num_train} training images"
                 f"{f' (shard {self.rank} of {self.num_workers})' if self.num_workers > 1 else ''}, "
                 f"{self.loaders.num_test} test images, {c.image_size} px, batch {c.batch_size}")
        if self.loaders.skipped:
            shown = "; ".join(f"{path} ({reason})" for path, reason in self.loaders.skipped[:5])
            more = f" and {len(self.loaders.skipped) - 5} more" if len(self.loaders.skipped) > 5 else ""
            self.log(f"data: skipped {len(self.loaders.skipped)} unusable file(s): {shown}{more}")
        if c.profile == "demo" and self._from_profile & {"model", "image_size"}:
            self.log(f"demo profile: {', '.join(f'{k} {getattr(c, k)}' for k in sorted(self._from_profile))} "
                     "(a CPU-sized choice, see `mxfp16 train --help`); flags override each")
        self.log(f"model: {c.model}{' (pretrained features)' if c.pretrained else ''}; precision {self.precision}; "
                 f"loss scale {self.scaler!r}; devices {', '.join(str(x) for x in self.ctx)}; kvstore {c.kvstore}"
                 f"{f' (rank {self.rank} of {self.num_workers})' if self.distributed else ''}")
        self.log("environment: " + "; ".join(f"{k}={v} ({why}{'' if here else ', set by you'})"
                                             for k, (v, why, here) in self.environment.items()))
        momentum = f"momentum {c.momentum:g}, " if "momentum" in optimizer_params(c, None) else ""
        self.log(f"optimiser: {c.optimizer} lr {c.lr:g} ({c.lr_schedule}, {c.warmup_epochs} warm-up epochs), "
                 f"{momentum}wd {c.wd:g}, label smoothing {c.label_smoothing:g}; {c.epochs} epochs of "
                 f"{self.steps_per_epoch} steps; outputs in {c.out}")

    # ---- the run ----------------------------------------------------------
    def fit(self):
        """Train the remaining epochs; return the summary (also written to ``summary.json``)."""
        self._describe()
        with _StopOnCtrlC() as stop:
            for epoch in range(self.start_epoch, self.config.epochs):
                start_batch, sums = self.start_batch, self.partial
                self.start_batch, self.partial = 0, None
                sums = sums or EpochSums(skipped_at_start=self.scaler.skipped_steps)
                self._train_epoch(epoch, start_batch, sums, stop)
                self._average_aux_states()
                tic = time.time()
                val_top1, val_top5 = self.evaluate()
                record = self._record(epoch, sums, val_top1, val_top5, time.time() - tic)
                self.outputs.append_metrics(record)
                self._checkpoint(epoch + 1, 0, None)
                self.log(self._epoch_line(record))
        return self._finish()

    def _train_epoch(self, epoch, start_batch, sums, stop):
        c = self.config
        bar = tqdm(total=self.steps_per_epoch, initial=start_batch, desc=f"epoch {epoch + 1}/{c.epochs}",
                   unit="batch", leave=False, dynamic_ncols=True,
                   disable=True if (not c.progress or self.rank != 0) else None)
        pending = []
        tic = time.time()
        batch = start_batch
        try:
            for data, label in self.loaders.train_batches(epoch, start_batch):
                if batch >= self.steps_per_epoch:
                    break
                self.global_step += 1
                poison = c.inject_overflow_step == self.global_step and c.inject_overflow_rank in (None, self.rank)
                self.objective.start_step(poison)
                x, y = cast_batch(data, label, self.precision.data_dtype, self.ctx)
                try:
                    result = train_step(self.net, self.objective, self.trainer, x, y, self.scaler,
                                        batch_size=data.shape[0] * self.num_workers, clip_grad_norm=c.clip_grad_norm)
                except LossScaleDivergedError as err:
                    raise TrainingDivergedError(self._stopped_message(epoch, batch, str(err))) from None
                if result.skipped:
                    self.skipped_step_numbers.append(self.global_step)
                pending.append(_Pending(self.global_step, result.loss, list(self.objective.correct),
                                        data.shape[0], result.skipped))
                batch += 1
                bar.update(1)
                if len(pending) >= c.log_every:
                    self._flush(pending, sums, epoch, tic, bar)
                if stop.requested or c.interrupt_at_step == self.global_step:
                    self._flush(pending, sums, epoch, tic, bar)
                    mx.nd.waitall()
                    sums.train_seconds += time.time() - tic
                    self._checkpoint(epoch, batch, sums)
                    raise TrainingInterrupted(
                        f"interrupted at epoch {epoch + 1}, batch {batch} (step {self.global_step}); checkpoint "
                        f"written to {c.out}/checkpoints; continue with --resume --out {c.out}")
            self._flush(pending, sums, epoch, tic, bar)
            mx.nd.waitall()  # the epoch's time must include the work still queued
            sums.train_seconds += time.time() - tic
        finally:
            bar.close()

    def _flush(self, pending, sums, epoch, tic, bar):
        """Read the queued losses and correct counts in one host sync; check them; update the sums and the bar."""
        if not pending:
            return
        cpu = mx.cpu()
        devices = len(pending[0].correct)
        arrays = [p.loss.reshape((1,)) for p in pending] + [c.reshape((1,)) for p in pending for c in p.correct]
        values = mx.nd.concat(*[a.as_in_context(cpu).astype("float32") for a in arrays], dim=0).asnumpy()
        losses = values[:len(pending)]
        correct = values[len(pending):].reshape(len(pending), devices).sum(axis=1)
        for p, loss, right in zip(pending, losses, correct):
            sums.seen += p.images
            if p.skipped:
                continue  # a skipped step changed nothing; its loss may be inf by design
            if not math.isfinite(float(loss)):
                raise TrainingDivergedError(self._stopped_message(
                    epoch, None, f"the loss became {float(loss)} at step {p.step}", step=p.step))
            sums.loss_sum += float(loss) * p.images
            sums.correct += float(right)
            sums.images += p.images
        pending.clear()
        elapsed = time.time() - tic
        bar.set_postfix(loss=f"{sums.loss_sum / max(sums.images, 1):.4f}",
                        img_s=f"{sums.seen * self.num_workers / max(elapsed + sums.train_seconds, 1e-9):.1f}",
                        loss_scale=f"{self.scaler.scale:g}", refresh=False)

    def _stopped_message(self, epoch, batch, what, step=None):
        record = ckpt.read_record(self.config.out) if self.rank == 0 else None
        keep = (f"the last good checkpoint ({self.config.out}/checkpoints, {record['tag']}) is kept; "
                f"--resume continues from it" if record else "no checkpoint was written yet")
        where = f"step {step or self.global_step}, epoch {epoch + 1}" + (f", batch {batch + 1}" if batch is not None else "")
        return (f"training stopped at {where}: {what}. {keep}. Lower --lr, add --clip-grad-norm, or check the data; "
                "in float16, `mxfp16 diagnose` shows which layers overflow")

    def _average_aux_states(self):
        """Give every device and worker the same BatchNorm running statistics (their mean).

        They are not gradients, so nothing else keeps them in step; averaged,
        every worker holds identical parameters and evaluates the same network.
        """
        params = trainer_params(self.trainer)
        kv = self.kvstore if self.distributed and not isinstance(self.kvstore, str) else None
        for index, param in enumerate(params):
            if param.grad_req != "null":
                continue
            copies = param.list_data()
            if len(copies) == 1 and kv is None:
                continue
            first = copies[0]
            if len(copies) > 1:
                first[:] = mx.nd.add_n(*[c.as_in_context(first.context) for c in copies]) / len(copies)
            if kv is not None and self.num_workers > 1:
                kv.pushpull(index, first, out=first)  # the key Gluon initialised for this parameter; never pushed otherwise
                first /= self.num_workers
            for other in copies[1:]:
                first.copyto(other)

    def evaluate(self):
        """Top-1 and top-5 accuracy on the test split, BatchNorm in inference mode (no autograd recording)."""
        top1 = mx.metric.Accuracy()
        top5 = mx.metric.TopKAccuracy(top_k=min(5, self.classes)) if self.classes > 1 else mx.metric.Accuracy()
        for i, (data, label) in enumerate(self.loaders.test_batches()):
            if self.config.max_batches and i >= self.config.max_batches:
                break
            x, y = cast_batch(data, label, self.precision.data_dtype, self.ctx)
            outputs = [to_float32(self.net(part)) for part in x]
            top1.update(y, outputs)
            top5.update(y, outputs)
        return float(top1.get()[1]), float(top5.get()[1])

    def _record(self, epoch, sums, val_top1, val_top5, eval_seconds):
        self.peak_memory_mb = max(self.peak_memory_mb, peak_memory_mb(self.ctx))
        return {
            "epoch": epoch + 1,
            "train_loss": sums.loss_sum / sums.images if sums.images else float("nan"),
            "train_top1": sums.correct / sums.images if sums.images else float("nan"),
            "val_top1": val_top1,
            "val_top5": val_top5,
            "images_per_second": sums.seen * self.num_workers / sums.train_seconds if sums.train_seconds else 0.0,
            "loss_scale": self.scaler.scale,
            "skipped_steps": self.scaler.skipped_steps - sums.skipped_at_start,
            "lr": float(self.trainer.learning_rate),
            "seconds": sums.train_seconds + eval_seconds,
        }

    def _epoch_line(self, r):
        return (f"epoch {r['epoch']}/{self.config.epochs}: train_loss {r['train_loss']:.4f} train_top1 {r['train_top1']:.3f} "
                f"val_top1 {r['val_top1']:.3f} val_top5 {r['val_top5']:.3f} | {r['images_per_second']:.1f} img/s, "
                f"loss scale {r['loss_scale']:g}, skipped {r['skipped_steps']}, lr {r['lr']:.4g}, {r['seconds']:.1f} s")

    def _checkpoint(self, epoch, batch, sums):
        """Save the position "epoch index ``epoch``, next batch ``batch``" (rank 0 only).

        Tags count like people do: ``epoch-0003`` after three whole epochs,
        ``epoch-0003-batch-00017`` after 17 batches of the third.
        """
        if self.rank != 0:
            return
        tag = f"epoch-{epoch + 1:04d}-batch-{batch:05d}" if batch else f"epoch-{epoch:04d}"
        ckpt.save_checkpoint(self.config.out, tag, self.net, self.trainer, {
            "fingerprint": self.fingerprint(),
            "scaler": self.scaler.state_dict(),
            "position": {"epoch": epoch, "batch": batch, "global_step": self.global_step},
            "partial": asdict(sums) if sums is not None else None,
            "skipped_step_numbers": self.skipped_step_numbers,
            "peak_memory_mb": self.peak_memory_mb,
            "config_digest": self.config.digest(),
        })

    def _finish(self):
        records = self.outputs.metrics() if self.rank == 0 else []
        digest = params_digest(self.net)
        speeds = [r["images_per_second"] for r in records]
        # The first epoch includes graph construction and first-touch allocation.
        steady = speeds[1:] if len(speeds) > 1 else speeds
        summary = {
            "precision": self.precision.name,
            "model": self.config.model,
            "epochs": len(records),
            "final_val_top1": records[-1]["val_top1"] if records else None,
            "best_val_top1": max(r["val_top1"] for r in records) if records else None,
            "images_per_second": sum(steady) / len(steady) if steady else None,
            "peak_memory_mb": max(self.peak_memory_mb, peak_memory_mb(self.ctx)),
            "skipped_steps": self.scaler.skipped_steps,
            "final_loss_scale": self.scaler.scale,
            "params_digest": digest,
            "requested_precision": self.precision.requested,
            "image_size": self.config.image_size,
            "batch_size": self.config.batch_size,
            "final_val_top5": records[-1]["val_top5"] if records else None,
            "seconds": sum(r["seconds"] for r in records),
            "num_workers": self.num_workers,
        }
        self.outputs.write_summary(summary)
        self.outputs.write_rank_summary({
            "rank": self.rank, "num_workers": self.num_workers, "precision": self.precision.name,
            "params_digest": digest, "grad_bytes_pushed_per_step": grad_bytes_per_step(trainer_params(self.trainer)),
            "skipped_steps": self.scaler.skipped_steps, "skipped_step_numbers": self.skipped_step_numbers,
            "steps": self.global_step,
        })
        if summary["final_val_top1"] is not None:
            self.log(f"done: {summary['epochs']} epochs, val_top1 {summary['final_val_top1']:.3f} "
                     f"(best {summary['best_val_top1']:.3f}), {summary['images_per_second']:.1f} img/s, "
                     f"peak memory {summary['peak_memory_mb']:.0f} MB, {summary['skipped_steps']} skipped steps; "
                     f"summary in {self.config.out}/summary.json")
        return summary
