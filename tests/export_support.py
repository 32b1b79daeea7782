"""A small export folder made in a second, for the tests that tamper with one, and images to predict on.

:func:`tiny_export` writes what ``mxfp16 export`` writes (graph, parameters,
``export.json``, ``SHA256SUMS``) for a three-class network of a
convolution, a pooling and a dense layer at 16 px, through the same
library calls, without a training run or the agreement check.
"""
from mxfp16.inference import bundle

import numpy as np
from PIL import Image

CLASSES = ["circle", "square", "triangle"]
SIZE = 16


def tiny_network(outputs=None, seed=0):
    """A hybridized network of ``outputs`` classes (default: one per :data:`CLASSES`), its shapes inferred."""
    import mxnet as mx
    from mxnet import gluon

    outputs = len(CLASSES) if outputs is None else outputs
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3, padding=1, in_channels=3), gluon.nn.Activation("relu"),
            gluon.nn.GlobalAvgPool2D(), gluon.nn.Flatten(), gluon.nn.Dense(outputs, in_units=4))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, 3, SIZE, SIZE)))
    return net


def tiny_export(folder, net=None, model_format="mxnet"):
    """Write an export of ``net`` (default: :func:`tiny_network`) into the new folder ``folder``; return it.

    ``model_format="onnx"`` writes ``model.onnx`` through the ONNX format's own writer (needs onnx and onnxruntime).
    """
    from mxfp16.data.pipelines import MEAN_RGB, STD_RGB, resize_for
    from mxfp16.inference import formats
    from mxfp16.inference.convert import deployable
    from mxfp16.precision import resolve_precision

    precision = resolve_precision("float32", "cpu")
    model = deployable(net or tiny_network(), precision)
    folder.mkdir(parents=True)
    writer = formats.get(model_format)
    files, section = writer.write(folder, model, formats.WriteOptions(input_shape=(3, SIZE, SIZE),
                                                                     dtypes=("float32",)))
    bundle.write_info(folder, {
        "format": bundle.FORMAT, "version": bundle.VERSION, "model": "tiny", "precision": precision.name,
        "compute_dtype": precision.compute_dtype, "classes": list(CLASSES), "image_size": SIZE,
        "preprocess": {"decode": "RGB", "resize_short": resize_for(SIZE), "center_crop": SIZE,
                       "mean_rgb": list(MEAN_RGB), "std_rgb": list(STD_RGB)},
        "files": files, "model_format": model_format, model_format: section,
    })
    bundle.seal(folder)
    return folder


def images(folder, count=3, seed=0):
    """``count`` random RGB PNGs of 24x20 px in ``folder``; their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        path = folder / f"image-{i}.png"
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths
