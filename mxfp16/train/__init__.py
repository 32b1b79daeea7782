"""The reference trainer: ``mxfp16 train``, ``python -m mxfp16.train`` and :func:`train` for notebooks.

::

    from mxfp16.train import TrainConfig, train
    summary = train(TrainConfig(precision="float32", out="runs/f32", epochs=3))

See ``docs/training.md``.
"""
from .checkpoint import CheckpointError, CheckpointMismatchError
from .config import PROFILES, ConfigError, TrainConfig
from .loop import Run, TrainingDivergedError, TrainingInterrupted, train
from .outputs import METRIC_FIELDS, SUMMARY_FIELDS, params_digest

__all__ = [
    "train", "TrainConfig", "PROFILES", "Run",
    "ConfigError", "CheckpointError", "CheckpointMismatchError", "TrainingDivergedError", "TrainingInterrupted",
    "METRIC_FIELDS", "SUMMARY_FIELDS", "params_digest",
]
