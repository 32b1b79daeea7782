"""The reference trainer: ``mxfp16 train``, ``python -m mxfp16.train`` and :func:`train` for notebooks.

::

    from mxfp16.train import TrainConfig, train
    summary = train(TrainConfig(precision="float32", out="runs/f32", epochs=3))

The pieces, bottom up: :mod:`~mxfp16.train.config` (the settings and their
flags), :mod:`~mxfp16.train.progress` (where a run stands),
:mod:`~mxfp16.train.loop` (the epoch loop and evaluation),
:mod:`~mxfp16.train.callbacks` (progress bar, Ctrl-C, testing aids),
:mod:`~mxfp16.train.checkpoint`, :mod:`~mxfp16.train.outputs` (the run
folder's files), :mod:`~mxfp16.train.run` (set-up and the epochs) and
:mod:`~mxfp16.train.compare` (finished runs side by side). See ``docs/training.md``.
"""
from .checkpoint import CheckpointError, CheckpointMismatchError
from .config import PROFILES, ConfigError, TrainConfig
from .loop import Callback, TrainingDivergedError, evaluate, train_epoch
from .outputs import METRIC_FIELDS, SUMMARY_FIELDS, params_digest
from .progress import Progress
from .run import Run, TrainingInterrupted, fit, prepare, train

__all__ = [
    "train", "prepare", "fit", "TrainConfig", "PROFILES", "Run", "Progress", "Callback", "train_epoch", "evaluate",
    "ConfigError", "CheckpointError", "CheckpointMismatchError", "TrainingDivergedError", "TrainingInterrupted",
    "METRIC_FIELDS", "SUMMARY_FIELDS", "params_digest",
]
