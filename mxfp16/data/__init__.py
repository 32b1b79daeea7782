"""Data sets and input pipelines: the demo set, Caltech-101, splits, RecordIO packs.

The two calls the trainer, the benchmark and the notebooks need::

    from mxfp16.data import demo_dataset, make_loaders
    loaders = make_loaders(demo_dataset(), image_size=112, batch_size=32)
    for data, label in loaders.train_batches(epoch=0):
        ...

See ``docs/data.md``. The names below load on first use, so importing this
package (or one of its MXNet-free modules: ``layout``, ``augment``,
``validate``) does not load MXNet.
"""
from .._lazy import exports

_EXPORTS = {
    "demo_dataset": "synth", "synth_dataset": "synth", "SHAPES": "synth",
    "make_loaders": "pipelines", "Loaders": "pipelines", "PIPELINES": "layout",
    "DataError": "validate", "scan_classes": "validate", "scan_image": "validate",
}

__all__ = list(_EXPORTS)

# The image scan, the synthetic sets and DataError load without MXNet: mxfp16 predict of an ONNX export runs where
# MXNet is not installed.
__getattr__, __dir__ = exports(__name__, _EXPORTS, mxnet_free=("synth", "validate", "layout"))
