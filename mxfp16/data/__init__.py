"""Data sets and input pipelines: the demo set, Caltech-101, splits, RecordIO packs.

The two calls the trainer, the benchmark and the notebooks need::

    from mxfp16.data import demo_dataset, make_loaders
    loaders = make_loaders(demo_dataset(), image_size=112, batch_size=32)
    for data, label in loaders.train_batches(epoch=0):
        ...

See ``docs/data.md``.
"""
from .pipelines import PIPELINES, Loaders, make_loaders
from .synth import SHAPES, demo_dataset, synth_dataset
from .validate import DataError, scan_classes, scan_image

__all__ = [
    "demo_dataset", "make_loaders", "Loaders", "PIPELINES", "DataError",
    "synth_dataset", "SHAPES", "scan_classes", "scan_image",
]
