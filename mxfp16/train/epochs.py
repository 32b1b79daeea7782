"""What :func:`mxfp16.train.run.fit` does around its epochs: describe, close each epoch, checkpoint, summarise."""
import itertools
import math
import time

from .._internals import trainer_params
from ..devices import format_ctx
from ..diagnostics.tensorboard import INSTALL_HINT
from ..distributed import average_aux_states, grad_bytes_per_step
from ..distributed.heartbeat import beating
from ..float_formats import format_scale
from ..machine.environment import mxnet_threads
from ..machine.hardware import peak_memory_mb
from ..plumbing.output import shown
from . import checkpoint as ckpt
from .callbacks import tensorboard_folder
from .loop import evaluate
from .outputs import params_digest

__all__ = ["describe", "epoch_line", "finish_epoch", "missing_marked", "save_checkpoint", "stopped_message",
           "summarise"]


def finish_epoch(run):
    """Average BatchNorm statistics, evaluate, write the epoch's record and a checkpoint."""
    config, progress, parts = run.config, run.progress, run.parts
    average_aux_states(parts.trainer, run.cluster.kvstore, run.cluster.num_workers)
    tic = time.perf_counter()
    test = beating(itertools.islice(run.loaders.test_batches(), config.max_batches), run.cluster.rank)
    val_top1, val_top5 = evaluate(parts, test, len(run.loaders.classes))
    sums = progress.sums
    record = missing_marked({
        "epoch": progress.epoch + 1,
        "train_loss": sums.loss_sum / sums.images if sums.images else float("nan"),
        "train_top1": sums.correct / sums.images if sums.images else float("nan"),
        "val_top1": val_top1, "val_top5": val_top5,
        "images_per_second": sums.seen * run.cluster.num_workers / sums.train_seconds if sums.train_seconds else 0.0,
        "loss_scale": parts.scaler.scale,
        # counted once, by the loss scaler: its skips since this epoch's first step
        "skipped_steps": sum(1 for n in parts.scaler.skipped_at if n >= progress.epoch_first_step),
        "lr": float(parts.trainer.learning_rate), "seconds": sums.train_seconds + time.perf_counter() - tic})
    progress.epoch_finished(record, peak_memory_mb(parts.ctx))
    save_checkpoint(run)
    run.outputs.write_metrics(progress.metrics)  # after the checkpoint, which holds the same records
    run.say(epoch_line(record, config.epochs))


def missing_marked(record):
    """``record`` with every metric that is not a finite number (``0/0``: every step skipped) set to ``None``:
    JSON has no NaN, and one would fail the record's and the checkpoint's write and lose the epoch."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


def _number(value, spec):
    return "n/a" if value is None else format(value, spec)


def epoch_line(record, epochs):
    """The line the trainer prints after an epoch, from its metrics record (the loss scale exact: 16777216)."""
    return (f"epoch {record['epoch']}/{epochs}: train_loss {_number(record['train_loss'], '.4f')} "
            f"train_top1 {_number(record['train_top1'], '.3f')} val_top1 {_number(record['val_top1'], '.3f')} "
            f"val_top5 {_number(record['val_top5'], '.3f')}"
            f" | {record['images_per_second']:.1f} img/s, loss scale {format_scale(record['loss_scale'])}, skipped "
            f"{record['skipped_steps']}, lr {record['lr']:.4g}, {record['seconds']:.1f} s")


def save_checkpoint(run):
    """Checkpoint the run's current position (rank 0 only: every worker holds the same parameters)."""
    if run.cluster.rank == 0:
        ckpt.write_checkpoint(run.config.out, run.parts, run.progress, run.fingerprint(), run.config.digest(),
                             keep=run.config.keep_checkpoints)


def stopped_message(run, err):
    """Why training stopped, and what the last good checkpoint is."""
    record = ckpt.read_record(run.config.out) if run.cluster.rank == 0 else None
    keep = (f"the last good checkpoint ({run.config.out}/checkpoints, {record['tag']}) is kept; "
            "--resume continues from it" if record else "no checkpoint was written yet")
    return (f"training stopped at step {err.step}, epoch {err.epoch + 1}: {err}. {keep}. Lower --lr, add "
            "--clip-grad-norm, or check the data; in float16, `mxfp16 diagnose` shows which layers overflow")


def describe(run):
    """Log what is about to run: data, model, precision, devices, environment, optimizer."""
    c, loaders, parts, cluster = run.config, run.loaders, run.parts, run.cluster
    data = f"demo set {run.source}" if c.data_dir is None else f"{c.pipeline} {run.source}"
    shard = f" (shard {cluster.rank} of {cluster.num_workers})" if cluster.num_workers > 1 else ""
    run.say(f"data: {data}: {len(loaders.classes)} classes, {loaders.num_train} training images{shard}, "
            f"{loaders.num_test} test images, {c.image_size} px, batch {c.batch_size}")
    if loaders.skipped:
        listed = "; ".join(f"{shown(path)} ({reason})" for path, reason in loaders.skipped[:5])
        more = f" and {len(loaders.skipped) - 5} more" if len(loaders.skipped) > 5 else ""
        run.say(f"data: skipped {len(loaders.skipped)} unusable file(s): {listed}{more}")
    if c.profile == "demo" and run.profile_fields & {"model", "image_size"}:
        run.say(f"demo profile: {', '.join(f'{k} {getattr(c, k)}' for k in sorted(run.profile_fields))} "
                "(a CPU-sized choice, see `mxfp16 train --help`); flags override each")
    rank = f" (rank {cluster.rank} of {cluster.num_workers})" if cluster.distributed else ""
    run.say(f"model: {c.model}{' (pretrained features)' if c.pretrained else ''}; precision {parts.precision}; "
            f"loss scale {parts.scaler!r}; devices {format_ctx(parts.ctx)}; kvstore {c.kvstore}{rank}")
    if parts.precision.requested != parts.precision.name:
        run.say(f"precision: {parts.precision.requested} -> {parts.precision.name}: {parts.precision.reason}")
    run.say(f"threads: MXNet runs {mxnet_threads()} OpenMP thread(s); --threads or OMP_NUM_THREADS change it")
    run.say("environment: " + "; ".join(f"{k}={v} ({why}{'' if here else ', set by you'})"
                                        for k, (v, why, here) in parts.environment.items()))
    momentum = f"momentum {c.momentum:g}, " if hasattr(parts.trainer.optimizer, "momentum") else ""
    run.say(f"optimiser: {c.optimizer} lr {c.lr:g} ({c.lr_schedule}, {c.warmup_epochs} warm-up epochs), "
            f"{momentum}wd {c.wd:g}, label smoothing {c.label_smoothing:g}; {c.epochs} epochs of "
            f"{run.steps_per_epoch} steps; outputs in {c.out}")
    board = tensorboard_folder(c)
    run.say(f"tensorboard: events in {board} (tensorboard --logdir {board.parent})" if board else
            "tensorboard: off" + ("" if not c.tensorboard else f" (tensorboardX is not installed: {INSTALL_HINT})"))


def summarise(run):
    """Write ``summary.json`` (and a per-rank summary in a job) and return the summary."""
    config, progress, parts, cluster = run.config, run.progress, run.parts, run.cluster
    records = progress.metrics
    digest = params_digest(parts.net)
    speeds = [r["images_per_second"] for r in records]
    # The first epoch includes graph construction and first-touch allocation.
    steady = speeds[1:] if len(speeds) > 1 else speeds
    summary = {
        "precision": parts.precision.name, "model": config.model, "epochs": len(records),
        "final_val_top1": records[-1]["val_top1"] if records else None,
        "best_val_top1": max((r["val_top1"] for r in records if r["val_top1"] is not None), default=None),
        "images_per_second": sum(steady) / len(steady) if steady else None,
        "peak_memory_mb": max(progress.peak_memory_mb, peak_memory_mb(parts.ctx)),
        "skipped_steps": parts.scaler.skipped_steps, "final_loss_scale": parts.scaler.scale, "params_digest": digest,
        "requested_precision": parts.precision.requested, "image_size": config.image_size,
        "batch_size": config.batch_size, "final_val_top5": records[-1]["val_top5"] if records else None,
        "seconds": sum(r["seconds"] for r in records), "num_workers": cluster.num_workers, "threads": mxnet_threads(),
    }
    run.outputs.write_summary(summary)
    run.outputs.write_rank_summary({
        "rank": cluster.rank, "num_workers": cluster.num_workers, "precision": parts.precision.name,
        "params_digest": digest, "grad_bytes_pushed_per_step": grad_bytes_per_step(trainer_params(parts.trainer)),
        "skipped_steps": parts.scaler.skipped_steps, "skipped_step_numbers": list(parts.scaler.skipped_at),
        "steps": progress.global_step,
    })
    if records:
        run.say(f"done: {summary['epochs']} epochs, val_top1 {_number(summary['final_val_top1'], '.3f')} "
                f"(best {_number(summary['best_val_top1'], '.3f')}), {summary['images_per_second']:.1f} img/s, "
                f"peak memory {summary['peak_memory_mb']:.0f} MB, {summary['skipped_steps']} skipped steps; "
                f"summary in {config.out}/summary.json")
    return summary
