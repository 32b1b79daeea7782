"""The reference trainer: ``mxfp16 train``, ``python -m mxfp16.train`` and :func:`train` for notebooks.

::

    from mxfp16.train import TrainConfig, train
    summary = train(TrainConfig(precision="float32", out="runs/f32", epochs=3))

See ``docs/training.md``.
"""
from .._lazy import exports

#: Public name -> the module of this package that defines it. They load on first use, so that
#: ``python -m mxfp16.train --threads N`` reaches the command line before MXNet loads.
_EXPORTS = {
    "train": "run", "prepare": "run", "fit": "run", "Run": "run", "TrainingInterrupted": "run",
    "TrainConfig": "config", "PROFILES": "config", "ConfigError": "config",
    "Progress": "progress", "Callback": "loop", "train_epoch": "loop", "evaluate": "loop",
    "TrainingDivergedError": "loop",
    "CheckpointError": "checkpoint", "CheckpointMismatchError": "checkpoint",
    "METRIC_FIELDS": "outputs", "SUMMARY_FIELDS": "outputs", "params_digest": "outputs",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = exports(__name__, _EXPORTS)
