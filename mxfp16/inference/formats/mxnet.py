"""The MXNet format: ``model-symbol.json`` and ``model-0000.params``, as ``HybridBlock.export`` writes them.

Writing and checking the two files is :mod:`mxfp16.inference.bundle`'s
(:func:`~mxfp16.inference.bundle.write_model`,
:func:`~mxfp16.inference.bundle.read_model`); this module is the format's
face: a writer for ``mxfp16 export`` and a reader that runs the graph in a
hybridized ``SymbolBlock`` (:func:`mxfp16.inference.convert.load_block`).
"""
from .. import bundle

__all__ = ["NAME", "SUMMARY", "write", "load", "Model"]

NAME = "mxnet"
SUMMARY = "MXNet symbol and parameters (model-symbol.json, model-0000.params), any precision"


def write(folder, model):
    """Write ``model`` (a :class:`~mxfp16.inference.convert.Deployable`); returns ``(files, section)``."""
    section = {"files": {"symbol": bundle.SYMBOL_FILE, "params": bundle.PARAMS_FILE}, "load_with": bundle.LOAD_WITH}
    return bundle.write_model(folder, model), section


class Model:
    """A loaded MXNet export: ``model(batch)`` maps a float32 NCHW numpy batch to float32 logits.

    Attributes
    ----------
    block : gluon.SymbolBlock
    device : str
        ``'cpu'`` or ``'gpu:N'``.
    dtype : str
        What the layers compute in (``export.json``'s ``compute_dtype``).
    """

    #: ``mxfp16.inference.agreement.compare`` feeds it numpy batches.
    numpy_input = True

    def __init__(self, block, context, dtype):
        self.block, self._context, self.dtype = block, context, dtype
        from ...devices import format_ctx

        self.device = format_ctx([context])

    def __call__(self, batch):
        import mxnet as mx

        from ...casting import to_float32

        return to_float32(self.block(mx.nd.array(batch, ctx=self._context))).asnumpy()


def load(folder, info, ctx="auto", dtype=None):
    """The export in ``folder`` (its files checked against ``info`` first) on one device.

    Raises
    ------
    ExportError
        Changed or missing files, a ``dtype`` other than the export's own, or
        a float16 export on a CPU (MXNet has no float16 convolution there).
    mxfp16.devices.DeviceError
        An unreadable ``ctx``, or a GPU MXNet cannot see.
    """
    from ...machine.stack import import_mxnet

    import_mxnet()  # first: where MXNet is missing, the message names the install
    from ...devices import resolve_devices
    from ..convert import load_block

    context = resolve_devices(ctx)[0]
    if dtype not in (None, info["compute_dtype"]):
        raise bundle.ExportError(f"{folder} is an MXNet export in {info['precision']}: it holds no {dtype} model "
                                 "to choose (--onnx-dtype is for ONNX exports)")
    if info["compute_dtype"] == "float16" and context.device_type == "cpu":
        raise bundle.ExportError(
            f"{folder} is a {info['precision']} export and MXNet has no float16 convolution on a CPU; predict on a "
            "GPU (--ctx gpu:0), or export the run as amp-bfloat16 or float32 for CPUs")
    symbol, params = bundle.read_model(folder, info)
    return Model(load_block(symbol, params, context), context, info["compute_dtype"])

