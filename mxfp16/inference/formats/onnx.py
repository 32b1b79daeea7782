"""The ONNX format: ``model.onnx`` (float32) and, when asked, ``model-float16.onnx``, run by onnxruntime.

Writing needs MXNet, onnx and onnxruntime: the float32 graph is checked
operator by operator against MXNet 1.9.1's exporter (``mxnet.onnx``) before
anything is converted, and float16 is made from it by onnxruntime's own
converter (AMP's ``amp_cast`` nodes have no ONNX converter). What the
exporter needs is ``docs/inference.md`` ("What MXNet 1.9.1's ONNX exporter
needs"); its private graph builder, and both changes to it, are
``mxfp16._internals.mx2onnx_graph``'s. Reading needs only onnxruntime and
numpy: :func:`load` checks the file before onnxruntime sees it and runs one
blank image; ``docs/inference.md`` ("Predicting") says why each check.
"""
import importlib.util
import json
import re
import time
from pathlib import Path

import numpy as np

from ...plumbing.onnx_file import ONNXFileError, check_model_bytes
from ...plumbing.output import atomic_write, shown
from .. import bundle
from ..agreement import check_margin, check_scores, compare
from ..bundle import AGAIN, ExportError

__all__ = ["NAME", "SUMMARY", "DEFAULT_PRECISION", "OPSET", "IR_VERSION", "FILES", "DTYPES", "INPUT_NAME",
           "OUTPUT_NAME", "check_request", "check_exporter", "unsupported_operators", "from_block", "to_onnx",
           "to_float16", "write", "check", "seconds", "load", "Model", "execution_providers"]

NAME = "onnx"
SUMMARY = "ONNX opset 13 for onnxruntime (model.onnx in float32; model-float16.onnx with --onnx-dtype float16)"
#: The only precision an ONNX export is made in: the float32 graph (float16 is a file made from it).
DEFAULT_PRECISION = "float32"
#: The opset the graph is built for and declares: the exporter's converters are written for opsets 12 and 13.
OPSET = 13
#: The IR version opset 13 came with; onnxruntime releases back to 1.19 (Python 3.8) read it.
IR_VERSION = 7
#: The file of each dtype.
FILES = {"float32": "model.onnx", "float16": "model-float16.onnx"}
DTYPES = tuple(FILES)
INPUT_NAME = "data"
OUTPUT_NAME = "logits"
#: Protocol buffers cannot hold a message over 2 GiB; such a model would need onnx's external-data files.
_MAX_BYTES = 2 ** 31 - 1
#: Operators of MXNet's AMP, and why they cannot go to ONNX.
_AMP_OPERATORS = ("amp_cast", "amp_multicast")


def check_request(precision, dtypes):
    """Refuse what an ONNX export cannot be, before minutes of work: a missing exporter, a precision, a dtype.

    Parameters
    ----------
    precision : str or None
        Only ``float32`` (or ``None``): MXNet's exporter has no converter for AMP's casts, and onnxruntime runs no
        bfloat16 on a CPU.
    dtypes : sequence of str
        The model files wanted, from :data:`DTYPES`.

    Raises
    ------
    ExportError
        The message names what to ask for instead.
    """
    check_exporter()
    if precision not in (None, DEFAULT_PRECISION):
        raise ExportError(f"--precision {precision} with --format onnx: an ONNX export is written from the float32 "
                          "graph (MXNet's ONNX exporter has no converter for AMP's casts, and onnxruntime runs "
                          "no bfloat16 on a CPU). Leave --precision out, and add --onnx-dtype float16 for a "
                          "float16 file (for GPUs)")
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        raise ExportError(f"--onnx-dtype {', '.join(unknown)}: choose from {', '.join(DTYPES)} (onnxruntime runs no "
                          "bfloat16 on a CPU)")


def check_exporter():
    """Refuse a missing onnx or onnxruntime, or an onnx without ``onnx.mapping`` (1.19 and later), which MXNet
    1.9.1's exporter needs: :class:`ExportError` names the install that works."""
    missing = [name for name in ("onnx", "onnxruntime") if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(f"--format onnx needs {' and '.join(missing)}: pip install -c constraints.txt "
                          "'mxfp16[onnx]'")
    import onnx

    if importlib.util.find_spec("onnx.mapping") is None:
        raise ExportError(f"onnx {onnx.__version__} has no onnx.mapping, which MXNet 1.9.1's ONNX exporter uses "
                          "(onnx 1.19 removed it): pip install -c constraints.txt 'mxfp16[onnx]' installs the onnx "
                          "tested here")


def _layer(node_name):
    """The Gluon layer a graph node belongs to: its name without the ``_fwd`` Gluon appends."""
    return node_name[:-len("_fwd")] if node_name.endswith("_fwd") else node_name


def unsupported_operators(symbol):
    """Every operator of ``symbol`` the exporter cannot convert, with its layer and the reason.

    Returns
    -------
    list of (str, str, str)
        ``(operator, layer, reason)`` in graph order; empty when all convert.
    """
    from mxnet.onnx import get_operator_support

    supported = set(get_operator_support(OPSET))
    found = []
    for node in json.loads(symbol.tojson())["nodes"]:
        op = node["op"]
        if op == "null" or op in supported:
            continue
        if op in _AMP_OPERATORS:
            reason = ("it is an AMP cast, and ONNX has no converter for those: export the float32 network (mxfp16 "
                      "export --format onnx does) and ask for float16 with --onnx-dtype float16")
        elif op.startswith(("_np", "_npi", "_npx")):
            reason = ("it is a numpy-mode (mx.np) operator, and MXNet 1.9.1's exporter converts only mx.nd/mx.sym "
                      "operators: build the network without npx.set_np()")
        else:
            reason = ("MXNet 1.9.1's exporter has no converter for it (mxnet.onnx.get_operator_support() lists "
                      "those it has): build that layer from operators it covers, or export --format mxnet")
        found.append((op, _layer(node["name"]), reason))
    return found


def from_block(net, input_shape):
    """A Gluon network of your own as a checked float32 ONNX model (opset 13): what ``mxfp16 export`` writes.

    ::

        model = from_block(net, (3, 32, 32))          # onnx.ModelProto; to_float16(model) for GPUs
        onnx.save(model, "net.onnx")

    Parameters
    ----------
    net : gluon.HybridBlock
        Initialised, with float32 parameters, taking one float32 NCHW batch.
    input_shape : tuple of int
        One input without the batch axis.

    Raises
    ------
    ExportError
        A float16 or AMP-converted network, or an operator without a converter (named with its layer).
    """
    from ...precision import resolve_precision
    from ..convert import deployable

    try:
        model = deployable(net, resolve_precision("float32", "cpu"))
    except ValueError as err:
        raise ExportError(f"{err}; an ONNX export starts from the float32 network (float16 comes after: "
                          "to_float16)") from None
    return to_onnx(model.symbol, model.params, input_shape)


def to_onnx(symbol, params, input_shape):
    """A float32 MXNet graph as an ONNX model for opset 13, checked.

    Parameters
    ----------
    symbol : mx.sym.Symbol
        One input, ``data``; float32 throughout (no ``amp_cast``).
    params : dict
        ``{'arg:<name>' or 'aux:<name>' or '<name>': NDArray}``.
    input_shape : tuple of int
        One input's shape without the batch axis, ``(3, H, W)``; the ONNX input's batch axis is free.

    Returns
    -------
    onnx.ModelProto

    Raises
    ------
    ExportError
        An operator without a converter, or a converter that fails, named with its layer.
    """
    from onnx import helper, numpy_helper

    from ..._internals import mx2onnx_graph

    check_exporter()
    refused = unsupported_operators(symbol)
    if refused:
        op, layer, reason = refused[0]
        others = sorted({o for o, _, _ in refused[1:]} - {op})
        more = f" ({len(refused) - 1} more node(s){': ' + ', '.join(others) if others else ''})" if refused[1:] else ""
        raise ExportError(f"cannot export to ONNX: operator {op} of layer {layer}{more}: {reason}. Nothing was "
                          "written")
    weights = {name.split(":", 1)[-1]: value for name, value in params.items()}
    converted = []  # the nodes the exporter reached: the last one is where it failed
    try:
        graph = mx2onnx_graph(symbol, weights, input_shape, OPSET, converted.append)
    except (AttributeError, NotImplementedError, ValueError, KeyError, IndexError, AssertionError, TypeError) as err:
        where = (f"operator {converted[-1]['op']} of layer {_layer(converted[-1]['name'])}" if converted
                 else "the graph")
        reason = " ".join(str(err).split())[:300]
        raise ExportError(f"cannot export to ONNX: MXNet 1.9.1's exporter failed on {where}: {reason}. Build that "
                          "layer from operators it covers, or export --format mxnet. Nothing was written") from None
    initializers = [numpy_helper.from_array(numpy_helper.to_array(t), t.name) for t in graph.initializer]
    names = {t.name for t in initializers}
    inputs = [i for i in graph.input if i.name not in names]
    if [i.name for i in inputs] != [INPUT_NAME] or len(graph.output) != 1:
        raise ExportError(f"cannot export to ONNX: the graph has inputs {[i.name for i in inputs]} and "
                          f"{len(graph.output)} outputs; mxfp16 exports one input, {INPUT_NAME!r}, and one output")
    _rename(graph, graph.output[0].name, OUTPUT_NAME)
    del graph.input[:], graph.initializer[:]
    graph.input.extend(inputs)
    graph.initializer.extend(initializers)
    graph.name = "mxfp16"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name="mxfp16")
    _check(model)
    return model


def _rename(graph, old, new):
    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        node.output[:] = [new if name == old else name for name in node.output]
    for value in graph.output:
        if value.name == old:
            value.name = new


def _check(model):
    import onnx

    if model.ByteSize() > _MAX_BYTES:
        raise ExportError(f"the ONNX model would be {model.ByteSize() / 2 ** 30:.1f} GiB, over the 2 GiB a single "
                          "ONNX file can hold; export --format mxnet")
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise ExportError(f"the ONNX model fails onnx's checker for opset {OPSET}: {str(err).splitlines()[0]}; "
                          "export --format mxnet") from None


def to_float16(model):
    """``model`` with float16 weights and arithmetic, float32 inputs and outputs (onnxruntime's converter).

    The converter clips weights to float16's range; the agreement check catches what that, or a float16
    overflow of the activations, does to the scores.
    """
    from onnxruntime.transformers.float16 import convert_float_to_float16

    converted = convert_float_to_float16(model, keep_io_types=True)
    _sort_nodes(converted.graph)  # the converter appends the input casts last; ONNX wants producers first
    _check(converted)
    return converted


def _sort_nodes(graph):
    """Order ``graph``'s nodes so each comes after the nodes whose outputs it reads (stable otherwise)."""
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        rest = []
        for node in pending:
            (ordered if all(name in ready for name in node.input) else rest).append(node)
            if ordered and ordered[-1] is node:
                ready.update(node.output)
        if len(rest) == len(pending):
            raise ExportError("the float16 ONNX graph has a cycle or reads a value nothing produces; export float32 "
                              "only (drop --onnx-dtype float16)")
        pending = rest
    nodes = [type(node)() for node in ordered]
    for copy, node in zip(nodes, ordered):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(nodes)


def write(folder, model, options):
    """Write ``model.onnx`` (always) and the other ``options.dtypes``' files of a float32 ``model``: ``(files,
    section)``, as :mod:`mxfp16.inference.formats` says."""
    import onnx
    import onnxruntime

    check_request(model.precision.name, options.dtypes)  # a direct call gets the refusals export_run gives
    wanted = ["float32"] + [d for d in DTYPES if d in options.dtypes and d != "float32"]
    models, seconds, files = {}, {}, {}
    for dtype in wanted:
        start = time.perf_counter()
        models[dtype] = (to_onnx(model.symbol, model.params, options.input_shape) if dtype == "float32"
                         else to_float16(models["float32"]))
        seconds[dtype] = time.perf_counter() - start
        path = folder / FILES[dtype]
        with atomic_write(path, "wb") as handle:
            handle.write(models[dtype].SerializeToString())
        files[FILES[dtype]] = dict(bundle.file_entry(path), dtype=dtype)
    section = {
        "opset": OPSET, "ir_version": IR_VERSION, "files": {d: FILES[d] for d in wanted},
        "input": {"name": INPUT_NAME, "dtype": "float32"}, "output": {"name": OUTPUT_NAME, "dtype": "float32"},
        "exporter": "mxnet.onnx (mx2onnx) of MXNet 1.9.1, from the float32 graph",
        "float16_converter": ("onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)"
                              if "float16" in wanted else None),
        "conversion_seconds": seconds, "onnx_version": onnx.__version__,
        "onnxruntime_version": onnxruntime.__version__,
        "load_with": "onnxruntime.InferenceSession('model.onnx').run(None, {'data': images})[0]",
    }
    return files, section


def check(folder, files, section, inputs):
    """Every ONNX file of a staged export against the float32 network, in onnxruntime; refuse on the first miss.

    Each file is loaded by :func:`load`, as ``mxfp16 predict`` loads it, and
    must keep the top-1 margin and its dtype's score tolerance
    (:func:`mxfp16.inference.agreement.check_scores`).

    Returns
    -------
    dict
        The float32 file's :func:`~mxfp16.inference.agreement.compare`
        result, and every file's under ``by_dtype``, each with its file,
        where it ran, the margin and the score tolerance applied.

    Raises
    ------
    mxfp16.inference.agreement.AgreementError
    """
    from ...devices import format_ctx

    results = {}
    for dtype, name in section["files"].items():
        candidate = load(folder, {"files": files, NAME: section, "classes": inputs.classes,
                                  "image_size": inputs.image_size}, ctx=format_ctx([inputs.device]), dtype=dtype)
        inputs.log(f"export: agreement check of {name} in onnxruntime ({candidate.provider}) on "
                   f"{inputs.loaders.num_test} test images ...")
        result = compare(inputs.reference, candidate, inputs.loaders.test_batches(), inputs.device)
        inputs.log("export: {}: top-1 float32 {:.2f}%, onnx {:.2f}%; {} of {} top-1 predictions changed; largest "
                   "score difference {:.3g} (largest float32 score {:.3g})".format(
                       name, 100 * result["top1_float32"], 100 * result["top1_export"], result["changed_images"],
                       result["images"], result["max_score_difference"], result["max_abs_score_float32"]))
        allowed = check_scores(result, dtype, name)
        check_margin(result, inputs.margin, f"{dtype} ONNX")
        result.update(file=name, margin_points=inputs.margin, score_tolerance=allowed, emulated=False,
                      computed=f"onnxruntime {section['onnxruntime_version']}, {candidate.provider}")
        results[dtype] = result
    return dict(results["float32"], by_dtype=results)


def seconds(writing, checking):
    """``export.json``'s ``seconds``: the conversion (with the writing) and the check, apart."""
    return {"convert_and_write": writing, "agreement_check": checking}


def execution_providers(ctx="auto"):
    """onnxruntime's execution providers for ``--ctx``: CUDA for ``gpu:N`` (and ``auto`` where it has it), else CPU.

    Raises
    ------
    mxfp16.devices.DeviceError
        An unreadable ``ctx``, or a GPU asked of an onnxruntime without CUDA.
    """
    import onnxruntime

    from ...devices import DeviceError

    text = str(ctx).strip().lower()
    cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    if text == "cpu" or (text == "auto" and not cuda):
        return ["CPUExecutionProvider"]
    device = 0 if text in ("auto", "gpu") else None
    if text.startswith("gpu:") and text[4:].isdigit():
        device = int(text[4:])
    if device is None:
        raise DeviceError(f"cannot read device {ctx!r}; an ONNX export runs on one device: auto, cpu or gpu:N")
    if not cuda:
        raise DeviceError(f"--ctx {ctx}: this onnxruntime ({onnxruntime.__version__}) has no CUDA execution "
                          "provider; pip install onnxruntime-gpu on a GPU machine, or use --ctx cpu")
    return [("CUDAExecutionProvider", {"device_id": device}), "CPUExecutionProvider"]


class Model:
    """An ONNX export loaded in onnxruntime: ``model(batch)`` maps a float32 NCHW numpy batch to float32 logits.

    Attributes
    ----------
    device : str
        ``'cpu'`` or ``'gpu:N'``.
    dtype : str
        ``'float32'`` or ``'float16'``: which file runs.
    provider : str
        The execution provider onnxruntime chose.
    """

    #: ``mxfp16.inference.agreement.compare`` feeds it numpy batches.
    numpy_input = True

    def __init__(self, data, dtype, ctx="auto", threads=None, path=None):
        import onnxruntime

        from ...machine.environment import plan_threads

        providers = execution_providers(ctx)
        options = onnxruntime.SessionOptions()
        # The thread count mxfp16 plans for MXNet (--threads, OMP_NUM_THREADS or every core) applies here too.
        options.intra_op_num_threads = int(threads or plan_threads().threads)
        options.log_severity_level = 3  # errors only: its warnings concern graph rewrites, not results
        self._name = shown(path) if path is not None else f"the {dtype} ONNX model"
        try:
            self._session = onnxruntime.InferenceSession(data, sess_options=options, providers=providers)
        except Exception as err:  # onnxruntime's errors share no base class but Exception
            raise ExportError(f"{self._name} cannot be loaded by onnxruntime ({_failure(err)}); {AGAIN}") from None
        self.provider = self._session.get_providers()[0]
        self.device = "cpu" if self.provider == "CPUExecutionProvider" else f"gpu:{providers[0][1]['device_id']}"
        self.dtype = dtype

    def __call__(self, batch):
        try:
            return self._session.run(None, {INPUT_NAME: np.ascontiguousarray(batch, dtype=np.float32)})[0]
        except Exception as err:  # any onnxruntime error, as in __init__
            raise ExportError(f"{self._name} failed in onnxruntime on a batch of shape {tuple(np.shape(batch))} "
                              f"({_failure(err)}); {AGAIN}") from None

    def check_outputs(self, classes, image_size):
        """Refuse a model that does not give one score per class of ``classes`` for an image of ``image_size``.

        It runs one blank image: what it computes is what predict labels, whatever shapes its graph declares.
        """
        inputs, outputs = self._session.get_inputs(), self._session.get_outputs()
        if [i.name for i in inputs] != [INPUT_NAME] or len(outputs) != 1:
            raise ExportError(f"{self._name} has {len(inputs)} input(s) and {len(outputs)} output(s), not the one "
                              f"input named {INPUT_NAME!r} and one output of an mxfp16 export; {AGAIN}")
        scores = self(np.zeros((1, 3, image_size, image_size), dtype=np.float32))
        if np.shape(scores) != (1, len(classes)):
            raise ExportError(f"export.json lists {len(classes)} classes but {self._name} gives "
                              f"{np.shape(scores)[-1] if np.ndim(scores) else '?'} scores per image "
                              f"(output of shape {tuple(np.shape(scores))} for one image); the labels would not be "
                              f"the model's. {AGAIN[0].upper()}{AGAIN[1:]}")


def _failure(err):
    """What kind of failure onnxruntime reports (``invalid graph`` ...), not its text, which quotes the model."""
    kind = re.search(r"\[ONNXRuntimeError\] : \d+ : ([A-Z_]+)", str(err))
    return kind.group(1).lower().replace("_", " ") if kind else type(err).__name__


def load(folder, info, ctx="auto", dtype=None, threads=None):
    """The ``dtype`` model of an ONNX export (default float32), checked against ``info`` and loaded.

    Imports onnxruntime, protobuf and numpy only: no MXNet, no onnx. With ``classes`` and ``image_size`` in
    ``info``, the model must give one score per class.

    Raises
    ------
    ExportError
        No such dtype, a changed or missing file, a model onnxruntime refuses or that fails the checks, or
        onnxruntime missing.
    mxfp16.devices.DeviceError
        See :func:`execution_providers`.
    """
    if importlib.util.find_spec("onnxruntime") is None:
        raise ExportError(f"{folder} is an ONNX export; running it needs onnxruntime: pip install -c "
                          "constraints.txt 'mxfp16[onnx]'")
    dtype = dtype or "float32"
    files = (info.get(NAME) or {}).get("files") or {}
    if dtype not in files:
        raise ExportError(f"{folder} has no {dtype} ONNX model (it has {', '.join(files) or 'none'}); export it "
                          f"with --onnx-dtype {dtype}")
    path = Path(folder) / files[dtype]
    data = bundle.read_verified(folder, info, files[dtype])
    try:
        check_model_bytes(data, path, AGAIN)
    except ONNXFileError as err:
        raise ExportError(str(err)) from None
    model = Model(data, dtype, ctx, threads, path)
    if info.get("classes") is not None and info.get("image_size") is not None:
        model.check_outputs(info["classes"], int(info["image_size"]))
    return model
