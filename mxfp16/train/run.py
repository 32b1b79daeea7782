"""A training run from start to finish: :func:`train` = :func:`prepare`, then :func:`fit`.

:func:`prepare` checks everything before it changes anything on disk: configuration, the run folder and its lock,
devices and precision, the kvstore, the data, the parts, and in a distributed job that every worker runs the same
settings; only then does ``--overwrite`` remove an old run, ``--resume`` load the checkpoint and ``config.json`` get
written. The run folder's lock and the data set's (shared) are held until :func:`fit` ends.
"""
import hashlib
import itertools
import json
import warnings
from dataclasses import dataclass, field, fields

import numpy as np

from ..devices import format_ctx, resolve_devices
from ..diagnostics.tensorboard import INSTALL_HINT, tensorboard_available
from ..distributed import StopVote, open_kvstore, sync_parameters
from ..distributed.agree import agree_settings, settings_fingerprint
from ..float_formats import format_scale
from ..machine.environment import check_threads, plan_threads
from ..mixed import MixedPrecision
from ..optim import check_compression, lr_schedule
from ..plumbing.fileio import JSONFileError
from ..plumbing.output import (
    Output,
    check_output_folder,
    check_output_path,
    read_lock,
    refusals_as,
)
from . import checkpoint as ckpt
from .callbacks import AgreedStop, Heartbeat, ProgressBar, StopOnSignal, callbacks_from_environment, open_tensorboard
from .config import ConfigError, TrainConfig
from .epochs import describe, finish_epoch, save_checkpoint, stopped_message, summarise
from .loop import TrainingDivergedError, train_epoch
from .outputs import RunOutputs, structural_names
from .parts import PartsSpec, build_parts
from .progress import Progress

__all__ = ["train", "prepare", "fit", "Run", "Cluster", "TrainingInterrupted", "TrainingDivergedError"]


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM (``exit_status`` 130 or 143): a checkpoint was written first."""

    def __init__(self, message, exit_status=130):
        super().__init__(message)
        self.exit_status = exit_status


@dataclass
class Cluster:
    """Who this process is in a kvstore job (one worker of one, without a dist kvstore)."""

    kvstore: object = "device"
    rank: int = 0
    num_workers: int = 1

    distributed = property(lambda self: self.num_workers > 1 or not isinstance(self.kvstore, str))


@dataclass
class Run:
    """What :func:`prepare` builds and :func:`fit` drives. Holding it does no I/O.

    Attributes
    ----------
    config : TrainConfig
    loaders : mxfp16.data.Loaders
        Or anything with ``train_batches(epoch, start_batch)``, ``test_batches()``, ``classes``, ``num_train``,
        ``num_test`` and ``skipped``.
    source, profile_fields : str, set of str
        Where the data came from and the fields the profile filled in (for the log and config.json).
    log : callable
        Receives each log line (rank 0 only).
    lock, data_lock : mxfp16.plumbing.output.Output, PathLock or None
        The run folder's lock (held by rank 0) and the data set's (shared); :func:`fit` releases both.
    """

    config: TrainConfig
    parts: object
    loaders: object
    outputs: RunOutputs
    steps_per_epoch: int
    cluster: Cluster = field(default_factory=Cluster)
    progress: Progress = field(default_factory=Progress)
    source: str = ""
    profile_fields: set = field(default_factory=set)
    log: object = print
    lock: object = None
    data_lock: object = None

    def say(self, message):
        if self.cluster.rank == 0:
            self.log(message)

    def fingerprint(self):
        """What a checkpoint must match to continue this run (see :data:`checkpoint.FINGERPRINT_FIELDS`)."""
        shapes = [(name, list(p.shape), np.dtype(p.dtype).name) for name, p in structural_names(self.parts.net).items()]
        return {
            "model": self.config.model, "precision": self.parts.precision.name,
            "param_dtype": self.parts.precision.param_dtype, "image_size": self.config.image_size,
            "classes": list(self.loaders.classes), "batch_size": self.config.batch_size,
            "num_workers": self.cluster.num_workers,
            "parameters": hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16],
        }


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
        The contents of ``summary.json`` (docs/training.md lists its fields).

    Raises
    ------
    ConfigError, mxfp16.PrecisionError, mxfp16.data.DataError, mxfp16.models.ModelError
        Bad input, before anything is written.
    checkpoint.CheckpointError
        ``resume`` without a checkpoint, or one from a different run.
    TrainingDivergedError, TrainingInterrupted
        NaN/inf loss or a diverged loss scale, or Ctrl-C; a checkpoint stays.
    """
    return fit(prepare(config, log=log))


def prepare(config, log=None, given=None, command=None):
    """Check and build everything a run needs; see the module docstring for the order.

    Parameters
    ----------
    config : TrainConfig or dict
        Unresolved (profile fields may be ``None``).
    log : callable, optional
    given : set of str, optional
        With ``resume``: the fields the user set for this invocation (the command line's flags); by default those
        that differ from their defaults. The rest come from the run's ``config.json``.
    command : str, optional
        Recorded in ``config.json`` (how to reproduce the run).

    Returns
    -------
    Run
    """
    from tqdm.auto import tqdm

    log = log or tqdm.write
    if isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    # Checked before anything is built, and again once --resume filled in the data set. Outside a parameter-server
    # job this process is the run's only writer: it locks the folder before reading it. In one, rank 0 is, and a
    # process learns its rank when the kvstore opens (_build).
    writer = _run_folder(config, lock=not str(config.kvstore).startswith("dist"))
    locks = [writer] if writer else []
    try:
        config, changes, saved, profile_fields = _check_settings(config, given, log)
        _check_tensorboard(config)
        run, facts = _build(config, saved, profile_fields, log, locks)
        _start(run, changes)
        _record(run, changes, facts, command)
    except BaseException:
        for lock in locks:
            lock.abandon()  # a refused run leaves no empty folder behind, and holds its data no more
        raise
    return run


def _run_folder(config, lock=True):
    """The run folder checked, and with ``lock`` locked for this process (an in-place ``Output``); else ``None``."""
    doing = ("resuming training" if config.resume else "replacing the run (--overwrite), then training"
             if config.overwrite else "training")
    output = Output(config.out, doing, inputs=_data_inputs(config), in_place=True)
    with refusals_as(ConfigError):
        return output.open() if lock else output.check()


def _check_settings(config, given, log):
    """The configuration to run with: resolved, and for ``--resume`` merged with the run's own."""
    config.check_resume_pair()
    changes = {}
    try:
        saved = RunOutputs(config.out).read_config()  # None when there is none
    except JSONFileError as err:
        if config.resume:
            raise ConfigError(str(err)) from None
        saved = {}  # present but unreadable: --overwrite replaces it, like any file a run writes
    if config.resume:
        if saved is None:
            if ckpt.read_record(config.out) is None:
                raise ckpt.CheckpointError(f"--resume: {config.out} holds no run (no config.json); run without "
                                           "--resume to start one, or point --out at the run to continue")
            # Its checkpoints are intact: continue with the flags given now; the checkpoint refuses another run's.
            log(f"resume: {config.out}/config.json is missing; continuing with the settings of this command line "
                "(the checkpoint refuses them if they are not the run's own) and writing config.json anew")
        else:
            config, changes = config.for_resume(saved, given)
    profile_fields = config.open_fields()
    config = config.resolve()
    # The writing rule again, for the data set --resume filled in. Links are resolved: a run folder linked into
    # the training split would make checkpoints/ a class there.
    with refusals_as(ConfigError):
        check_output_folder(config.out, _data_inputs(config))
    return config, changes, saved, profile_fields


def _data_inputs(config):
    """``(what, path)`` of the files and folders the run reads its data from (for the writing rule)."""
    from ..data.pipelines import classes_file, record_files
    from ..data.synth import demo_path

    if config.data_dir is None:
        return [("the demo set", demo_path(config.data_root))]
    if config.pipeline == "recordio":
        files = [*record_files(config.data_dir, "train"), *record_files(config.data_dir, "test"),
                 classes_file(config.data_dir)]
        return [("the data set's file", path) for path in files]
    return [("the data set", config.data_dir)]


def _check_tensorboard(config):
    """``--tensorboard DIR``: refused without tensorboardX, or where the run could not write it (as ``--out``)."""
    if config.tensorboard_dir is None or not config.tensorboard:
        return
    if not tensorboard_available():
        raise ConfigError(f"--tensorboard {config.tensorboard_dir}: writing TensorBoard events needs tensorboardX; "
                          f"{INSTALL_HINT}, or drop --tensorboard")
    with refusals_as(ConfigError):
        check_output_path(config.tensorboard_dir, flag="--tensorboard")
        check_output_folder(config.tensorboard_dir, _data_inputs(config), flag="--tensorboard")


def _build(config, saved, profile_fields, log, locks):
    """Devices, precision, the run folder's state, kvstore, threads, data and parts: checked, nothing removed.

    Rank 0 of a distributed job adds the run folder's lock to ``locks`` here; the data set's lock joins it.
    Returns the :class:`Run` and what ``config.json`` records of this process (threads, data).
    """
    if config.resume:  # a flag another run's checkpoint refuses is refused now, before auto times the network
        ckpt.check_known_settings(config.out, {
            "model": config.model, "image_size": config.image_size, "batch_size": config.batch_size,
            "precision": None if config.precision == "auto" else config.precision})
    ctx = resolve_devices(config.ctx)  # the one check of the devices; everything after takes this list
    mixed = _mixed_precision(config, ctx, saved, log)  # the one resolution of the precision
    compression = check_compression(config.gradient_compression, config.kvstore, mixed.precision)
    outputs = RunOutputs(config.out)
    if outputs.has_run() and not (config.resume or config.overwrite):
        lost = (" (its config.json is missing: --resume with the flags the run was started with continues it from "
                "its checkpoint, which checks them)" if saved is None else "")
        raise ConfigError(f"{config.out} already holds a run{lost}; continue it with --resume, replace it with "
                          "--overwrite (which deletes its checkpoints), or choose another --out")
    kvstore, rank, num_workers = open_kvstore(config.kvstore)
    cluster = Cluster(kvstore, rank, num_workers)
    outputs.join(rank, cluster.distributed)
    if not locks and rank == 0:  # the job's writer; the other ranks write only their own summary
        locks.append(_run_folder(config))

    threads = _check_thread_count(config)
    source, data_lock, loaders, fingerprint = _open_data(config, saved, (rank, num_workers), log)
    locks.append(data_lock)  # released with the run folder's if anything below refuses the run
    steps = min(loaders.train_batches_per_epoch, config.max_batches or loaders.train_batches_per_epoch)
    spec = PartsSpec(**{f.name: getattr(config, f.name) for f in fields(PartsSpec) if f.name != "classes"},
                     classes=len(loaders.classes))
    schedule = lr_schedule(config.lr, config.epochs, config.warmup_epochs, steps, config.lr_schedule,
                           config.step_epochs)
    # Updates run here, never on a kvstore: the skip decision, the LR schedule and the optimizer
    # state (master weights) stay with the worker, and the checkpoint can read them as arrays.
    parts = build_parts(spec, mixed, lr_scheduler=schedule, kvstore=kvstore, update_on_kvstore=False,
                        compression_params=compression)
    run = Run(config=config, parts=parts, loaders=loaders, outputs=outputs, steps_per_epoch=steps,
              cluster=cluster, source=source, profile_fields=profile_fields, log=log,
              lock=next((lock for lock in locks if isinstance(lock, Output)), None), data_lock=data_lock)
    if cluster.num_workers > 1:  # before the first step: a worker with other settings would hang the others
        agree_settings(kvstore, rank, num_workers, settings_fingerprint(run, fingerprint))
    facts = {"resolved_threads": threads, "data_fingerprint": fingerprint}
    if config.precision == "auto":  # what decided it: the rule, the times, or the run's own on resume
        resumed = mixed.precision.reason.startswith("the run's own") and (saved or {}).get("auto")
        facts["auto"] = resumed or mixed.verdict.record()
    return run, facts


def _check_thread_count(config):
    """MXNet's threads, read back; refused when ``--threads`` asked for a count MXNet can no longer take."""
    threads = check_threads()  # warns when MXNet was loaded before the thread setting could apply
    # What --threads N becomes here: N, or the cores this process may use when N is more (plan_threads says so).
    if config.threads is not None and threads["threads"] not in (None, plan_threads(config.threads).threads):
        raise ConfigError(f"threads={config.threads}: MXNet is already running {threads['threads']} thread(s) in "
                          "this process and fixes the count when it loads; pass --threads on the command line, or "
                          "call mxfp16.machine.environment.set_threads() (or export OMP_NUM_THREADS) before "
                          "importing mxnet")
    return threads


def _open_data(config, saved, shard, log):
    """The data set, locked shared for the run, and its loaders: ``(source, lock, loaders, fingerprint)``."""
    from ..data import demo_dataset, make_loaders

    source = config.data_dir or str(demo_dataset(config.data_root))
    with refusals_as(ConfigError):
        data_lock = read_lock(source, "training on it", flag="--data-dir" if config.data_dir else None)
    try:
        loaders = make_loaders(source, image_size=config.image_size, batch_size=config.batch_size,
                               workers=config.workers, pipeline=config.pipeline, seed=config.seed, shard=shard,
                               augment=config.augment)
        if loaders.num_test == 0:  # every epoch ends in an evaluation, and its accuracy would be 0/0
            raise ConfigError(f"the test split of {source} holds no images, so no epoch could be evaluated; give "
                              "it test images (`mxfp16 data split` puts a share of each class there), or point "
                              "--data-dir at a data set that has them")
        fingerprint = loaders.fingerprint()
        if config.resume and saved and saved.get("data_fingerprint") is not None:
            _check_same_data(saved["data_fingerprint"], fingerprint, source, config.accept_changed_data, log)
    except BaseException:
        data_lock.abandon()  # as prepare() does with the locks it holds
        raise
    return source, data_lock, loaders, fingerprint


def _mixed_precision(config, ctx, saved, log):
    """The run's one :class:`~mxfp16.MixedPrecision`: the precision resolved once, the README's set-up.

    ``--precision auto`` resumes in the run's own precision and route (an unfused LSTM, other AMP lists), whatever a
    new measurement would say. Workers of a parameter-server job keep the rule: each would time on its own machine
    under the others' load and could choose differently.
    """
    resumed = config.resume and saved and saved.get("resolved_precision")
    route = ((saved or {}).get("auto") or {}).get("route")
    own = (saved["resolved_precision"], f"{config.out}/config.json", route) if resumed else None
    return MixedPrecision(config.precision, ctx, loss_scale=config.loss_scale,
                          allow_cpu_float16=config.allow_cpu_float16, amp_lists=config.amp_lists,
                          time_auto=not str(config.kvstore).startswith("dist"), log=log, own_precision=own)


def _start(run, changes):
    """Now that everything is checked: ``--overwrite`` removes the old run, ``--resume`` loads its checkpoint."""
    config, outputs = run.config, run.outputs
    if run.cluster.rank == 0:
        if config.overwrite:
            outputs.remove_run()  # only now: every setting above has been checked
        for path in outputs.remove_leftovers():
            run.say(f"removed {path}: left by a write that was interrupted")
    if config.resume:
        restore(run, changes)
    if run.cluster.distributed:
        sync_parameters(run.parts.trainer)  # every worker starts from rank 0's parameters (see mxfp16.distributed.sync)


def _record(run, changes, facts, command):
    """``config.json``: the settings, what they resolved to, and each resumption; ``amp-layers.json`` when measured."""
    config, outputs = run.config, run.outputs
    previous = (outputs.read_config() or {}).get("resumed", []) if config.resume else []
    resumed = previous + ([{"at_step": run.progress.global_step,
                            "changed": {k: [old, new] for k, (old, new) in changes.items()}}] if config.resume else [])
    outputs.write_config(dict(config.to_dict(), resolved_precision=run.parts.precision.name,
                              resolved_amp_lists=run.parts.mixed.amp_lists,
                              resolved_ctx=format_ctx(run.parts.ctx), resolved_augment=run.loaders.augment.name,
                              classes=list(run.loaders.classes), source=run.source, command=command,
                              resumed=resumed, **facts))
    if run.parts.mixed.layer_choice is not None:
        outputs.write_amp_layers(run.parts.mixed.layer_choice.record())


def describe_data_change(saved, now):
    """What differs between two data fingerprints (:meth:`mxfp16.data.Loaders.fingerprint`), ``[]`` if nothing."""
    if not isinstance(saved, dict) or not isinstance(saved.get("per_class") or {}, dict) or not all(
            isinstance(v, list) and len(v) == 2 for v in (saved.get("per_class") or {}).values()):
        return ["config.json's data_fingerprint is not one mxfp16 wrote"]
    if saved.get("sha256") == now["sha256"]:
        return []
    changes = []
    if saved.get("files") != now["files"]:
        changes.append(f"{saved.get('files')} files then, {now['files']} now")
    before, after = saved.get("per_class") or {}, now["per_class"]

    def counts(c):
        return "absent" if c is None else f"{c[0]} train / {c[1]} test"
    changes += [f"class {name}: {counts(before.get(name))} then, {counts(after.get(name))} now"
                for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]
    return changes or ["the same counts, but file names or sizes differ"]


def _check_same_data(saved, now, source, accept, log):
    changes = describe_data_change(saved, now)
    if not changes:
        return
    listed = "; ".join(changes[:6]) + (" ..." if len(changes) > 6 else "")
    if not accept:
        raise ConfigError(f"--resume: the data at {source} changed since the run started ({listed}). Resuming on "
                          "other data continues a different experiment; point --data-dir at the original data, or "
                          "pass --accept-changed-data to continue anyway")
    log(f"resume: the data at {source} changed since the run started ({listed}); continuing "
        "(--accept-changed-data)")


def restore(run, changes=None):
    """Load the newest intact checkpoint into the run's parts and progress; rewrite ``metrics.jsonl`` from it."""
    config = run.config
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.progress = ckpt.load_checkpoint(config.out, run.parts, run.fingerprint())
    for warning in caught:
        run.say(f"warning: {warning.message}")
    p = run.progress
    if p.epoch > config.epochs:
        raise ConfigError(f"--epochs {config.epochs}: the run in {config.out} has already finished {p.epoch} "
                          f"epochs; resume with --epochs {p.epoch} or more")
    run.outputs.write_metrics(p.metrics)
    for name, (old, new) in (changes or {}).items():
        run.say(f"resume: {name} {old!r} -> {new!r}, from step {p.global_step} on")
    if changes and {"epochs", "lr", "lr_schedule", "warmup_epochs", "step_epochs"} & set(changes):
        run.say(f"resume: the learning-rate schedule is now the one of the resumed settings ({config.epochs} "
                f"epochs, peak {config.lr:g}); at this step it gives {run.parts.trainer.learning_rate:.4g}")
    run.say(f"resuming {config.out} at epoch {p.epoch + 1}, batch {p.batch} (step {p.global_step}, "
            f"loss scale {format_scale(run.parts.scaler.scale)}, lr {run.parts.trainer.learning_rate:.4g})")


def fit(run, callbacks=()):
    """Train the remaining epochs of ``run``; return the summary (also written to ``summary.json``).

    Parameters
    ----------
    run : Run
    callbacks : sequence of Callback
        Called after the trainer's own (progress bar, Ctrl-C, TensorBoard), before the environment's.
    """
    try:
        return _fit(run, callbacks)
    finally:
        for lock in filter(None, (run.lock, run.data_lock)):
            lock.release()


def _fit(run, callbacks):
    config, progress = run.config, run.progress
    # The signal handler first: a signal from the first line of the log on is handled.
    with StopOnSignal(say=run.say) as stop, open_tensorboard(run) as tensorboard:
        describe(run)
        # Workers stop together, or one waits forever for the others.
        stop_hook = AgreedStop(stop, StopVote(run.cluster.kvstore)) if run.cluster.num_workers > 1 else stop
        hooks = [ProgressBar(config.epochs, run.steps_per_epoch, run.parts.scaler, run.cluster.num_workers,
                             enabled=config.progress and run.cluster.rank == 0), stop_hook,
                 *([tensorboard] if tensorboard else []), *callbacks, *callbacks_from_environment(run),
                 Heartbeat(run.cluster.rank)]
        while progress.epoch < config.epochs:
            start = progress.batch
            batches = itertools.islice(run.loaders.train_batches(progress.epoch, start),
                                       max(0, run.steps_per_epoch - start))
            try:
                finished = train_epoch(run.parts, batches, progress, hooks, log_every=config.log_every,
                                       workers=run.cluster.num_workers, clip_grad_norm=config.clip_grad_norm)
            except TrainingDivergedError as err:
                raise TrainingDivergedError(stopped_message(run, err), err.step, err.epoch) from None
            if not finished:
                save_checkpoint(run)
                raise TrainingInterrupted(
                    f"interrupted at epoch {progress.epoch + 1}, batch {progress.batch} (step {progress.global_step}); "
                    f"checkpoint written to {config.out}/checkpoints; continue with --resume --out {config.out}",
                    StopOnSignal.EXIT_STATUS.get(stop.requested, 130))
            finish_epoch(run)
            for hook in hooks:
                hook.on_epoch_record(progress, progress.metrics[-1])
    return summarise(run)
