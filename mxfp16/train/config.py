"""The trainer's configuration: one dataclass, its defaults, validation, JSON round trip.

Fields left at ``None`` are filled by :meth:`TrainConfig.resolve` from one of
two profiles:

``dataset``
    A real data set (``data_dir`` given): the tutorial's run, ResNet-50 v2 at
    224 px (Caltech-101 on a GPU).
``demo``
    No ``data_dir``: the generated demo set (ten shape classes, 1,000 training
    images) with a network and image size a 2-core CPU trains in about two
    minutes, chosen by measurement (bare training step, batch 32, this
    machine): ResNet-50 at 224 px runs at about 7 img/s, so one epoch of the
    demo set would take over two minutes. ``cifar_resnet20_v1`` at 32 px is
    fast (226 img/s) but its 16-64-channel convolutions are too small for
    bfloat16 to gain (236 img/s in the bare step, slower than float32 in the
    trainer). ``resnet18_v1`` at 48 px has 64-512 channels: 153 img/s in
    float32 and 194 in bfloat16 (1.27x), and its last feature maps are 2x2,
    not the 1x1 at which BatchNorm's running statistics fail in evaluation.
    16 epochs of Adam reach about 97% in both precisions (SGD at 32 steps
    per epoch stayed near chance for half the run).
"""
import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace

from ..precision import PRECISIONS

__all__ = ["TrainConfig", "ConfigError", "PROFILES", "LR_SCHEDULES", "KVSTORES"]

LR_SCHEDULES = ("step", "cosine")
KVSTORES = ("device", "local", "nccl", "dist_sync", "dist_device_sync", "dist_async")
GRADIENT_COMPRESSION = ("2bit",)

#: Values for fields left at None, per profile (see the module docstring).
PROFILES = {
    "dataset": dict(model="resnet50_v2", image_size=224, epochs=30, batch_size=32, optimizer="sgd", lr=0.0125,
                    warmup_epochs=2, wd=1e-4),
    "demo": dict(model="resnet18_v1", image_size=48, epochs=16, batch_size=32, optimizer="adam", lr=0.003,
                 warmup_epochs=1, wd=1e-4),
}


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the field and the fix."""


@dataclass
class TrainConfig:
    """Everything one training run needs. ``None`` means "from the profile" (see module docstring).

    Attributes
    ----------
    data_dir : str or None
        Folder with ``train/`` and ``test/`` (or a RecordIO prefix with
        ``pipeline='recordio'``); ``None`` uses the demo set under ``data_root``.
    data_root : str
        Where the demo set is generated (``<data_root>/demo``).
    image_size, workers, pipeline
        Crop side in pixels, data-loading processes/threads, ``'folder'`` or ``'recordio'``.
    model, pretrained
        gluoncv model-zoo name (or ``'elementwise-mlp'``); start from local ImageNet weights.
    precision, loss_scale, clip_grad_norm, allow_cpu_float16
        See :func:`mxfp16.resolve_precision` and :func:`mxfp16.make_loss_scaler`.
    optimizer, lr, momentum, wd, lr_schedule, warmup_epochs, step_epochs, label_smoothing, epochs, batch_size
        Optimisation. ``lr`` is for the whole batch; ``step_epochs`` are the
        epochs where the ``step`` schedule divides the rate by 10 (default:
        at 50% and 75% of the run).
    ctx, kvstore, gradient_compression
        Devices (``'cpu'``, ``'gpu:0,1'``), Gluon kvstore, ``'2bit'`` or None.
    seed, out, resume, overwrite, max_batches, log_every
        Run control. ``overwrite`` deletes the outputs of a run already in
        ``out`` (never other files) instead of refusing to start. ``max_batches`` caps training and evaluation batches per
        epoch (smoke runs); ``log_every`` is how many steps pass between
        reads of the loss (each read waits for the device).
    inject_overflow_step, inject_overflow_rank, interrupt_at_step
        Testing aids: make the loss infinite at that global step (on one rank,
        or every rank when ``None``), or behave as if Ctrl-C arrived after it.
    """

    # data
    data_dir: str = None
    data_root: str = "data"
    image_size: int = None
    workers: int = 0
    pipeline: str = "folder"
    # model
    model: str = None
    pretrained: bool = False
    # precision
    precision: str = "auto"
    loss_scale: str = None
    clip_grad_norm: float = None
    allow_cpu_float16: bool = False
    # optimisation
    optimizer: str = None
    lr: float = None
    momentum: float = 0.9
    wd: float = None
    lr_schedule: str = "cosine"
    warmup_epochs: int = None
    step_epochs: tuple = None
    label_smoothing: float = 0.0
    epochs: int = None
    batch_size: int = None
    # run
    ctx: str = "cpu"
    kvstore: str = "device"
    gradient_compression: str = None
    seed: int = 0
    out: str = "runs/train"
    resume: bool = False
    overwrite: bool = False
    max_batches: int = None
    log_every: int = 10
    progress: bool = True
    # testing aids
    inject_overflow_step: int = None
    inject_overflow_rank: int = None
    interrupt_at_step: int = None

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
            resolved.step_epochs = tuple(sorted({max(1, resolved.epochs // 2), max(1, (3 * resolved.epochs) // 4)}))
        if resolved.step_epochs is not None:
            resolved.step_epochs = tuple(int(e) for e in resolved.step_epochs)
        resolved.validate()
        return resolved

    def validate(self):
        """Check ranges and choices; raise :class:`ConfigError` naming the field and the fix."""
        def need(ok, message):
            if not ok:
                raise ConfigError(message)

        need(self.precision in PRECISIONS, f"precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        need(self.pipeline in ("folder", "recordio"), f"pipeline {self.pipeline!r}: choose folder or recordio")
        need(self.lr_schedule in LR_SCHEDULES, f"lr_schedule {self.lr_schedule!r}: choose one of {', '.join(LR_SCHEDULES)}")
        need(self.kvstore in KVSTORES, f"kvstore {self.kvstore!r}: choose one of {', '.join(KVSTORES)}")
        need(self.gradient_compression in (None,) + GRADIENT_COMPRESSION,
             f"gradient_compression {self.gradient_compression!r}: MXNet offers only '2bit' (or none)")
        for name in ("image_size", "epochs", "batch_size", "log_every"):
            value = getattr(self, name)
            need(value is None or (isinstance(value, int) and value >= 1), f"{name}={value!r}: must be a whole number >= 1")
        need(self.image_size is None or self.image_size >= 8, f"image_size={self.image_size}: must be at least 8 pixels")
        need(self.workers >= 0, f"workers={self.workers}: must be >= 0 (0 loads in the training process)")
        need(self.lr is None or self.lr > 0, f"lr={self.lr}: must be positive")
        need(self.wd is None or self.wd >= 0, f"wd={self.wd}: must be >= 0")
        need(0 <= self.momentum < 1, f"momentum={self.momentum}: must be in [0, 1)")
        need(0 <= self.label_smoothing < 1, f"label_smoothing={self.label_smoothing}: must be in [0, 1)")
        need(self.clip_grad_norm is None or self.clip_grad_norm > 0, f"clip_grad_norm={self.clip_grad_norm}: must be positive")
        need(self.warmup_epochs is None or self.warmup_epochs >= 0, f"warmup_epochs={self.warmup_epochs}: must be >= 0")
        if self.epochs is not None and self.warmup_epochs is not None:
            need(self.warmup_epochs < self.epochs,
                 f"warmup_epochs={self.warmup_epochs} leaves no epoch after warm-up of {self.epochs}; lower it or raise --epochs")
        if self.loss_scale is not None and str(self.loss_scale).strip().lower() not in ("dynamic", "none", "off"):
            try:
                scale = float(self.loss_scale)
            except ValueError:
                scale = float("nan")
            need(0 < scale < float("inf"), f"loss_scale {self.loss_scale!r}: use 'dynamic', 'none' or a positive number such as 1024")
        need(not (self.resume and self.overwrite), "resume and overwrite exclude each other: --resume continues the run "
             "in --out, --overwrite replaces it")
        need(self.max_batches is None or self.max_batches >= 1, f"max_batches={self.max_batches}: must be >= 1")
        for name in ("inject_overflow_step", "interrupt_at_step"):
            value = getattr(self, name)
            need(value is None or value >= 1, f"{name}={value}: steps count from 1")

    # ---- JSON ----------------------------------------------------------
    def to_dict(self):
        """Plain JSON-ready values (tuples become lists)."""
        out = asdict(self)
        if out["step_epochs"] is not None:
            out["step_epochs"] = list(out["step_epochs"])
        return out

    @classmethod
    def from_dict(cls, values):
        """Build from :meth:`to_dict` output; unknown keys raise :class:`ConfigError`."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown configuration field(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values = dict(values)
        if values.get("step_epochs") is not None:
            values["step_epochs"] = tuple(values["step_epochs"])
        return cls(**values)

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2)

    def digest(self):
        """A short sha256 of the configuration (for logs and file names)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]
