"""Find which MXNet operators have a working bfloat16 path on this CPU, and which join mixed dtypes, by running them.

MXNet's AMP lists (``mxnet/contrib/amp/lists/symbol_bf16.py``) name the
operators cast to bfloat16, those cast to float32, and those that accept
either; every other operator runs in whatever dtype arrives. Many of those
others have no bfloat16 CPU kernel (``dot``, ``batch_dot`` ...), so a
bfloat16 tensor reaching them stops training with an MXNetError. This
script runs each operator, once in float32 and once with bfloat16 inputs,
forward and backward, and sorts it:

* ``bfloat16``: ran, and matched float32 within bfloat16's precision;
* ``float32``: float32 ran but bfloat16 failed or disagreed (no kernel);
* ``unprobed``: no input it knows made even float32 run (the operator needs
  particular shapes, integer indices or parameters).

It runs four groups of operators:

1. MXNet's operators whose dtype follows their inputs under AMP's bfloat16
   lists (unlisted ones, and ``WIDEST_TYPE_CASTS``): their verdicts decide
   what :mod:`mxfp16.amp.lists` runs in float32 (``BFLOAT16``, ``FLOAT32``,
   ``UNPROBED``);
2. the numpy-mode operators that are not another name of a legacy one
   (``_np_dot``, ``_npi_add``): the same three verdicts, which
   :mod:`mxfp16.amp.numpy_mode` applies;
3. MXNet's own float32 list: a verdict each (``MXNET_FLOAT32``), for the
   table only; they stay float32, MXNet's choice for range and precision;
4. the contrib operators GluonCV and GluonNLP call (``CLIENT_OPERATORS``,
   scanned from their sources with ``--client NAME=PATH``), with inputs made
   for each (:data:`SPECIAL`) where a generic input cannot run them.

Then the joins (``JOINS``): every operator that takes two or more data
inputs and lets its dtype follow them is given one input in the 16-bit
dtype and the rest in float32. Where MXNet's type inference then fails
(``Concat``), or, for bfloat16, the kernel fails or disagrees with float32
(numpy's ``add`` promotes float32 + float16 but has no kernel for float32 +
bfloat16), the operator is a join and :func:`mxfp16.amp.lists.join_operators`
casts its inputs to the widest dtype first.

``mxfp16/amp/op_verdicts.json`` holds the output (:func:`render` says what each key holds);
``tests/test_amp_layers.py`` re-probes a sample against the installed wheel. Regenerate after an MXNet
upgrade, on a CPU with avx512_bf16::

    python tools/amp_probe_ops.py --client gluoncv=$(python -c 'import gluoncv, os; \\
        print(os.path.dirname(gluoncv.__file__))') --client gluonnlp=PATH/gluon-nlp-0.10.0/src \\
        > mxfp16/amp/op_verdicts.json

Each batch of operators runs in a child process, so an operator that crashes
the process is found and recorded as ``float32`` without stopping the scan.
"""
import json
import os
import re
import subprocess
import sys

#: Input shapes tried in turn until float32 runs: matrices first (dot, gemm),
#: then batches of matrices, images and vectors.
SHAPES = [(4, 4), (2, 4, 4), (2, 3, 4, 4), (8,), (2, 3, 4, 4, 4)]
BATCH = 40

#: Operators that are not layers (optimizer updates, AMP's own casts, graph
#: plumbing) or whose output is random (no float32 reference to compare with).
NOT_LAYERS = ("shuffle", "_shuffle", "amp_cast", "amp_multicast", "reset_arrays", "multi_lars", "multi_sum_sq",
              "_CachedOpThreadSafe", "_contrib_calibrate_entropy", "_contrib_allclose")
#: Registered-name prefixes that are never layers: gradients, image decoding, sparse storage, int8.
NOT_LAYER_PREFIXES = ("_backward", "_image", "_sparse", "_contrib_quantize", "_contrib_dgl", "preloaded_")
#: Numpy-mode operators that draw random numbers (no float32 reference) or decode images.
NUMPY_NOT_LAYERS = ("_npi_random", "_np_random", "_npx__image", "_npx__random", "_npi_bernoulli", "_npi_normal",
                    "_npi_uniform", "_npi_gamma", "_npi_exponential", "_npi_choice", "_npi_multinomial",
                    "_npi_pareto", "_npi_powerd", "_npi_rayleigh", "_npi_weibull", "_npi_gumbel",
                    "_npi_logistic", "_npi_laplace", "_npi_cvim", "_npi_share_memory", "_npi_copyto",
                    "_npx_constraint_check")
NUMPY_PREFIXES = ("_np_", "_npx_", "_npi_")


def _rois(rng):
    return [[0, 1.0, 1.0, 5.0, 5.0], [0, 2.0, 0.0, 7.0, 6.0]]


#: Inputs for operators no generic input runs: ``{operator: (inputs, kwargs)}``,
#: ``inputs(rng)`` giving numpy arrays (each cast to the probed dtype) and
#: ``kwargs`` the operator's required parameters. The contrib operators GluonNLP
#: and GluonCV call, and the joins' parameters.
SPECIAL = {
    # GluonNLP's fused attention: (length, batch, heads * 3 * head units) and the scores.
    "_contrib_interleaved_matmul_selfatt_qk": (lambda rng: [rng.uniform(-1, 1, (5, 2, 2 * 3 * 4))], {"heads": 2}),
    "_contrib_interleaved_matmul_selfatt_valatt": (
        lambda rng: [rng.uniform(-1, 1, (5, 2, 2 * 3 * 4)), rng.uniform(0, 1, (2 * 2, 5, 5))], {"heads": 2}),
    "_contrib_interleaved_matmul_encdec_qk": (
        lambda rng: [rng.uniform(-1, 1, (5, 2, 2 * 4)), rng.uniform(-1, 1, (6, 2, 2 * 2 * 4))], {"heads": 2}),
    "_contrib_interleaved_matmul_encdec_valatt": (
        lambda rng: [rng.uniform(-1, 1, (6, 2, 2 * 2 * 4)), rng.uniform(0, 1, (2 * 2, 5, 6))], {"heads": 2}),
    "_contrib_div_sqrt_dim": (lambda rng: [rng.uniform(-1, 1, (2, 3, 4))], {}),
    "_contrib_arange_like": (lambda rng: [rng.uniform(-1, 1, (2, 3))], {"axis": 1}),
    # GluonCV: resizing, pooling, ROIs and boxes.
    "_contrib_BilinearResize2D": (lambda rng: [rng.uniform(-1, 1, (1, 2, 4, 4))], {"height": 7, "width": 6}),
    "_contrib_AdaptiveAvgPooling2D": (lambda rng: [rng.uniform(-1, 1, (1, 2, 6, 6))], {"output_size": 2}),
    "_contrib_ROIAlign": (lambda rng: [rng.uniform(-1, 1, (1, 2, 8, 8)), _rois(rng)],
                          {"pooled_size": (2, 2), "spatial_scale": 1.0}),
    "ROIPooling": (lambda rng: [rng.uniform(-1, 1, (1, 2, 8, 8)), _rois(rng)],
                   {"pooled_size": (2, 2), "spatial_scale": 1.0}),
    "_contrib_box_nms": (lambda rng: [[[[0, 0.9, 0, 0, 4, 4], [0, 0.8, 0.5, 0.5, 4, 4], [1, 0.7, 5, 5, 7, 8]]]],
                         {"overlap_thresh": 0.5, "id_index": 0}),
    "_contrib_box_non_maximum_suppression": (
        lambda rng: [[[[0, 0.9, 0, 0, 4, 4], [0, 0.8, 0.5, 0.5, 4, 4], [1, 0.7, 5, 5, 7, 8]]]],
        {"overlap_thresh": 0.5, "id_index": 0}),
    "_contrib_box_iou": (lambda rng: [[[0, 0, 4, 4], [1, 1, 5, 6]], [[0, 0, 3, 3], [2, 2, 6, 6], [1, 0, 4, 5]]], {}),
    "_contrib_box_encode": (lambda rng: [[[1, 0, -1]], [[0, 1, 0]], [[[0, 0, 4, 4], [1, 1, 5, 5], [2, 2, 6, 6]]],
                                         [[[0, 0, 3, 5], [1, 1, 6, 6]]], [0, 0, 0, 0], [0.1, 0.1, 0.2, 0.2]], {}),
    "_contrib_box_decode": (lambda rng: [rng.uniform(-0.5, 0.5, (1, 3, 4)),
                                         [[[2, 2, 4, 4], [3, 3, 4, 4], [4, 4, 4, 4]]]], {}),
    "_contrib_bipartite_matching": (lambda rng: [rng.uniform(0, 1, (1, 3, 4))], {"threshold": 0.1}),
    "_contrib_SyncBatchNorm": (lambda rng: [rng.uniform(-1, 1, (2, 3, 4, 4)), [1.0, 1.0, 1.0], [0.0, 0.0, 0.0],
                                            [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], {"key": "probe"}),
    # Joins (their float32 runs need these parameters).
    "Concat": (lambda rng: [rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (2, 3))], {"dim": 1}),
    "concat": (lambda rng: [rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (2, 3))], {"dim": 1}),
    "_npi_concatenate": (lambda rng: [rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (2, 3))], {"axis": 1}),
    # Shape operators mxfp16's lists let follow their input (mxfp16.amp.lists.SHAPE_OPERATORS), with the
    # parameters they need; transpose on a 4-D input, as attention heads transpose.
    "Reshape": (lambda rng: [rng.uniform(-1, 1, (2, 3, 4))], {"shape": (6, 4)}),
    "reshape": (lambda rng: [rng.uniform(-1, 1, (2, 3, 4))], {"shape": (6, 4)}),
    "SliceChannel": (lambda rng: [rng.uniform(-1, 1, (2, 4, 4))], {"num_outputs": 2, "axis": 1}),
    "split": (lambda rng: [rng.uniform(-1, 1, (2, 4, 4))], {"num_outputs": 2, "axis": 1}),
    "slice": (lambda rng: [rng.uniform(-1, 1, (2, 4, 4))], {"begin": (0, 1), "end": (2, 3)}),
    "slice_axis": (lambda rng: [rng.uniform(-1, 1, (2, 4, 4))], {"axis": 1, "begin": 1, "end": 3}),
    "expand_dims": (lambda rng: [rng.uniform(-1, 1, (2, 4, 4))], {"axis": 1}),
    "transpose": (lambda rng: [rng.uniform(-1, 1, (2, 3, 4, 4))], {"axes": (0, 2, 1, 3)}),
    # numpy-mode shape operators (their parameters have no default).
    "_np_reshape": (lambda rng: [rng.uniform(-1, 1, (2, 3, 4))], {"newshape": (6, 4)}),
    "_npi_reshape": (lambda rng: [rng.uniform(-1, 1, (2, 3, 4))], {"newshape": (6, 4)}),
    "_npx_reshape": (lambda rng: [rng.uniform(-1, 1, (2, 3, 4))], {"newshape": (6, 4)}),
    "_np_moveaxis": (lambda rng: [rng.uniform(-1, 1, (2, 3, 4))], {"source": (0,), "destination": (2,)}),
    "_np_roll": (lambda rng: [rng.uniform(-1, 1, (2, 3))], {"shift": (1,), "axis": (1,)}),
    "_npi_broadcast_to": (lambda rng: [rng.uniform(-1, 1, (1, 4))], {"shape": (3, 4)}),
    "_npi_pad": (lambda rng: [rng.uniform(-1, 1, (2, 3))], {"pad_width": ((1, 1), (1, 1))}),
    "_npi_flip": (lambda rng: [rng.uniform(-1, 1, (2, 3))], {"axis": (0,)}),
    "_npi_rot90": (lambda rng: [rng.uniform(-1, 1, (3, 4))], {"k": 1, "axes": (0, 1)}),
    "_npi_full_like": (lambda rng: [rng.uniform(-1, 1, (2, 3))], {"fill_value": 2.0}),
    "_npi_tensordot": (lambda rng: [rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (3, 4))],
                       {"a_axes_summed": (1,), "b_axes_summed": (0,)}),
    "_npi_tensordot_int_axes": (lambda rng: [rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (3, 4))], {"axes": 1}),
    "_npi_einsum": (lambda rng: [rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (3, 4))],
                    {"subscripts": "ij,jk->ik"}),
}

#: Operators a Python function stands for in the clients' sources (``F.contrib.isfinite`` is not an operator).
_CLIENT_CALL = re.compile(r"\b(?:F|nd|sym|symbol|ndarray|mx\.nd|mx\.sym|mx\.ndarray|mx\.symbol)\.contrib\.(\w+)\(")


def _op_names():
    import mxnet as mx

    return set(mx.operator.get_all_registered_operators())


def _tensor_args(name):
    import mxnet as mx

    args = mx.operator.get_operator_arguments(name)
    return [(n, t) for n, t in zip(args.names, args.types) if t.startswith("NDArray-or-Symbol")]


def _skipped(name):
    return (name in NOT_LAYERS or name.startswith(NOT_LAYER_PREFIXES) or name.startswith(NUMPY_NOT_LAYERS)
            or "update" in name)


def candidates():
    """Operators whose dtype follows their inputs under AMP's bfloat16 lists, taking tensors.

    Those AMP leaves unlisted, and those it runs in the widest of their
    inputs' dtypes (``WIDEST_TYPE_CASTS``): a bfloat16 input reaches all of
    them. The operators MXNet lists as running in either dtype
    (``BF16_FP32_FUNCS``) are taken at MXNet's word: some keep float32
    parameters beside bfloat16 data (BatchNorm), which a generic probe cannot
    feed. Numpy-mode operators have their own group (:func:`numpy_candidates`).
    """
    from mxnet.contrib.amp.lists import symbol_bf16 as L

    fixed = set(L.BF16_FUNCS) | set(L.FP32_FUNCS) | set(L.LOSS_OUTPUT_FUNCTIONS) | set(L.BF16_FP32_FUNCS)
    fixed |= {name for name, _, _ in L.CONDITIONAL_FP32_FUNCS}
    names = []
    for name in sorted(_op_names()):
        if name in fixed or name.replace("_contrib_", "") in fixed or _skipped(name):
            continue
        if name.startswith(NUMPY_PREFIXES) or not _tensor_args(name):
            continue
        if _function(name) is not None:
            names.append(name)
    return names


def numpy_candidates():
    """Numpy-mode operators that are no other name of a legacy operator, taking tensors."""
    from mxfp16.amp.numpy_mode import numpy_operators

    return [name for name, legacy in numpy_operators().items()
            if not legacy and not _skipped(name) and _tensor_args(name) and _function(name) is not None]


def mxnet_float32():
    """MXNet's bfloat16 float32 list: the registered operators in it that take tensors."""
    from mxnet.contrib.amp.lists import symbol_bf16 as L

    names = _op_names()
    random = ("_random_", "random_", "_sample_", "sample_")  # a random draw has no float32 reference
    return sorted(n for n in set(L.FP32_FUNCS) if n in names and not _skipped(n) and not n.startswith(random)
                  and _tensor_args(n) and _function(n) is not None)


def join_candidates():
    """Operators with two or more data inputs whose dtype can follow them (not cast by MXNet's lists)."""
    from mxfp16.amp.numpy_mode import numpy_operators

    from mxnet.contrib.amp.lists import symbol_bf16 as B
    from mxnet.contrib.amp.lists import symbol_fp16 as H

    cast = set(B.BF16_FUNCS) | set(B.FP32_FUNCS) | set(B.WIDEST_TYPE_CASTS) | set(B.LOSS_OUTPUT_FUNCTIONS)
    cast &= set(H.FP16_FUNCS) | set(H.FP32_FUNCS) | set(H.WIDEST_TYPE_CASTS) | set(H.LOSS_OUTPUT_FUNCTIONS)
    # A numpy-mode operator that is another name of a legacy one takes that one's rule (mxfp16.amp.numpy_mode).
    twins = {name for name, legacy in numpy_operators().items() if legacy}
    names = []
    for name in sorted(_op_names()):
        if name in cast or name in twins or _skipped(name) or _function(name) is None:
            continue
        tensors = _tensor_args(name)
        if len(_data_inputs(name, len(tensors) if tensors != [("data", "NDArray-or-Symbol[]")] else 2)) >= 2:
            names.append(name)
    return names


def _data_inputs(name, count):
    """Indices of the inputs that carry data (not the float32 parameters AMP keeps beside bfloat16 data)."""
    from mxnet.contrib.amp.lists import symbol_bf16 as L

    fp32 = L.BF16_USE_FP32_PARAMS.get(name, L.BF16_USE_FP32_PARAMS.get(name.replace("_contrib_", ""), []))
    names = [n for n, _ in _tensor_args(name)]
    return [i for i in range(count) if not (i < len(names) and names[i] in fp32 and names[i])]


def scan_clients(sources):
    """``{operator: [client, ...]}`` for the ``contrib`` operators each client's source calls.

    ``sources`` is ``{client: directory}``. A name that is no registered
    operator (``F.contrib.isfinite`` is a Python function) is left out.
    """
    names = _op_names()
    used = {}
    for client, root in sources.items():
        for folder, _, files in os.walk(root):
            for file in files:
                if not file.endswith(".py"):
                    continue
                with open(os.path.join(folder, file), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for call in _CLIENT_CALL.findall(text):
                    op = f"_contrib_{call}" if f"_contrib_{call}" in names else call
                    if op in names:
                        used.setdefault(op, set()).add(client)
    return {op: sorted(clients) for op, clients in sorted(used.items())}


def _function(name, kind="nd"):
    """The ``mx.nd`` (``kind='nd'``) or ``mx.sym`` function of operator ``name``, as AMP finds it, or None."""
    from mxfp16._internals import legacy_operator_functions, numpy_operator_functions

    root = "mxnet.ndarray" if kind == "nd" else "mxnet.symbol"
    if name.startswith(NUMPY_PREFIXES):
        homes = numpy_operator_functions(name)
    else:
        homes = legacy_operator_functions(name)  # the namespace's own home comes before its ``op`` twin
    found = [getattr(m, a) for m, a in homes if m.__name__ == root or m.__name__.startswith(root + ".")]
    return found[0] if found else None


def _numpy_scope(name):
    import contextlib

    import mxnet as mx

    if not name.startswith(NUMPY_PREFIXES):
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(mx.util.np_shape(True))
    stack.enter_context(mx.util.np_array(True))
    return stack


def _as_float32_numpy(x):
    from mxfp16.amp.wrappers import cast

    import numpy as np

    if np.dtype(x.dtype) != np.float32:
        x = cast(x, "float32")
    return x.asnumpy()


def _run(name, arrays, kwargs, dtypes):
    """Forward and backward of ``name`` on ``arrays``, input ``i`` cast to ``dtypes[i]`` (None: float32).

    Returns (output as float32 numpy, input gradients as float32 numpy or None).
    """
    from mxfp16.amp.wrappers import cast
    from mxfp16.float_formats import BFLOAT16

    import mxnet as mx
    import numpy as np
    from mxnet import autograd, nd

    fn = _function(name)
    numpy_mode = name.startswith(NUMPY_PREFIXES)
    inputs = []
    for a, dtype in zip(arrays, dtypes):
        x = nd.array(np.asarray(a, dtype=np.float32))
        x = x.as_np_ndarray() if numpy_mode else x
        inputs.append(cast(x, dtype) if dtype is not None else x)
    for x in inputs:
        x.attach_grad()
    with autograd.record():
        out = fn(*inputs, **kwargs)
        out = out[0] if isinstance(out, (list, tuple)) else out
        floating = np.dtype(out.dtype) in (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16, np.float64)
        if floating:
            loss = cast(out, "float32").sum() if np.dtype(out.dtype) != np.float32 else out.sum()
    if not floating:  # a comparison or an index: no gradient, the values are the result
        return out.asnumpy(), None
    value = _as_float32_numpy(out)
    try:
        loss.backward()
        grads = [_as_float32_numpy(x.grad) for x in inputs]
    except mx.MXNetError:
        grads = None
    return value, grads


def _agrees(low, ref):
    import numpy as np

    scale = max(float(np.abs(ref).max()), 1e-3) if ref.size else 1.0
    return low.shape == ref.shape and np.allclose(low, ref, atol=0.03 * scale, rtol=0.03, equal_nan=True)


def _first_line(err):
    """The error's last line, without what changes from run to run (time, node name, source path)."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    line = lines[-1] if lines else type(err).__name__
    line = re.sub(r"Error in operator \S+: ", "", line)
    line = re.sub(r"\[\d\d:\d\d:\d\d\] \S+:\d+: ", "", line)
    return line[:160]


def _generic_inputs(name):
    """``[(arrays, kwargs)]`` to try for ``name``: its :data:`SPECIAL` inputs, else generic shapes."""
    import numpy as np

    rng = np.random.RandomState(0)
    if name in SPECIAL:
        make, kwargs = SPECIAL[name]
        return [([np.asarray(a, dtype=np.float32) for a in make(rng)], dict(kwargs))]
    tensors = [t for _, t in _tensor_args(name)]
    # Optional tensor inputs (softmax's ``length``) are not marked as such: try the fewest inputs first.
    counts = [2] if tensors == ["NDArray-or-Symbol[]"] else range(1, len(tensors) + 1)
    return [([rng.uniform(0.1, 0.9, size=shape) for _ in range(n)], {}) for n in counts for shape in SHAPES]


def _probe_errors():
    """What a probe counts as "the operator does not run this way", not as a bug of the probe."""
    import mxnet as mx

    return (mx.MXNetError, TypeError, ValueError, IndexError, AssertionError)


def probe(name):
    """``'bfloat16'``, ``'float32'`` or ``'unprobed'`` for one operator, with the reason."""
    from mxfp16.float_formats import BFLOAT16

    import numpy as np

    errors = _probe_errors()
    with _numpy_scope(name):
        for arrays, kwargs in _generic_inputs(name):
            try:
                ref, ref_grads = _run(name, arrays, kwargs, [None] * len(arrays))
            except errors:
                continue
            if ref.size == 0:
                continue
            try:
                low, low_grads = _run(name, arrays, kwargs, [BFLOAT16] * len(arrays))
            except errors as e:
                return "float32", _first_line(e)
            shape = "x".join(str(s) for s in np.shape(arrays[0]))
            if not np.issubdtype(ref.dtype, np.floating):
                if low.dtype != ref.dtype or not np.array_equal(low, ref):
                    return "float32", "its non-float output differs from float32's"
                return "bfloat16", f"its {ref.dtype} output equals float32's on inputs of shape {shape}"
            if not _agrees(low, ref):
                return "float32", "bfloat16 result differs from float32 beyond bfloat16's precision"
            if ref_grads is not None:
                if low_grads is None:
                    return "float32", "no bfloat16 backward"
                if not all(_agrees(g, r) for g, r in zip(low_grads, ref_grads)):
                    return "float32", "bfloat16 gradient differs from float32 beyond bfloat16's precision"
            return "bfloat16", f"matches float32, forward and backward, on inputs of shape {shape}"
    return "unprobed", "no input this probe knows ran it in float32"


def _infer_types(sym_fn, numpy_mode, count, kwargs, low_index=None, low=None):
    """Type inference of ``sym_fn`` on ``count`` float32 inputs, input ``low_index`` cast to ``low`` first."""
    from mxfp16.amp.wrappers import cast

    import mxnet as mx

    xs = [mx.sym.var(f"x{i}") for i in range(count)]
    xs = [x.as_np_ndarray() for x in xs] if numpy_mode else xs
    if low_index is not None:
        xs[low_index] = cast(xs[low_index], low)
    out = sym_fn(*xs, **kwargs)
    out = out[0] if isinstance(out, (list, tuple)) else out
    out = out.as_nd_ndarray() if numpy_mode else out
    out.infer_type_partial(**{f"x{i}": "float32" for i in range(count)})


def _type_join(sym_fn, numpy_mode, count, kwargs, data, target, low):
    """Why type inference fails with one data input in ``low`` and the rest float32, or None where it never does."""
    for i in data:
        try:
            _infer_types(sym_fn, numpy_mode, count, kwargs, i, low)
        except _probe_errors() as e:
            return f"type inference fails with input {i} in {target}, the rest float32: {_first_line(e)}"
    return None


def _kernel_join(name, arrays, kwargs, data, ref):
    """Why the bfloat16 kernel fails or disagrees with one data input in bfloat16 and the rest float32, or None.

    ``None`` too where it has no bfloat16 kernel at all: that is a float32 verdict, not a join.
    """
    from mxfp16.float_formats import BFLOAT16

    import numpy as np

    count = len(arrays)
    try:
        _run(name, arrays, kwargs, [BFLOAT16] * count)
    except _probe_errors():
        return None
    for i in data:
        dtypes = [BFLOAT16 if j == i else None for j in range(count)]
        try:
            low, _ = _run(name, arrays, kwargs, dtypes)
        except _probe_errors() as e:
            return f"the kernel fails with input {i} in bfloat16, the rest float32: {_first_line(e)}"
        if np.issubdtype(ref.dtype, np.floating) and not _agrees(low, ref):
            return f"with input {i} in bfloat16 and the rest float32 the result differs from float32"
    return None


def join_probe(name):
    """``{target: reason}`` for each 16-bit target under which ``name`` is a join (empty: it is not one).

    Type inference with one data input in the target dtype and the others
    float32, for both targets; for bfloat16 also the kernel, run the same
    way and compared with float32. The first inputs that run in float32 decide.
    """
    from mxfp16.float_formats import BFLOAT16

    sym_fn = _function(name, "sym")
    numpy_mode = name.startswith(NUMPY_PREFIXES)
    with _numpy_scope(name):
        for arrays, kwargs in _generic_inputs(name):
            count = len(arrays)
            data = _data_inputs(name, count)
            if len(data) < 2:
                continue
            try:
                _infer_types(sym_fn, numpy_mode, count, kwargs)
                ref, _ = _run(name, arrays, kwargs, [None] * count)
            except _probe_errors():
                continue
            found = {}
            for target, low in (("bfloat16", BFLOAT16), ("float16", "float16")):
                reason = _type_join(sym_fn, numpy_mode, count, kwargs, data, target, low)
                if reason:
                    found[target] = reason
            if "bfloat16" not in found:
                reason = _kernel_join(name, arrays, kwargs, data, ref)
                if reason:
                    found["bfloat16"] = reason
            return found
    return {}


def _child(mode, names):
    import mxfp16  # noqa: F401  (numpy names for MXNet)
    for name in names:
        if mode == "join":
            print(json.dumps([name, join_probe(name)]), flush=True)
        else:
            verdict, why = probe(name)
            print(json.dumps([name, verdict, why]), flush=True)


def scan(names, mode="probe", python=sys.executable):
    """``{name: (verdict, reason)}`` (mode ``probe``) or ``{name: {target: reason}}`` (mode ``join``).

    Probes in child processes; a crash marks its operator float32 (a join
    probe that crashes the process marks it a join for bfloat16).
    """
    results = {}
    pending = list(names)
    while pending:
        batch, pending = pending[:BATCH], pending[BATCH:]
        # Not mxfp16.plumbing.child's call_in_child (one record at the end): verdicts stream out one line each,
        # so an operator that kills the process is found where the lines stop, and the others keep theirs.
        proc = subprocess.run([python, __file__, "--child", mode, *batch], capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            if line.startswith("["):
                entry = json.loads(line)
                results[entry[0]] = tuple(entry[1:]) if mode == "probe" else entry[1]
        done = [n for n in batch if n in results]
        if len(done) < len(batch):
            crashed = batch[len(done)]
            why = f"the process died running it with bfloat16 inputs (exit {proc.returncode})"
            results[crashed] = ("float32", why) if mode == "probe" else {"bfloat16": why}
            pending = batch[len(done) + 1:] + pending
    return results


def render(results, mxnet_float32_results, joins, clients):
    """The text of ``mxfp16/amp/op_verdicts.json`` (what :func:`mxfp16.amp.lists.op_verdicts` reads).

    Its keys: ``BFLOAT16`` (ran in bfloat16 and matched float32), ``FLOAT32``
    (no bfloat16 path on CPU: failed, crashed or disagreed with float32) and
    ``UNPROBED`` (no input the probe knows ran them: float32 unless MXNet's
    lists say otherwise), each ``{operator: reason}``; ``MXNET_FLOAT32``
    (MXNet's own bfloat16 float32 list, probed: ``{operator: [verdict,
    reason]}``; they stay float32, MXNet's choice, and the verdict is for the
    table); ``JOINS`` (operators whose data inputs must share one dtype:
    ``{operator: {target: why}}``); ``CLIENT_OPERATORS`` (the contrib
    operators each client's source calls, GluonCV 0.10 and GluonNLP 0.10);
    ``MXNET_VERSION`` (the MXNet these were measured on).
    """
    table = {"about": "Generated by tools/amp_probe_ops.py (its docstring says how); do not edit.",
             "MXNET_VERSION": __import__("mxnet").__version__,
             "MXNET_FLOAT32": mxnet_float32_results,
             "JOINS": {n: v for n, v in joins.items() if v},
             "CLIENT_OPERATORS": clients}
    for verdict in ("bfloat16", "float32", "unprobed"):
        table[verdict.upper()] = {n: why for n, (v, why) in results.items() if v == verdict}
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def main(argv):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--client", action="append", default=[], metavar="NAME=PATH",
                        help="a client library's source folder, scanned for the contrib operators it calls")
    parser.add_argument("names", nargs="*", help="probe only these operators and print their verdicts")
    args = parser.parse_args(argv)
    import mxfp16  # noqa: F401

    if args.names:
        for name, verdict in scan(args.names).items():
            print(name, *verdict)
        return
    clients = scan_clients(dict(c.split("=", 1) for c in args.client))
    follow = candidates() + numpy_candidates()
    extra = [n for n in clients if n not in follow and n not in mxnet_float32()]
    results = scan(follow + extra)
    float32_list = scan(mxnet_float32())
    joins = scan(join_candidates(), "join")
    sys.stdout.write(render(results, float32_list, joins, clients))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2], sys.argv[3:])
    else:
        main(sys.argv[1:])
