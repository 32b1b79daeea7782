"""The trainer's configuration: one dataclass whose fields, with their metadata, are also the command line's flags.

Fields left at ``None`` are filled by :meth:`TrainConfig.resolve` from one of two :data:`PROFILES`: ``dataset``
(with ``data_dir``: the tutorial's run) or ``demo`` (what a 2-core CPU trains in about two minutes on the demo
set; ``docs/training.md``, "Two profiles", says why).
"""
import hashlib
import json
import math
import numbers
from dataclasses import asdict, dataclass, field, fields, replace

from ..amp.lists import LIST_SETS
from ..data.augment import AUGMENT_CHOICES
from ..data.layout import PIPELINES, caltech101_paths
from ..devices import CTX_HELP
from ..machine.environment import THREADS_DEFAULT, THREADS_HELP
from ..optim import GRADIENT_COMPRESSION, LR_SCHEDULES
from ..plumbing.limits import MAX_BATCH, MAX_COUNT, MAX_IMAGE_SIDE, max_batch
from ..precision import PRECISIONS, PrecisionError, check_precision_name
from ..scaler import parse_loss_scale

__all__ = ["TrainConfig", "ConfigError", "PROFILES", "LR_SCHEDULES", "KVSTORES", "GROUPS", "default_text",
           "RESUME_CHANGEABLE"]

KVSTORES = ("device", "local", "nccl", "dist_sync", "dist_device_sync", "dist_async")
#: The documented Caltech-101 folders, named in --data-dir's help.
_CALTECH = caltech101_paths()
#: The flag groups of ``mxfp16 train --help``, in order.
GROUPS = ("data", "model", "precision", "optimisation", "run")

#: Values for fields left at None, per profile (see the module docstring).
PROFILES = {
    "dataset": dict(model="resnet50_v2", image_size=224, epochs=30, batch_size=32, optimizer="sgd", lr=0.0125,
                    warmup_epochs=2, wd=1e-4),
    "demo": dict(model="resnet18_v1", image_size=48, epochs=16, batch_size=32, optimizer="adam", lr=0.003,
                 warmup_epochs=1, wd=1e-4),
}


#: Settings a resumed run may change; they take effect from the step it resumes at.
RESUME_CHANGEABLE = ("epochs", "lr", "lr_schedule", "warmup_epochs", "step_epochs", "wd", "momentum",
                     "label_smoothing", "clip_grad_norm", "ctx", "threads", "workers", "keep_checkpoints",
                     "max_batches", "log_every", "progress", "tensorboard_dir", "tensorboard")
#: Fields that steer this invocation and are not part of what the run is.
RESUME_CONTROL = ("resume", "overwrite", "accept_changed_data", "out")


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the field and the fix."""


def _option(default, group, help, **flag):
    """A dataclass field with its command-line metadata (see ``mxfp16/commands/train.py``).

    ``flag`` may hold ``choices``, ``metavar``, ``flag`` (the option string, e.g. ``--no-progress``) and
    ``default_text`` (what the help says the default is, when the value alone would not say it).
    """
    return field(default=default, metadata=dict(group=group, help=help, **flag))


def default_text(name):
    """What ``--help`` says a field's default is: its value, or the profiles' values for ``None``."""
    meta = TrainConfig.__dataclass_fields__[name]
    if "default_text" in meta.metadata:
        return meta.metadata["default_text"]
    if name in PROFILES["dataset"] and meta.default is None:
        return f"{PROFILES['dataset'][name]} with --data-dir; {PROFILES['demo'][name]} on the demo set"
    if meta.default is None:
        return "none"
    if isinstance(meta.default, bool):
        return "on" if meta.default else "off"
    return str(meta.default)


@dataclass
class TrainConfig:
    """Everything one training run needs. ``None`` means "from the profile"; each field's ``help`` documents it."""

    data_dir: str = _option(None, "data", "folder with train/ and test/ class folders, or a RecordIO prefix with "
                                          f"--pipeline recordio; for Caltech-101 {_CALTECH.split} or "
                                          f"{_CALTECH.pack}, not the download {_CALTECH.fetched} (`mxfp16 data "
                                          "--help` lists the steps)",
                            default_text="the demo set, generated under --data-root on first use")
    data_root: str = _option("data", "data", "where the demo set is generated")
    image_size: int = _option(None, "data", "side of the square crops in pixels")
    workers: int = _option(0, "data", "data-loading processes (folder) or decoding threads (recordio)",
                           default_text="0: decode in the training process; on 2 cores extra processes compete "
                                        "with the network for the cores")
    pipeline: str = _option("folder", "data", "input pipeline: image files+DataLoader or ImageRecordIter",
                            choices=PIPELINES)
    augment: str = _option("auto", "data", "training augmentation. imagenet: random-resized crop of 8-100% of "
                                           "the area (or what the data set's manifest asks for), aspect 3/4-4/3, "
                                           "flip: for photos of objects (Caltech-101). light: 64-100%, aspect "
                                           "0.9-1.11, flip: small images, objects that fill the frame. none: the "
                                           "evaluation crop, no flip: digits, text, anything a crop or flip can "
                                           "change the class of. auto: what the data set's manifest asks for, else "
                                           "light below 64 px and imagenet from 64 px (config.json records the "
                                           "choice as resolved_augment)", choices=AUGMENT_CHOICES)
    model: str = _option(None, "model", "any gluoncv classification model, e.g. resnet50_v2, resnet50_v1d, "
                                        "cifar_resnet20_v1, or elementwise-mlp (float16 on CPU)")
    pretrained: bool = _option(False, "model", "fine-tune from gluoncv ImageNet weights already on this machine; "
                                               "nothing is downloaded", default_text="off, train from scratch")
    precision: str = _option("auto", "precision", "float32, float16 (GPU), amp-float16 (GPU), amp-bfloat16 (CPU "
                                                  "with AVX-512), or auto: float16 on GPUs; on a CPU with native "
                                                  "bfloat16 the faster of float32 and amp-bfloat16 for this model, "
                                                  "timed once and cached; else float32", choices=PRECISIONS)
    amp_lists: str = _option("mxfp16", "precision", "AMP operator lists for amp-bfloat16 (and auto's): mxfp16 "
                                                    "(tuned), mxnet (MXNet's own), measured (mxfp16's, with the "
                                                    "layers that do not gain on this CPU kept in float32: each "
                                                    "layer timed once in both precisions, cached, the table "
                                                    "written to amp-layers.json), or mxfp16 with depthwise or 1x1 "
                                                    "convolutions in float32 (options to measure)",
                             choices=tuple(LIST_SETS))
    loss_scale: str = _option(None, "precision", "dynamic, a fixed number such as 1024, or none",
                              default_text="dynamic for float16 and amp-float16, none otherwise")
    clip_grad_norm: float = _option(None, "precision", "clip the global gradient norm to this value",
                                    default_text="no clipping")
    allow_cpu_float16: bool = _option(False, "precision", "allow float16 on a CPU, for --model elementwise-mlp only")
    optimizer: str = _option(None, "optimisation", "any MXNet optimizer name")
    lr: float = _option(None, "optimisation", "peak learning rate for the whole batch (a tenth of the profile's "
                                              "with --pretrained)")
    momentum: float = _option(0.9, "optimisation", "momentum, for optimizers that take one")
    wd: float = _option(None, "optimisation", "weight decay")
    lr_schedule: str = _option("cosine", "optimisation", "decay after warm-up: cosine to 0, or step (x0.1 at each "
                                                         "of --step-epochs)", choices=LR_SCHEDULES)
    warmup_epochs: int = _option(None, "optimisation", "epochs of linear warm-up from 0")
    step_epochs: tuple = _option(None, "optimisation", "comma-separated epochs after which --lr-schedule step "
                                                       "divides the rate by 10: increasing, from the end of "
                                                       "--warmup-epochs on, below --epochs", metavar="E1,E2",
                                 default_text="50% and 75% of the epochs, where past the warm-up")
    label_smoothing: float = _option(0.0, "optimisation", "label smoothing epsilon")
    epochs: int = _option(None, "optimisation", "epochs")
    batch_size: int = _option(None, "optimisation", "images per step on each worker, split across devices")
    ctx: str = _option("auto", "run", CTX_HELP + " (a list splits each batch)")
    threads: int = _option(None, "run", THREADS_HELP, metavar="N", default_text=THREADS_DEFAULT)
    kvstore: str = _option("device", "run", "Gluon kvstore, passed through; dist_* under `mxfp16 launch`",
                           choices=KVSTORES)
    gradient_compression: str = _option(None, "run", "compress gradients on the kvstore; float32 parameters and "
                                                     "--kvstore device only, as MXNet 1.9.1 allows",
                                        choices=GRADIENT_COMPRESSION, default_text="off")
    seed: int = _option(0, "run", "seeds initialisation, data order and augmentation")
    out: str = _option("runs/train", "run", "run folder for outputs and checkpoints")
    resume: bool = _option(False, "run", "continue the run in --out from its newest intact checkpoint, with the "
                                         "settings it was started with; flags given with --resume change only "
                                         "what a resumed run can change (epochs, the learning-rate schedule, wd, "
                                         "momentum, clipping, devices, threads, logging) and the rest are refused",
                           default_text="off; an --out that holds a run is refused without it")
    overwrite: bool = _option(False, "run", "replace the run already in --out: its config, metrics, summaries and "
                                            "checkpoints are deleted once the new run's settings have been checked",
                              default_text="off; such an --out is refused")
    accept_changed_data: bool = _option(False, "run", "with --resume: continue although the data set's files changed "
                                                      "since the run started (config.json's data_fingerprint)",
                                        default_text="off; changed data refuses --resume, naming what changed")
    keep_checkpoints: int = _option(2, "run", "checkpoints kept in --out/checkpoints; a damaged newest one falls "
                                              "back to the one before")
    max_batches: int = _option(None, "run", "at most N training and N evaluation batches per epoch, for smoke runs",
                               metavar="N", default_text="all")
    log_every: int = _option(10, "run", "steps between reads of the loss for the progress bar and TensorBoard; "
                                        "each read waits for the device")
    progress: bool = _option(True, "run", "no progress bar", flag="--no-progress",
                             default_text="bar on a terminal")
    tensorboard_dir: str = _option(None, "run", "folder for the run's TensorBoard event files (loss, learning rate, "
                                                "loss scale, skipped steps, img/s every --log-every steps; top-1 and "
                                                "gradient-exponent histograms every epoch; the configuration); "
                                                "give each run its own and point `tensorboard --logdir` at their "
                                                "parent", flag="--tensorboard", metavar="DIR",
                                   default_text="OUT/tensorboard, when tensorboardX is installed")
    tensorboard: bool = _option(True, "run", "write no TensorBoard events (whatever --tensorboard says)",
                                flag="--no-tensorboard",
                                default_text="on when tensorboardX is installed")

    @property
    def profile(self):
        """``'demo'`` without a data set, ``'dataset'`` with one."""
        return "demo" if self.data_dir is None else "dataset"

    def open_fields(self):
        """Names of the fields :meth:`resolve` fills from the profile."""
        return {k for k in PROFILES[self.profile] if getattr(self, k) is None}

    def resolve(self):
        """A copy with every ``None`` default filled from the profile, validated.

        Raises
        ------
        ConfigError
        """
        filled = {k: v for k, v in PROFILES[self.profile].items() if getattr(self, k) is None}
        if self.pretrained and "lr" in filled:
            filled["lr"] /= 10  # fine-tuning: the features are already good
        resolved = replace(self, **filled)
        if "warmup_epochs" in filled and resolved.epochs is not None:
            # A profile's warm-up never takes a whole short run: --epochs 2 keeps one epoch of decay.
            resolved.warmup_epochs = max(0, min(resolved.warmup_epochs, resolved.epochs - 1))
        if resolved.step_epochs is None and resolved.lr_schedule == "step":
            # 50% and 75% of the run, where a drop can act: after warm-up, before the last epoch ends.
            resolved.step_epochs = tuple(sorted(e for e in {resolved.epochs // 2, (3 * resolved.epochs) // 4}
                                                if max(1, resolved.warmup_epochs or 0) <= e < resolved.epochs))
        if resolved.step_epochs is not None:  # a list from Python, numpy integers: plain ints (others are refused)
            resolved.step_epochs = tuple(int(e) if isinstance(e, numbers.Integral) and not isinstance(e, bool) else e
                                         for e in resolved.step_epochs)
        resolved.validate()
        return resolved

    def validate(self):
        """Check ranges and choices; raise :class:`ConfigError` naming the field and the fix."""
        def need(ok, message):
            if not ok:
                raise ConfigError(message)

        try:
            check_precision_name(self.precision)
            parse_loss_scale(self.loss_scale)
        except (PrecisionError, ValueError) as err:
            raise ConfigError(str(err)) from None
        for name in ("pipeline", "augment", "lr_schedule", "kvstore", "gradient_compression"):
            choices = fields_by_name()[name].metadata["choices"]
            value = getattr(self, name)
            need(value in choices or (value is None and name == "gradient_compression"),
                 f"{name} {value!r}: choose one of {', '.join(choices)}")
        for name in ("image_size", "epochs", "batch_size", "log_every", "keep_checkpoints", "threads"):
            value = getattr(self, name)
            need(value is None or (isinstance(value, int) and value >= 1),
                 f"{name}={value!r}: must be a whole number >= 1")
        need(self.image_size is None or 8 <= self.image_size <= MAX_IMAGE_SIDE,
             f"image_size={self.image_size}: must be between 8 and {MAX_IMAGE_SIDE} pixels")
        for name, high in (("epochs", MAX_COUNT), ("log_every", MAX_COUNT), ("keep_checkpoints", 1000),
                           ("max_batches", MAX_COUNT)):
            need(getattr(self, name) is None or getattr(self, name) <= high,
                 f"{name}={getattr(self, name)}: must be at most {high}")
        if self.batch_size is not None:
            largest = max_batch(self.image_size or 224)
            need(self.batch_size <= largest, f"batch_size={self.batch_size}: at most {largest} images of "
                 f"{self.image_size or 224} px fit in a quarter of this machine's memory as float32 input alone "
                 f"(limit {MAX_BATCH}); use a smaller --batch-size")
        need(isinstance(self.workers, int) and 0 <= self.workers <= 256,
             f"workers={self.workers}: must be between 0 (load in the training process) and 256")
        # float32 is what the optimizer computes in: a rate beyond its range is inf.
        need(self.lr is None or (self.lr > 0 and math.isfinite(self.lr) and self.lr < 3.4e38),
             f"lr={self.lr}: must be a positive finite number such as 0.1")
        need(self.wd is None or (self.wd >= 0 and math.isfinite(self.wd)), f"wd={self.wd}: must be >= 0 and finite")
        need(0 <= self.momentum < 1, f"momentum={self.momentum}: must be in [0, 1)")
        need(0 <= self.label_smoothing < 1, f"label_smoothing={self.label_smoothing}: must be in [0, 1)")
        need(self.clip_grad_norm is None or (self.clip_grad_norm > 0 and math.isfinite(self.clip_grad_norm)),
             f"clip_grad_norm={self.clip_grad_norm}: must be positive and finite")
        need(self.warmup_epochs is None or self.warmup_epochs >= 0, f"warmup_epochs={self.warmup_epochs}: must be >= 0")
        if self.epochs is not None and self.warmup_epochs is not None:
            need(self.warmup_epochs < self.epochs,
                 f"warmup_epochs={self.warmup_epochs} leaves no epoch after warm-up of {self.epochs}; "
                 "lower it or raise --epochs")
        self._check_step_epochs(need)
        # numpy's and MXNet's seeds are unsigned 32-bit integers.
        need(isinstance(self.seed, int) and 0 <= self.seed < 2 ** 32, f"seed={self.seed}: must be in 0 .. 2**32-1")
        self.check_resume_pair()
        need(self.max_batches is None or self.max_batches >= 1, f"max_batches={self.max_batches}: must be >= 1")

    def _check_step_epochs(self, need):
        """Refuse ``--step-epochs`` that would be ignored or could not act as written: each one must be a drop."""
        if self.step_epochs is None:
            return
        steps = list(self.step_epochs)
        flag = f"--step-epochs {','.join(map(str, steps))}"
        need(all(isinstance(e, numbers.Integral) and not isinstance(e, bool) for e in steps),
             f"{flag}: whole numbers of epochs, e.g. --step-epochs 10,20")
        need(self.lr_schedule == "step" or not steps,
             f"{flag} is for --lr-schedule step, and --lr-schedule {self.lr_schedule} would ignore it: add "
             "--lr-schedule step, or drop --step-epochs")
        need(all(e >= 1 for e in steps), f"{flag}: epochs count from 1, e.g. --step-epochs 10,20")
        repeated = sorted({e for e in steps if steps.count(e) > 1})
        need(not repeated, f"{flag} lists epoch {repeated[0] if repeated else ''} twice; each epoch drops the rate "
                           "once: list each one once")
        need(steps == sorted(steps), f"{flag} is out of order; list the epochs in increasing order "
                                     f"(--step-epochs {','.join(map(str, sorted(steps)))})")
        if self.epochs is not None and steps:
            need(steps[-1] < self.epochs,
                 f"{flag}: epoch {steps[-1]} is not before the end of the run (--epochs {self.epochs}), so its drop "
                 "would change no update; list epochs below --epochs, or raise --epochs")
        if self.warmup_epochs and steps:
            need(steps[0] >= self.warmup_epochs,
                 f"{flag}: epoch {steps[0]} falls within the {self.warmup_epochs} warm-up epochs (--warmup-epochs), "
                 "where the rate climbs and cannot drop; list epochs from the end of the warm-up on, or shorten it")

    def check_resume_pair(self):
        """Refuse ``resume`` with ``overwrite``: one continues the run in ``out``, the other replaces it."""
        if self.resume and self.overwrite:
            raise ConfigError("resume and overwrite exclude each other: --resume continues the run in --out, "
                              "--overwrite replaces it; drop one")

    def for_resume(self, saved, given=None):
        """The configuration a resumed run runs: the saved one, with the ``given`` fields that may change.

        Parameters
        ----------
        saved : dict
            The run's ``config.json``.
        given : set of str, optional
            Fields the user set now (default: those that differ from their defaults).

        Returns
        -------
        (TrainConfig, dict)
            The configuration, and ``{field: (old, new)}`` for what changed.

        Raises
        ------
        ConfigError
            A given field that a resumed run cannot change.
        """
        self.check_resume_pair()  # here too: the resumed configuration below always says overwrite=False
        known = set(fields_by_name())
        base = TrainConfig.from_dict({k: v for k, v in saved.items() if k in known})
        given = ({f.name for f in fields(self) if getattr(self, f.name) != f.default} if given is None
                 else set(given))
        changes = {name: (getattr(base, name), getattr(self, name)) for name in sorted(given & known)
                   if getattr(base, name) != getattr(self, name) and name not in RESUME_CONTROL}
        refused = {name: change for name, change in changes.items() if name not in RESUME_CHANGEABLE}
        if refused:
            raise ConfigError(
                "--resume continues the run in --out as it was started; these settings cannot change: "
                + "; ".join(f"{name} {old!r} -> {new!r}" for name, (old, new) in refused.items())
                + ". Drop them to continue, or start a new run with another --out. A resumed run can change: "
                + ", ".join(RESUME_CHANGEABLE))
        values = dict({name: getattr(self, name) for name in given & known}, resume=True, overwrite=False)
        resumed = replace(base, **values)
        if resumed.lr_schedule != "step" and "step_epochs" not in given:
            resumed.step_epochs = None  # the run's step epochs belong to its step schedule, now left
        return resumed, changes

    def to_dict(self):
        """Plain JSON-ready values (tuples become lists)."""
        out = asdict(self)
        return dict(out, step_epochs=None if out["step_epochs"] is None else list(out["step_epochs"]))

    @classmethod
    def from_dict(cls, values):
        """Build from :meth:`to_dict` output; unknown keys raise :class:`ConfigError`."""
        unknown = sorted(set(values) - set(fields_by_name()))
        if unknown:
            raise ConfigError(f"unknown configuration field(s): {', '.join(unknown)}; "
                              f"known: {', '.join(sorted(fields_by_name()))}")
        values = dict(values)
        if values.get("step_epochs") is not None:
            values["step_epochs"] = tuple(values["step_epochs"])
        return cls(**values)

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2)

    def digest(self):
        """A short sha256 of the configuration (for logs and file names)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def fields_by_name():
    """``{name: dataclasses.Field}`` of :class:`TrainConfig`, in declaration order."""
    return {f.name: f for f in fields(TrainConfig)}
