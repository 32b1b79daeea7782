"""Which dtype every GluonCV classification model computes in under mxfp16's AMP lists, read from its graph.

The "models" view of ``mxfp16 info --amp-table``: each model is built with AMP
active and traced on a symbol (no weights, no arithmetic: any CPU).
"""
import json

import numpy as np

from .._internals import gluoncv_model_modules
from ..plumbing.output import error_line
from .table import _amp_on, operator_dtypes
from .wrappers import is_low_precision

__all__ = ["TASK_MODULES", "BROKEN_IN_GLUONCV", "INPUT_SIZES", "CIFAR_SIZE", "classification_models", "families",
           "model_dtypes", "render", "generate"]

#: ``gluoncv.model_zoo`` modules (and packages) whose models are not image
#: classifiers: detection, segmentation, pose, action recognition, depth,
#: tracking, and the int8 models (inference only).
TASK_MODULES = ("action_recognition", "alpha_pose", "center_net", "danet", "deeplabv3", "deeplabv3b_plus",
                "fastscnn", "fcn", "icnet", "monodepthv2", "pspnet", "quantized", "rcnn", "siamrpn",
                "simple_pose", "ssd", "yolo.yolo3")

#: Classification models GluonCV 0.10.5 registers but cannot build with MXNet 1.9.1, in float32 either: their
#: GroupNorm passes ``F.reshape`` arguments by position (``tests/test_amp_zoo.py`` checks they still fail).
BROKEN_IN_GLUONCV = {
    "resnet50_v1b_gn": "Invalid Parameter format for keep_highest expect boolean but value='-1'",
    "resnet101_v1b_gn": "Invalid Parameter format for keep_highest expect boolean but value='-1'",
}

#: Square input sizes tried in turn for shape inference: ImageNet's, then Inception's; ``cifar_`` models read 32 px.
INPUT_SIZES = (224, 299)
CIFAR_SIZE = 32

#: Operators whose multiply-adds are counted (GEMMs: where 16-bit arithmetic pays).
_GEMMS = ("Convolution", "FullyConnected", "Deconvolution")


def classification_models():
    """Every model ``gluoncv.model_zoo`` registers outside :data:`TASK_MODULES`, in its own order: a list of str."""
    return list(_classifier_modules())


def families():
    """``{family: [models]}``: :func:`classification_models` by the GluonCV module that builds them (``resnet``)."""
    grouped = {}
    for name, module in _classifier_modules().items():
        grouped.setdefault(module, []).append(name)
    return grouped


def _classifier_modules():
    """``{model: its module below gluoncv.model_zoo}`` for the registered models outside :data:`TASK_MODULES`."""
    classifiers = {}
    for name, module in gluoncv_model_modules().items():
        module = module.replace("gluoncv.model_zoo.", "", 1)
        if not any(module == task or module.startswith(task + ".") for task in TASK_MODULES):
            classifiers[name] = module
    return classifiers


def _output_shapes(internals, shape):
    """``{output name: shape}`` for every node output of ``internals`` at input ``shape``, or None."""
    import mxnet as mx

    try:
        arg_shapes, out_shapes, aux_shapes = internals.infer_shape_partial(data=shape)
    except mx.MXNetError:
        return None
    shapes = dict(zip(internals.list_outputs(), out_shapes))
    shapes.update(zip(internals.list_arguments(), arg_shapes))
    shapes.update(zip(internals.list_auxiliary_states(), aux_shapes))
    return shapes


def _gemm_flops(node, input_shapes, output_shape):
    """Floating-point operations (2 per multiply-add) of a Convolution, Deconvolution or FullyConnected node."""
    if not output_shape or len(input_shapes) < 2 or not input_shapes[1]:
        return 0
    # Each input pixel of a Deconvolution, each output pixel of the others, meets one weight row.
    pixels = input_shapes[0] if node["op"] == "Deconvolution" else output_shape
    return 2 * int(np.prod(pixels)) * int(np.prod(input_shapes[1][1:]))


def model_dtypes(name):
    """What ``name`` computes in, with AMP active in this process.

    Returns
    -------
    dict
        ``{'model', 'operators', 'low_operators', 'gemm_flops', 'low_gemm_flops',
        'input_size', 'output_shape'}``, or ``{'model', 'error'}`` when the
        model does not build or its graph does not type-check.
    """
    import mxnet as mx

    from ..models.gluoncv import import_gluoncv

    zoo = import_gluoncv().model_zoo
    try:
        net = zoo.get_model(name, pretrained=False)
        out = net(mx.sym.var("data"))
        out = out[0] if isinstance(out, (list, tuple)) else out
        internals = out.get_internals()
        _, types, _ = internals.infer_type_partial(data="float32")
    except Exception as err:  # a model that cannot be built or typed is this row's finding
        return {"model": name, "error": f"{type(err).__name__}: {error_line(err)}"[:300]}
    shapes, size = None, None
    for size in (CIFAR_SIZE,) if name.startswith("cifar_") else INPUT_SIZES:
        shapes = _output_shapes(internals, (1, 3, size, size))
        if shapes is not None:
            break
    nodes = json.loads(out.tojson(remove_amp_cast=False))["nodes"]
    row = {"model": name, "operators": 0, "low_operators": 0, "gemm_flops": 0, "low_gemm_flops": 0,
           "input_size": size if shapes is not None else None,
           "output_shape": list(shapes[out.list_outputs()[0]]) if shapes else None}

    def entry_name(entry):
        node = nodes[entry[0]]
        return node["name"] if node["op"] == "null" else f"{node['name']}_output" + (
            str(entry[1]) if entry[1] else "")

    operators = [node for node in nodes if node["op"] not in ("null", "amp_cast", "amp_multicast")]
    for node, (_, dtype) in zip(operators, operator_dtypes(out, internals, types, nodes)):
        low = dtype is not None and is_low_precision(dtype)
        row["operators"] += 1
        row["low_operators"] += int(low)
        if node["op"] in _GEMMS and shapes is not None:
            output = shapes.get(f"{node['name']}_output")
            flops = _gemm_flops(node, [shapes.get(entry_name(e)) for e in node["inputs"]], output)
            row["gemm_flops"] += flops
            row["low_gemm_flops"] += flops if low else 0
    return row


def _share(part, whole):
    return f"{100.0 * part / whole:.0f}%" if whole else "n/a"


def render(rows_by_target):
    """The Markdown models view: ``rows_by_target`` is ``{'bfloat16': rows, 'float16': rows}``."""
    import mxnet as mx

    targets = list(rows_by_target)
    lines = [f"Generated by `mxfp16 info --amp-table models` (MXNet {mx.__version__}, mxfp16's operator lists). "
             "Per model: its operators, the share that compute in 16-bit, and the share of the "
             "convolutions' and dense layers' floating-point work (GFLOP per image, forward, at the input "
             "size shown) that runs in 16-bit.",
             "",
             "| Model | input | operators | GFLOP | " + " | ".join(
                 f"{t}: operators in 16-bit | {t}: GFLOP in 16-bit" for t in targets) + " |",
             "| --- | --- | --- | --- | " + " | ".join("--- | ---" for _ in targets) + " |"]
    first = rows_by_target[targets[0]]
    others = {t: {r["model"]: r for r in rows_by_target[t]} for t in targets}
    not_classifiers = [r["model"] for r in first if r.get("output_shape") and len(r["output_shape"]) != 2]
    for row in first:
        if row["model"] in not_classifiers:
            continue
        name = row["model"]
        cells = []
        for t in targets:
            r = others[t].get(name, {"error": "not built"})
            if "error" in r and name in BROKEN_IN_GLUONCV:
                cells += ["GluonCV cannot build it with MXNet 1.9.1 (float32 neither)", ""]
            elif "error" in r:
                cells += [f"FAILS: {r['error'].replace('|', '/')}", ""]
            else:
                cells += [_share(r["low_operators"], r["operators"]), _share(r["low_gemm_flops"], r["gemm_flops"])]
        if "error" in row:
            size, count, gflop = "", "", ""
        else:
            size = f"{row['input_size']} px" if row["input_size"] else "n/a"
            count, gflop = str(row["operators"]), f"{row['gemm_flops'] / 1e9:.2f}"
        lines.append(f"| {name} | {size} | {count} | {gflop} | " + " | ".join(cells) + " |")
    if not_classifiers:
        lines += ["", "Built and type-checked as well, but not classifiers (their output is not one score per "
                      f"class): {', '.join(not_classifiers)}."]
    return "\n".join(lines) + "\n"


def generate(targets=("bfloat16", "float16"), names=None):
    """``{target: rows}``: :func:`model_dtypes` of each model (default: all), one process per target, side by side.

    Raises ``RuntimeError`` when a child failed.
    """
    from concurrent.futures import ThreadPoolExecutor

    from ..plumbing.child import call_in_child

    # Threads only wait: each child is its own process, and they build side by side.
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        done = dict(zip(targets, pool.map(lambda t: call_in_child(_rows_under, [t, names or None]), targets)))
    for target, (rows, problem) in done.items():
        if rows is None:
            raise RuntimeError(f"building the zoo under amp-{target} failed: {problem}")
    return {target: rows for target, (rows, _) in done.items()}


def _rows_under(spec):
    """In generate's child: the rows under ``spec``'s target, ``[target, names or None]``."""
    target, names = spec
    _amp_on(target)
    return [model_dtypes(name) for name in (names or classification_models())]
