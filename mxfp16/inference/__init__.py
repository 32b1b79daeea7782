"""Serving a trained run: export it in a precision, check it against float32, predict, time it.

::

    from mxfp16.inference import Predictor, export_run, image_files
    export_run("runs/demo", "exports/demo-bf16", precision="amp-bfloat16")
    predictor = Predictor("exports/demo-bf16")
    files, missing = image_files(["photos/"])
    results, skipped = predictor.predict_files(files, top_k=3)

The pieces, bottom up: :mod:`~mxfp16.inference.convert` (a network as a
graph and parameters in one precision, and back into a block),
:mod:`~mxfp16.inference.bundle` (the export folder's files and checksums),
:mod:`~mxfp16.inference.formats` (a writer and a reader per model format:
MXNet's symbol and parameters, ONNX),
:mod:`~mxfp16.inference.agreement` (export against float32),
:mod:`~mxfp16.inference.preprocess` (the test loader's view of an image, in
numpy), :mod:`~mxfp16.inference.export` (``mxfp16 export``) and
:mod:`~mxfp16.inference.predict` (``mxfp16 predict``). ``mxfp16 bench
--mode inference`` times what :func:`~mxfp16.inference.convert.deployable`
makes (and, with ``--onnxruntime``, its ONNX file). The names below load on
first use, so importing this package does not load MXNet, and ``Predictor``
runs an ONNX export where MXNet is not installed. See ``docs/inference.md``.
"""
from .._lazy import exports

_EXPORTS = {
    "export_run": "export", "ExportError": "bundle", "AgreementError": "agreement", "Predictor": "predict",
    "image_files": "predict", "deployable": "convert", "load_block": "convert", "compare": "agreement",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = exports(__name__, _EXPORTS, mxnet_free=("bundle", "agreement", "predict"))
