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

Beyond the CNN, three things in MXNet 1.9.1's AMP stop other Gluon models,
and :func:`init_amp` repairs each:

* Operators with no bfloat16 CPU kernel that MXNet lets a bfloat16 input
  reach (``dot``, ``batch_dot`` in attention). ``tools/amp_probe_ops.py``
  runs every such operator in both dtypes (``mxfp16/_amp_op_probe.py`` holds
  its verdicts); the ones that fail or disagree, and the unlisted ones no
  generic input could run, go to the float32 list (:func:`float32_fallbacks`),
  and each warns once, naming itself, the first time it is used.
* AMP's float32 wrapper for symbols builds the operator, then rebuilds it on
  cast inputs: with no inputs (``zeros`` in an RNN's ``begin_state``) it
  raises ``TypeError``, and for ``Deconvolution`` the rebuilt node crashes
  the process. mxfp16 wraps the float32 list itself, casting the inputs
  before the call.
* PReLU (``LeakyReLU`` with ``act_type='prelu'``) gets float32 ``gamma``
  beside bfloat16 data and fails type inference: it runs in float32.

Which dtype each Gluon layer then runs in is generated from executed graphs
(:mod:`mxfp16.amp_table`, ``mxfp16 info --amp-table``).
"""
import warnings

import numpy as np

from mxnet.contrib.amp.lists import symbol_bf16, symbol_fp16

#: Names accepted by :func:`operator_lists`.
LIST_SETS = ("mxfp16", "mxnet")

#: mxfp16's bfloat16 operator lists (:func:`operator_lists`) are MXNet's, plus
#: the float32 fallbacks and the PReLU rule below. Measured on ResNet-50 v2
#: (docs/benchmarks.md), adding BatchNorm, Activation, Pooling or
#: elemwise_add to the bfloat16 list gained nothing beyond the noise (they
#: already run in bfloat16 behind a bfloat16 convolution), and forcing
#: BatchNorm to float32 made the step slower than float32 (a cast before
#: every BatchNorm, and BatchNorm on the casts' plain layout). What helps is
#: :data:`FLOAT32_CONVOLUTIONS`, applied by :func:`init_amp`.
def float32_fallbacks():
    """Operators mxfp16 adds to the bfloat16 float32 list: no working bfloat16 CPU path.

    From ``tools/amp_probe_ops.py``'s verdicts (``mxfp16/_amp_op_probe.py``):
    every operator whose bfloat16 run failed, crashed or disagreed with
    float32, and every operator MXNet's lists leave unlisted that the probe
    could not run (float32 is the safe side: slower, never a crash).

    Returns
    -------
    list of str
        Sorted operator names.
    """
    from . import _amp_op_probe as probe

    listed = set(symbol_bf16.WIDEST_TYPE_CASTS) | set(symbol_bf16.BF16_FP32_FUNCS)
    unlisted_unprobed = {name for name in probe.UNPROBED if name not in listed}
    return sorted(set(probe.FLOAT32) | unlisted_unprobed)


#: Conditional float32 rules mxfp16 adds: PReLU's float32 ``gamma`` cannot
#: meet bfloat16 data (type inference fails), so PReLU runs in float32.
EXTRA_CONDITIONAL_FP32 = [("LeakyReLU", "act_type", ["prelu"])]


def _with_extra_conditional(rules):
    conditional = [(name, arg, list(values)) for name, arg, values in rules]
    for name, arg, values in EXTRA_CONDITIONAL_FP32:
        for rule in conditional:
            if rule[0] == name and rule[1] == arg:
                rule[2].extend(v for v in values if v not in rule[2])
                break
        else:
            conditional.append((name, arg, list(values)))
    return conditional


def _mxfp16_fp16():
    lists = {key: list(value) for key, value in _MXNET["float16"].items()}
    lists["conditional_fp32_ops"] = _with_extra_conditional(symbol_fp16.CONDITIONAL_FP32_FUNCS)
    return lists


def _mxfp16_bf16():
    conditional = _with_extra_conditional(symbol_bf16.CONDITIONAL_FP32_FUNCS)
    fp32 = list(symbol_bf16.FP32_FUNCS)
    fp32 += [name for name in float32_fallbacks() if name not in fp32]
    return {"target_precision_ops": list(symbol_bf16.BF16_FUNCS),
            "conditional_fp32_ops": conditional,
            "fp32_ops": fp32}

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
    if which == "mxfp16":
        return _mxfp16_bf16() if target_dtype == "bfloat16" else _mxfp16_fp16()
    return {key: list(value) for key, value in _MXNET[target_dtype].items()}


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


class Float32Fallback(UserWarning):
    """An operator with no working 16-bit path on this device runs in float32 under AMP."""


#: MXNet's bfloat16 (a numpy structured dtype: numpy has none).
_BFLOAT16 = np.dtype([("bfloat16", np.uint16)])
#: Operators already warned about in this process (one warning each).
_warned = set()


def _to_float32(x):
    """``x`` cast to float32 when it is a 16-bit NDArray or any Symbol; anything else unchanged.

    ``amp_cast`` leaves non-float types alone, so integer indices pass through.
    """
    from mxnet import ndarray, symbol

    if isinstance(x, symbol.Symbol):
        # A parameter (a variable that declares its dtype: Parameter.var()) is
        # float32 under AMP, so it is left alone: a cast would only add a node,
        # and through one Deconvolution's deferred shape inference crashes
        # MXNet. A graph's input is cast: a hybridized layer inside a plain
        # Block is fed whatever the layer before it returned (bfloat16 after
        # a Dense).
        if x.get_children() is None and "__dtype__" in x.list_attr():
            return x
        return symbol.amp_cast(x, dtype="float32")
    if isinstance(x, ndarray.NDArray) and np.dtype(x.dtype) in (np.dtype(np.float16), _BFLOAT16):
        return ndarray.amp_cast(x, dtype="float32")
    if isinstance(x, (list, tuple)) and any(isinstance(v, (symbol.Symbol, ndarray.NDArray)) for v in x):
        return type(x)(_to_float32(v) for v in x)
    return x


def _float32_call(f, name, warn_as=None):
    """``f`` with its tensor inputs cast to float32 first; warns once when ``warn_as`` is set.

    This replaces AMP's own float32 wrapper for symbols, which calls ``f``
    and then rebuilds the node on cast inputs: that fails for operators with
    no inputs (``TypeError`` in an RNN's ``begin_state``) and crashes the
    process for ``Deconvolution``. Casting first needs no rebuild.
    """
    def float32_op(*args, **kwargs):
        if warn_as and name not in _warned:
            _warned.add(name)
            warnings.warn(f"mxfp16: {name} has no working {warn_as} path on this CPU in MXNet "
                          f"{_mxnet_version()}, so AMP runs it in float32 (inputs cast up, output "
                          "float32). See docs/amp-table.md for every layer's dtype.",
                          Float32Fallback, stacklevel=2)
        args = [_to_float32(a) for a in args]
        kwargs = {k: _to_float32(v) for k, v in kwargs.items()}
        return f(*args, **kwargs)

    float32_op.__name__, float32_op.__doc__ = getattr(f, "__name__", name), getattr(f, "__doc__", None)
    return float32_op


def warn_if_numpy_mode(output):
    """Warn once when a numpy-mode network's output appears under AMP: it ran in float32.

    MXNet 1.9.1's AMP wraps the ``mx.nd`` / ``mx.sym`` operators only; the
    ``mx.np`` / ``mx.npx`` ones a numpy-mode network calls run in the dtype
    they are given, float32. :func:`mxfp16.train_step` calls this with each
    output (an ``isinstance`` check until the warning has been given).
    """
    if "numpy mode" in _warned:
        return
    import mxnet as mx

    from ._internals import amp_initialized

    if isinstance(output, mx.np.ndarray) and amp_initialized():
        _warned.add("numpy mode")
        warnings.warn("mxfp16: this network runs in numpy mode (mx.np / mx.npx operators), which MXNet "
                      f"{_mxnet_version()}'s AMP does not wrap, so it trains in float32 under AMP. See "
                      "docs/amp-table.md.", Float32Fallback, stacklevel=3)


def _mxnet_version():
    import mxnet

    return mxnet.__version__


def _wrap_float32(names, warn, target_dtype):
    """Put :func:`_float32_call` around each operator in ``names``, in ``mx.sym`` and ``mx.nd``."""
    from mxnet import base, ndarray, symbol
    from mxnet.contrib.amp.amp import _get_fun_to_wrap

    for module in (symbol, ndarray):
        submodules = {p: getattr(module, p[1:-1]) for p in base._OP_NAME_PREFIX_LIST}
        for name in names:
            try:
                fun_name, where = _get_fun_to_wrap(name, module, submodules)
                targets = [where] + ([module.op] if where is module else [])
                current = [getattr(t, fun_name) for t in targets]
            except AttributeError:
                continue  # not an operator of this MXNet build
            for target, f in zip(targets, current):
                setattr(target, fun_name, _float32_call(f, name, target_dtype if name in warn else None))


def init_amp(target_dtype, which="mxfp16", lists=None):
    """``amp.init`` with :func:`operator_lists` (or ``lists``), repaired for any Gluon model.

    AMP wraps the target and conditional lists; mxfp16 wraps the float32 list
    itself (:func:`_float32_call`, see the module docstring). Then, for
    mxfp16's bfloat16 lists, the stem rule: AMP's own conditional list
    cannot express "this Convolution in float32" (it wraps the already
    bfloat16-wrapped operator, so the inputs are cast to float32 and straight
    back), so it wraps ``Convolution`` itself, keeping the unwrapped operator
    for the float32 case.

    Parameters
    ----------
    target_dtype : str
        ``'bfloat16'`` or ``'float16'``.
    which : str
        ``'mxfp16'`` or ``'mxnet'``: which lists, when ``lists`` is None.
    lists : dict, optional
        Explicit ``target_precision_ops`` / ``conditional_fp32_ops`` /
        ``fp32_ops`` (a missing key takes MXNet's); no stem rule then.
    """
    from mxnet import ndarray, symbol
    from mxnet.contrib import amp

    if lists is None:
        lists = operator_lists(target_dtype, which)
        stem_float32 = _keeps_stem_float32(target_dtype, which)
    else:
        defaults = operator_lists(target_dtype, "mxnet")
        lists = {key: list(lists[key]) if lists.get(key) is not None else defaults[key] for key in defaults}
        stem_float32 = False
    fp32 = lists.pop("fp32_ops")
    warn = set(float32_fallbacks()) if target_dtype == "bfloat16" else set()
    modules = [m for module in (symbol, ndarray) for m in (module, module.op)]
    originals = {m: m.Convolution for m in modules}
    amp.init(target_dtype=target_dtype, fp32_ops=[], **lists)
    _wrap_float32(fp32, warn, target_dtype)
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
