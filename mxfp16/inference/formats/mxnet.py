"""The MXNet format: ``model-symbol.json`` and ``model-0000.params``, as ``HybridBlock.export`` writes them.

Writing and checking the two files is :mod:`mxfp16.inference.bundle`'s; this module is the format's face: a
writer for ``mxfp16 export``, its agreement check, and a reader that runs the graph in a hybridized
``SymbolBlock`` (:func:`mxfp16.inference.convert.load_block`).
"""
from .. import bundle
from ..agreement import check_margin, compare

__all__ = ["NAME", "SUMMARY", "DEFAULT_PRECISION", "check_request", "write", "check", "seconds", "load", "Model"]

NAME = "mxnet"
SUMMARY = "MXNet symbol and parameters (model-symbol.json, model-0000.params), any precision"
#: float16 on a GPU, amp-bfloat16 on a CPU with bfloat16, else float32 (:func:`mxfp16.precision.resolve_precision`).
DEFAULT_PRECISION = "auto"


def check_request(precision, dtypes):
    """Refuse model-file dtypes: an MXNet export holds one model, in its precision (any precision is taken).

    Raises
    ------
    ExportError
        ``dtypes`` holds anything but float32 (``onnx_dtypes`` of an ONNX
        export); the message names the fix.
    """
    others = [d for d in dtypes if d != "float32"]
    if others:
        raise bundle.ExportError(f"--onnx-dtype {', '.join(others)} is for --format onnx; for an MXNet export use "
                                 "--precision (in Python, onnx_dtypes is for model_format='onnx'; precision sets "
                                 "an MXNet export's dtype)")


def write(folder, model, options):
    """Write ``model`` (a :class:`~mxfp16.inference.convert.Deployable`); returns ``(files, section)``.

    ``options`` changes nothing: the graph takes any batch and image size, and :func:`check_request` has refused
    other dtypes.
    """
    section = {"files": {"symbol": bundle.SYMBOL_FILE, "params": bundle.PARAMS_FILE}, "load_with": bundle.LOAD_WITH}
    return bundle.write_model(folder, model), section


def check(folder, files, section, inputs):
    """The staged files, read back as a user reads them, against the float32 network; refuse beyond the margin.

    Where this machine cannot run the export's precision (float16 on a CPU: MXNet has no float16 convolution
    there), the float32 graph runs with the export's float16-rounded weights, and the record says so
    (``emulated``).

    Returns
    -------
    dict
        :func:`~mxfp16.inference.agreement.compare`'s result with ``margin_points``, ``computed`` (what ran
        where) and ``emulated``.

    Raises
    ------
    mxfp16.inference.agreement.AgreementError
    """
    from ...devices import format_ctx
    from ..convert import load_block

    symbol, params = bundle.read_model(folder, {"image_size": inputs.image_size, "classes": inputs.classes})
    precision, device = inputs.precision, inputs.device
    emulated = precision.compute_dtype == "float16" and device.device_type == "cpu"
    if emulated:
        candidate = _emulated_candidate(inputs.reference, inputs.net, params, device)
        how = ("emulated: this CPU has no float16 convolution, so the float32 graph ran with the export's "
               "float16-rounded weights; activations were not rounded. Run the check on a GPU for the real one")
        inputs.log(f"export: {how}")
    else:
        candidate, how = load_block(symbol, params, device), f"{precision.name} on {format_ctx([device])}"
    inputs.log(f"export: agreement check on {inputs.loaders.num_test} test images of {inputs.data} ...")
    result = compare(inputs.reference, candidate, inputs.loaders.test_batches(), device)
    result.update(margin_points=inputs.margin, computed=how, emulated=emulated)
    inputs.log("export: top-1 float32 {:.2f}%, export {:.2f}% ({:+.2f} points); {} of {} top-1 predictions changed "
               "({:.2f}%); largest probability difference {:.4f}".format(
                   100 * result["top1_float32"], 100 * result["top1_export"], 0.0 - result["top1_drop_points"] + 0.0,
                   result["changed_images"], result["images"], 100 * result["changed_share"],
                   result["max_probability_difference"]))
    check_margin(result, inputs.margin, precision.name)
    return result


def _emulated_candidate(reference, source, params, ctx):
    """The float32 graph with the export's weights rounded as stored (float16), computed in float32.

    A float16 network is built second, so its parameter names carry another
    prefix (``resnetv21_`` beside ``resnetv20_``); the structural names,
    the same in both, pair them.
    """
    from ...train.outputs import structural_names
    from ..convert import load_block, traced

    ref = structural_names(reference)
    rename = {p.name: ref[key].name for key, p in structural_names(source).items()}
    weights = {f"{key[:4]}{rename[key[4:]]}": value.astype("float32") for key, value in params.items()}
    return load_block(traced(reference)[0], weights, ctx)


def seconds(writing, checking):
    """``export.json``'s ``seconds``: the whole export, conversion and check (as MXNet exports always recorded it)."""
    return {"export": writing + checking}


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
        Changed or missing files, a ``dtype`` other than the export's own, or a float16 export on a CPU (MXNet
        has no float16 convolution there).
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

