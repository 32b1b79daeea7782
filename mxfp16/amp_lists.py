"""Which operators AMP runs in bfloat16: mxfp16's measured choice and MXNet's own.

``mx.contrib.amp.init`` takes three lists: the operators cast to the target
dtype, the operators always cast to float32, and the operators cast to
float32 only for some parameter values. Everything else runs in whatever
dtype its inputs arrive in. With MXNet's bfloat16 lists, Convolution and
FullyConnected are cast to bfloat16 and, because their outputs are
bfloat16, BatchNorm, Activation, Pooling and the residual additions of a
ResNet also run in bfloat16 downstream.

:func:`init_amp` with ``'mxfp16'`` is what ``mxfp16 bench`` measured
fastest at equal accuracy on a CPU with avx512_bf16: MXNet's lists plus one
rule, the 7x7 stem convolution in float32 (see ``docs/benchmarks.md`` for
the figures and what still holds bfloat16 back).
:func:`mxfp16.precision.activate` uses it unless lists are passed explicitly;
``mxfp16 export`` converts finished networks with the same lists and rule
(:func:`float32_layers`).
"""
from mxnet.contrib.amp.lists import symbol_bf16, symbol_fp16

#: Names accepted by :func:`operator_lists`.
LIST_SETS = ("mxfp16", "mxnet")

#: mxfp16's bfloat16 operator lists: MXNet's. Measured on ResNet-50 v2
#: (docs/benchmarks.md), adding BatchNorm, Activation, Pooling or
#: elemwise_add to the bfloat16 list gained nothing beyond the noise (they
#: already run in bfloat16 behind a bfloat16 convolution), and forcing
#: BatchNorm to float32 made the step slower than float32 (a cast before
#: every BatchNorm, and BatchNorm on the casts' plain layout). What helps is
#: :data:`FLOAT32_CONVOLUTIONS`, applied by :func:`init_amp`.
MXFP16_BF16 = {
    "target_precision_ops": list(symbol_bf16.BF16_FUNCS),
    "conditional_fp32_ops": list(symbol_bf16.CONDITIONAL_FP32_FUNCS),
    "fp32_ops": list(symbol_bf16.FP32_FUNCS),
}

_MXNET = {
    "bfloat16": {
        "target_precision_ops": list(symbol_bf16.BF16_FUNCS),
        "conditional_fp32_ops": list(symbol_bf16.CONDITIONAL_FP32_FUNCS),
        "fp32_ops": list(symbol_bf16.FP32_FUNCS),
    },
    "float16": {
        "target_precision_ops": list(symbol_fp16.FP16_FUNCS),
        "conditional_fp32_ops": list(symbol_fp16.CONDITIONAL_FP32_FUNCS),
        "fp32_ops": list(symbol_fp16.FP32_FUNCS),
    },
}


def operator_lists(target_dtype, which="mxfp16"):
    """The keyword arguments for ``amp.init`` (and :func:`mxfp16.activate`).

    Parameters
    ----------
    target_dtype : str
        ``'bfloat16'`` or ``'float16'``.
    which : str
        ``'mxfp16'`` (the tuned lists; for float16 these are MXNet's, which
        were not re-measured here) or ``'mxnet'`` (MXNet's defaults).

    Returns
    -------
    dict
        ``{'target_precision_ops': [...], 'conditional_fp32_ops': [...], 'fp32_ops': [...]}``,
        fresh lists the caller may change.
    """
    if which not in LIST_SETS:
        raise ValueError(f"unknown AMP operator lists {which!r}; choose one of: {', '.join(LIST_SETS)}")
    if target_dtype not in _MXNET:
        raise ValueError(f"AMP has no operator lists for {target_dtype!r}; use bfloat16 or float16")
    source = MXFP16_BF16 if (which == "mxfp16" and target_dtype == "bfloat16") else _MXNET[target_dtype]
    return {key: list(value) for key, value in source.items()}


#: Convolutions kept in float32 under AMP, by ``(parameter, values)``: the
#: 7x7 stem of ImageNet ResNets, which reads the 3-channel image. In bfloat16
#: its output comes out of oneDNN in a plain (unblocked) layout, and the
#: BatchNorm and pooling after it then run about 10x slower than in float32;
#: in float32 the stem costs little more (it is ~3% of ResNet-50's work).
FLOAT32_CONVOLUTIONS = ("kernel", ((7, 7),))


def _keeps_stem_float32(target_dtype, which):
    """Whether :data:`FLOAT32_CONVOLUTIONS` applies: mxfp16's own bfloat16 lists only."""
    return which == "mxfp16" and target_dtype == "bfloat16"


def _as_tuple(value):
    """An operator parameter as a tuple of ints: ``(7, 7)``, ``'(7, 7)'`` and ``7`` (as ``(7,)``)."""
    if isinstance(value, str):
        value = [v for v in value.strip("()[] ").replace(" ", "").split(",") if v]
    if isinstance(value, int):
        value = (value,)
    try:
        return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        return ()


def _float32_where(original, amp_wrapped, param, values):
    """``amp_wrapped`` (bfloat16) unless ``kwargs[param]`` is in ``values``; then ``original`` in float32."""
    import numpy as np
    from mxnet import ndarray, symbol

    def to_float32(x):
        if isinstance(x, symbol.Symbol):
            return symbol.amp_cast(x, dtype="float32")
        if isinstance(x, ndarray.NDArray) and x.dtype != np.float32:
            return ndarray.amp_cast(x, dtype="float32")
        return x

    def convolution(*args, **kwargs):
        if _as_tuple(kwargs.get(param)) not in values:
            return amp_wrapped(*args, **kwargs)
        args = [to_float32(a) for a in args]
        kwargs = {k: to_float32(v) for k, v in kwargs.items()}
        return original(*args, **kwargs)

    convolution.__name__, convolution.__doc__ = amp_wrapped.__name__, amp_wrapped.__doc__
    return convolution


def init_amp(target_dtype, which="mxfp16"):
    """``amp.init`` with :func:`operator_lists`, plus (for mxfp16's bfloat16) a float32 stem convolution.

    AMP's own conditional list cannot express "this Convolution in float32":
    it wraps the already bfloat16-wrapped operator, so the inputs are cast to
    float32 and straight back. The stem rule therefore wraps
    ``Convolution`` itself, keeping the unwrapped operator for the float32 case.
    """
    from mxnet import ndarray, symbol
    from mxnet.contrib import amp

    lists = operator_lists(target_dtype, which)
    stem_float32 = _keeps_stem_float32(target_dtype, which)
    modules = [m for module in (symbol, ndarray) for m in (module, module.op)]
    originals = {m: m.Convolution for m in modules}
    amp.init(target_dtype=target_dtype, **lists)
    if stem_float32:
        param, values = FLOAT32_CONVOLUTIONS
        for m in modules:
            m.Convolution = _float32_where(originals[m], m.Convolution, param, values)


def float32_layers(symbol, target_dtype, which="mxfp16"):
    """The layers of a graph that :func:`init_amp` keeps in float32 beyond the lists, by node name.

    AMP's inference conversion (``amp.convert_model``) works on a finished
    graph, not on patched operators, so the stem rule reaches it as the
    names of the layers to leave alone (its ``excluded_sym_names``).

    Parameters
    ----------
    symbol : mx.sym.Symbol
        The float32 network.
    target_dtype : str
        ``'bfloat16'`` or ``'float16'``.
    which : str
        ``'mxfp16'`` or ``'mxnet'`` (MXNet's lists have no such rule: ``[]``).

    Returns
    -------
    list of str
    """
    import json

    if not _keeps_stem_float32(target_dtype, which):
        return []
    param, values = FLOAT32_CONVOLUTIONS
    nodes = json.loads(symbol.tojson())["nodes"]
    return [n["name"] for n in nodes
            if n["op"] == "Convolution" and _as_tuple(n.get("attrs", {}).get(param, "")) in values]
