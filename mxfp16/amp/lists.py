"""Which operators AMP runs in bfloat16: mxfp16's measured choice and MXNet's own.

``mx.contrib.amp.init`` takes three lists: operators cast to the target
dtype, operators cast to float32, and operators cast to float32 for some
parameter values; the rest run in their inputs' dtype.

:func:`init_amp` with ``'mxfp16'`` is what ``mxfp16 bench`` measured fastest
at equal accuracy on a CPU with avx512_bf16 (``docs/benchmarks.md``); it also
repairs what stops other Gluon models in MXNet 1.9.1's AMP.
``docs/amp-table.md`` says what each layer runs in.
"""
import functools
import json
import os
import types
import warnings

from .._internals import legacy_operator_functions
from ..float_formats import BFLOAT16
from . import numpy_mode as amp_numpy
from . import wrappers as w
from .clip import clip_as_minimum_maximum
from .deconvolution import bfloat16_weight_call, single_channel_as_convolution
from .pooling import global_average_as_mean

#: The list sets by name: their operator lists (:func:`operator_lists`) and float32 rules for layers
#: (:data:`FLOAT32_RULES`, bfloat16 only). The ``+...32`` sets are options, not defaults (docs/benchmarks.md).
LIST_SETS = {
    "mxfp16": ("mxfp16", ("stem",)),
    "mxnet": ("mxnet", ()),
    "measured": ("mxfp16", ("stem", "measured")),
    "mxfp16+depthwise32": ("mxfp16", ("stem", "depthwise32")),
    "mxfp16+pointwise32": ("mxfp16", ("stem", "pointwise32")),
    "mxfp16+depthwise32+pointwise32": ("mxfp16", ("stem", "depthwise32", "pointwise32")),
    "mxfp16+batchnorm32": ("mxfp16", ("stem", "batchnorm32")),
    "mxfp16+unaligned32": ("mxfp16", ("stem", "unaligned32")),
}


@functools.lru_cache(maxsize=None)
def op_verdicts():
    """``tools/amp_probe_ops.py``'s verdicts from ``op_verdicts.json`` (read once): one attribute per key."""
    with open(os.path.join(os.path.dirname(__file__), "op_verdicts.json"), encoding="utf-8") as handle:
        return types.SimpleNamespace(**json.load(handle))


def _mxnet(target_dtype):
    """MXNet's own list module for ``target_dtype``, imported when asked (importing this module loads no MXNet)."""
    from mxnet.contrib.amp.lists import symbol_bf16, symbol_fp16

    return symbol_bf16 if target_dtype == "bfloat16" else symbol_fp16


# mxfp16's bfloat16 lists are MXNet's plus the fallbacks, the PReLU rule, the shape and the slow operators below.
# Measured on ResNet-50 v2 (docs/benchmarks.md), adding BatchNorm, Activation, Pooling or elemwise_add to the
# bfloat16 list gained nothing (they run in bfloat16 behind a bfloat16 convolution anyway), and BatchNorm in float32
# made the step slower than float32 (a cast before each, on the casts' plain layout); the stem rule helps.
def float32_fallbacks():
    """Operators mxfp16 adds to the bfloat16 float32 list: no working bfloat16 CPU path.

    The probe's float32 verdicts, and every operator MXNet leaves unlisted
    that the probe could not run (float32 is the safe side).

    Returns
    -------
    list of str
        Sorted operator names.
    """
    probe = op_verdicts()
    symbol_bf16 = _mxnet("bfloat16")
    listed = set(symbol_bf16.WIDEST_TYPE_CASTS) | set(symbol_bf16.BF16_FP32_FUNCS)
    unlisted_unprobed = {name for name in probe.UNPROBED if name not in listed}
    return sorted(set(probe.FLOAT32) | unlisted_unprobed)


#: Conditional float32 rules mxfp16 adds: PReLU's float32 ``gamma`` cannot
#: meet bfloat16 data (type inference fails), so PReLU runs in float32.
EXTRA_CONDITIONAL_FP32 = [("LeakyReLU", "act_type", ["prelu"])]

#: Operators MXNet lets run in either dtype that mxfp16 runs in float32: MXNet's bfloat16 kernel (no oneDNN one)
#: is far slower. ``clip``, MobileNet's ReLU6, was 81% of MobileNet v2's amp-bfloat16 step on a Zen 5, 2.9x its
#: float32 time; in float32 the step ran 2.2x faster (docs/benchmarks.md, "Measured on a Zen 5 without AMX").
SLOW_IN_BFLOAT16 = ("clip",)


#: Operators MXNet keeps in float32 that only move values or scale them once (``_contrib_div_sqrt_dim``): in
#: float32, each one between two bfloat16 layers costs a cast each way (the LSTM's ``swapaxes``). Only those whose
#: bfloat16 kernel ran and matched float32 follow their input (:func:`follow_input_operators`): the probe's verdict,
#: or where the probe had no input for one, MXNet 1.9.1's source (generic kernels in ``slice_channel.cc``,
#: ``swapaxis.cc``, ``matrix_op.cc``; oneDNN's reshape takes bfloat16) and runs in both dtypes agreeing.
#: ``transpose`` stays float32: the probe's bfloat16 run of it crashed the process (oneDNN's transpose).
SHAPE_OPERATORS = ("Reshape", "reshape", "transpose", "SliceChannel", "split", "_split_v2", "slice", "slice_axis",
                   "expand_dims", "squeeze", "SwapAxis", "swapaxes", "Flatten", "flatten", "_copy", "identity",
                   "_contrib_div_sqrt_dim")


def follow_input_operators():
    """The :data:`SHAPE_OPERATORS` mxfp16's bfloat16 lists let follow their input: all but those the probe failed."""
    probe = op_verdicts()
    failed = {name for name, (verdict, _) in probe.MXNET_FLOAT32.items() if verdict == "float32"} | set(probe.FLOAT32)
    return [name for name in SHAPE_OPERATORS if name not in failed]


def operator_lists(target_dtype, which="mxfp16"):
    """The keyword arguments for ``amp.init`` (and :func:`mxfp16.activate`).

    Parameters
    ----------
    target_dtype : str
        ``'bfloat16'`` or ``'float16'``.
    which : str
        A name of :data:`LIST_SETS` (for float16 all but ``'mxnet'`` add only the PReLU rule to MXNet's).

    Returns
    -------
    dict
        ``{'target_precision_ops': [...], 'conditional_fp32_ops': [...], 'fp32_ops': [...]}``, fresh lists.
    """
    which = check_list_set(which)[0]
    if target_dtype not in ("bfloat16", "float16"):
        raise ValueError(f"AMP has no operator lists for {target_dtype!r}; use bfloat16 or float16")
    mxnet = _mxnet(target_dtype)
    target = mxnet.BF16_FUNCS if target_dtype == "bfloat16" else mxnet.FP16_FUNCS
    conditional = [(name, arg, list(values)) for name, arg, values in mxnet.CONDITIONAL_FP32_FUNCS]
    lists = {"target_precision_ops": list(target), "conditional_fp32_ops": conditional,
             "fp32_ops": list(mxnet.FP32_FUNCS)}
    if which == "mxnet":
        return lists
    for name, arg, values in EXTRA_CONDITIONAL_FP32:
        rule = next((rule for rule in conditional if rule[:2] == (name, arg)), None)
        if rule is None:
            conditional.append((name, arg, list(values)))
        else:
            rule[2].extend(v for v in values if v not in rule[2])
    if target_dtype == "bfloat16":
        follow = set(follow_input_operators())
        fp32 = [name for name in mxnet.FP32_FUNCS if name not in follow]
        lists["fp32_ops"] = fp32 + [name for name in (*float32_fallbacks(), *SLOW_IN_BFLOAT16)
                                    if name not in fp32 and not name.startswith(amp_numpy.NUMPY_PREFIXES)]
    return lists


def check_list_set(which):
    """``(operator lists, rule names)`` of the list set named ``which`` (:data:`LIST_SETS`).

    Raises
    ------
    ValueError
        An unknown name; the message lists the choices.
    """
    if which not in LIST_SETS:
        raise ValueError(f"unknown AMP operator lists {which!r}; choose one of: {', '.join(LIST_SETS)}")
    return LIST_SETS[which]


def stem_convolution(call):
    """The 7x7 stem of ImageNet ResNets, which reads the 3-channel image.

    In bfloat16 oneDNN gives its output the plain layout, and the BatchNorm
    and pooling after it run about 10x slower than in float32; the stem is
    ~3% of ResNet-50's work.
    """
    return call.op == "Convolution" and call.tuple_attr("kernel") == (7, 7)


def depthwise_convolution(call):
    """A depthwise convolution: one filter per input channel (``num_group == num_filter > 1``, MobileNet's 3x3).

    MXNet refuses oneDNN's padded layouts, so a channel count that is not a
    multiple of 16 may fall to a slower kernel (docs/benchmarks.md).
    """
    groups = call.int_attr("num_group", 1)
    return call.op == "Convolution" and groups > 1 and groups == call.int_attr("num_filter", 0)


def pointwise_convolution(call):
    """A 1x1 (pointwise) convolution without groups: MobileNet's expansions and projections."""
    kernel = call.tuple_attr("kernel")
    return call.op == "Convolution" and bool(kernel) and set(kernel) == {1} and call.int_attr("num_group", 1) == 1


def batch_norm(call):
    """Every ``BatchNorm``: the ``+batchnorm32`` option keeps them all in float32 (inputs cast up, output float32).

    oneDNN 2.4.4 has JIT BatchNorm kernels only for blocked layouts; on the
    plain layout its portable C++ is about 3x slower in bfloat16 than in
    float32. It helps MobileNet v2 and slows ``cifar_resnet20_v1``
    (docs/amp-table.md, docs/results/routes-zen4).
    """
    return call.op == "BatchNorm"


#: oneDNN's AVX-512 and AMX kernels block channels by this many (the ``nChw16c`` layouts).
CHANNEL_BLOCK = 16


def unaligned_convolution(call):
    """A convolution whose input or output channels are not a multiple of :data:`CHANNEL_BLOCK` (``+unaligned32``).

    MXNet 1.9.1 refuses oneDNN's padded layouts, so in bfloat16 such a
    convolution (MobileNet v2's stem and 24-channel layers) runs on the plain
    layout, with reorders around it and reference BatchNorm kernels behind it.
    Before a deferred network's first step only its output channels are known.
    """
    if call.op != "Convolution":
        return False
    shape = call.weight_shape
    inputs = shape[1] * call.int_attr("num_group", 1) if len(shape) > 1 else 0
    return any(channels % CHANNEL_BLOCK for channels in (call.int_attr("num_filter", 0), inputs) if channels)


def shapes_pending(net):
    """Whether a parameter of ``net`` has yet to learn its shape (a deferred layer before its first step), so a rule
    that reads weight shapes has judged it on its output channels only and must judge it again after that step."""
    return any(not p.shape or 0 in p.shape for p in net.collect_params().values())


def reads_weight_shapes(which):
    """Whether the list set ``which`` has a rule that reads weight shapes, which a deferred network lacks at first."""
    return "unaligned32" in check_list_set(which)[1]


#: The layers a measurement kept in float32 in this process (AMP is process-global, and so is this): by
#: weight parameter name (graph nodes), and by ``(operator, attributes, input shapes)`` (calls on arrays).
_measured = {"weights": set(), "calls": set()}


def _call_key(op, attrs, shapes):
    return op, tuple(sorted(attrs.items())), tuple(tuple(s) for s in shapes)


def keep_float32_measured(layers):
    """Keep these layers in float32 under the ``measured`` list set, from now on in this process.

    A graph already built keeps its dtypes until rebuilt (:class:`mxfp16.MixedPrecision` does).

    Parameters
    ----------
    layers : iterable of dict
        ``{'op', 'attrs', 'weight', 'shapes'}`` each (:meth:`mxfp16.measure.per_layer.LayerChoice.float32_layers`);
        replaces what was kept before.
    """
    layers = list(layers)
    _measured["weights"] = {layer["weight"] for layer in layers if layer.get("weight")}
    _measured["calls"] = {_call_key(layer["op"], layer["attrs"], layer["shapes"]) for layer in layers}


def measured_float32(call):
    """Whether a measurement kept this layer in float32 (:func:`keep_float32_measured`)."""
    if call.weight is not None:
        return call.weight in _measured["weights"]
    if call.shapes is not None:
        return _call_key(call.op, call.attrs, call.shapes) in _measured["calls"]
    return False


#: Layers kept in float32 when they would run in bfloat16 under the operator lists, by rule name: which
#: operators each rule looks at, and the rule (a function of :class:`~mxfp16.amp.wrappers.LayerCall`).
FLOAT32_RULES = {
    "stem": (("Convolution",), stem_convolution),
    "depthwise32": (("Convolution",), depthwise_convolution),
    "pointwise32": (("Convolution",), pointwise_convolution),
    "measured": (("Convolution", "FullyConnected"), measured_float32),
    "batchnorm32": (("BatchNorm",), batch_norm),
    "unaligned32": (("Convolution",), unaligned_convolution),
}


def float32_rules(target_dtype, which):
    """``{operator: rule}``: the union of the list set's float32 rules, per operator (bfloat16 only).

    Returns
    -------
    dict
        Empty for float16 and for MXNet's own lists.
    """
    if target_dtype != "bfloat16":
        return {}
    chosen = [FLOAT32_RULES[name] for name in check_list_set(which)[1]]
    ops = sorted({op for operators, _ in chosen for op in operators})

    def union(op):
        rules = [rule for operators, rule in chosen if op in operators]
        return lambda call: any(rule(call) for rule in rules)

    return {op: union(op) for op in ops}


def _layer_calls(net):
    """:class:`~mxfp16.amp.wrappers.LayerCall` of each Gluon convolution layer in ``net``, depth first."""
    from .._internals import block_children

    call = w.LayerCall.of_block(net)
    calls = [call] if call is not None else []
    for child in block_children(net):
        calls += _layer_calls(child)
    return calls


def keeps_more_float32(net, which, base):
    """Whether the list set ``which`` keeps in float32 a layer of ``net`` that ``base`` runs as its operator lists say.

    Read from ``net``'s Gluon convolution layers before they run: a deferred
    layer's input channels are not known yet, so only its output channels
    count. The two sets' operator lists are the same (``mxfp16`` and an
    ``mxfp16+...`` option): only their float32 rules differ.

    Parameters
    ----------
    net : gluon.Block
    which, base : str
        Names of :data:`LIST_SETS`.

    Returns
    -------
    bool
    """
    (lists, rules), (base_lists, base_rules) = check_list_set(which), check_list_set(base)
    if lists != base_lists:
        raise ValueError(f"the list sets {which!r} and {base!r} differ in their operator lists, not only in rules")
    added = [FLOAT32_RULES[name] for name in rules if name not in base_rules]
    kept = [FLOAT32_RULES[name] for name in base_rules]

    def rules_keep(chosen, call):
        return any(call.op in operators and rule(call) for operators, rule in chosen)

    return any(rules_keep(added, call) and not rules_keep(kept, call) for call in _layer_calls(net))


def join_operators(target_dtype):
    """Operators mxfp16 runs in the widest dtype of their inputs, beyond MXNet's ``WIDEST_TYPE_CASTS``.

    A join's data inputs must share one dtype (``Concat``, ``add`` ...): under
    the stem rule DenseNet's first ``Concat`` gets a float32 and a bfloat16
    input. From the probe's ``JOINS``, less those already cast by AMP.

    Returns
    -------
    list of str
        Sorted operator names (legacy and numpy-mode).
    """
    probe = op_verdicts()
    lists = _mxnet(target_dtype)
    cast_by_amp = set(lists.WIDEST_TYPE_CASTS) | set(lists.FP32_FUNCS)
    cast_by_amp |= set(lists.BF16_FUNCS if target_dtype == "bfloat16" else lists.FP16_FUNCS)
    if target_dtype == "bfloat16":
        cast_by_amp |= set(float32_fallbacks())  # float32 whatever their inputs
    return sorted(name for name, dtypes in probe.JOINS.items() if target_dtype in dtypes and name not in cast_by_amp)


class Float32Fallback(UserWarning):
    """An operator with no working 16-bit path on this device runs in float32 under AMP."""


#: Operators already warned about in this process (one warning each).
_warned = set()


def _warn_fallback(name, target_dtype):
    if name in _warned:
        return
    _warned.add(name)
    import mxnet

    warnings.warn(f"mxfp16: {name} has no working {target_dtype} path on this CPU in MXNet "
                  f"{mxnet.__version__}, so AMP runs it in float32 (inputs cast up, output "
                  "float32). See docs/amp-table.md for every layer's dtype.",
                  Float32Fallback, stacklevel=3)  # 1: here, 2: float32_call's wrapper, 3: the operator's caller


def warn_if_numpy_mode(output):
    """Warn once when a numpy-mode network under AMP ran no operator in the 16-bit dtype.

    :func:`mxfp16.train_step` calls this with each output (an array, or a tuple or list of them).
    """
    if "numpy mode" in _warned:
        return
    import mxnet as mx

    from .._internals import amp_initialized

    outputs = output if isinstance(output, (list, tuple)) else [output]
    numpy_mode = any(isinstance(o, mx.np.ndarray) for o in outputs)
    if numpy_mode and amp_initialized() and not amp_numpy.ran_in_target_dtype():
        _warned.add("numpy mode")
        warnings.warn("mxfp16: this numpy-mode network (mx.np / mx.npx operators) ran no operator in 16-bit "
                      "under AMP: it trains in float32. Only functions looked up after mxfp16.activate() "
                      "are wrapped (not one bound earlier by `from mxnet.numpy_extension import ...`); see "
                      "docs/amp-table.md.", Float32Fallback, stacklevel=3)


def _wrap_legacy(names, make):
    """Replace each operator in ``names`` by ``make(f, name)``, in ``mx.sym`` and ``mx.nd``, as AMP does."""
    for name in names:
        homes = legacy_operator_functions(name)
        current = [getattr(target, attribute) for target, attribute in homes]  # all read before any is replaced
        for (target, attribute), f in zip(homes, current):
            setattr(target, attribute, make(f, name))


#: The 16-bit dtype :func:`init_amp` switched AMP on for in this process (AMP is process-global), else None.
_active = {"target": None}


def amp_target():
    """The dtype :func:`init_amp` set AMP's target operators to in this process (MXNet's bfloat16, ``'float16'``).

    ``None`` when it did not (AMP off, or switched on by ``mx.contrib.amp.init`` directly).
    """
    return _active["target"]


def init_amp(target_dtype, which="mxfp16", lists=None):
    """``amp.init`` with :func:`operator_lists` (or ``lists``), repaired for any Gluon model.

    AMP wraps the conditional list and the target operators that keep
    float32 parameters (BatchNorm); mxfp16 wraps the rest (:mod:`mxfp16.amp.wrappers`:
    AMP's rules without its failures and its quadratic cost on deep graphs).

    Parameters
    ----------
    target_dtype : str
        ``'bfloat16'`` or ``'float16'``.
    which : str
        A name of :data:`LIST_SETS`, when ``lists`` is None.
    lists : dict, optional
        Explicit lists (a missing key takes MXNet's); no float32 rule then.
    """
    from mxnet import ndarray, symbol
    from mxnet.contrib import amp

    if lists is None:
        lists = operator_lists(target_dtype, which)
        rules = float32_rules(target_dtype, which)
    else:
        defaults = operator_lists(target_dtype, "mxnet")
        lists = {key: list(lists[key]) if lists.get(key) is not None else defaults[key] for key in defaults}
        rules = {}
    fallbacks = set(float32_fallbacks()) if target_dtype == "bfloat16" else set()
    amp_dtype = BFLOAT16 if target_dtype == "bfloat16" else target_dtype
    fp32_params = amp.list_lp16_use_fp32_params(amp_dtype) or {}
    by_amp = [name for name in lists["target_precision_ops"] if name in fp32_params]
    by_mxfp16 = [name for name in lists["target_precision_ops"] if name not in fp32_params]
    joins = join_operators(target_dtype)
    modules = [m for module in (symbol, ndarray) for m in (module, module.op)]
    originals = {(m, op): getattr(m, op) for m in modules for op in rules}
    # MXNet's own Deconvolution, which a layer given bfloat16 weights runs (bfloat16_deconvolution).
    deconvolution = {(m, op): getattr(m, op) for m, op in legacy_operator_functions("Deconvolution")}
    amp.init(target_dtype=target_dtype, target_precision_ops=by_amp,
             conditional_fp32_ops=lists["conditional_fp32_ops"], fp32_ops=[])
    warn = functools.partial(_warn_fallback, target_dtype=target_dtype)
    _active["target"] = amp_dtype
    _wrap_legacy(by_mxfp16, lambda f, name: w.target_rebuild(f, name, amp_dtype))
    _wrap_legacy(lists["fp32_ops"], lambda f, name: w.float32_call(f, name, warn if name in fallbacks else None))
    _wrap_legacy([n for n in joins if not n.startswith(amp_numpy.NUMPY_PREFIXES)],
                 lambda f, name: w.widest_call(f, name, amp_dtype))
    if target_dtype == "bfloat16":  # the failure is oneDNN's, on CPUs; a GPU's deconvolution is cuDNN's
        for (m, op), original in deconvolution.items():
            setattr(m, op, bfloat16_weight_call(getattr(m, op), original))
        _wrap_legacy(["Deconvolution"], lambda f, name: single_channel_as_convolution(f))
        _wrap_legacy(["Pooling"], lambda f, name: global_average_as_mean(f))  # oneDNN's, too (pooling.py)
    if "clip" in lists["fp32_ops"]:  # mxfp16's lists: in float32 anyway, by faster operators (clip.py)
        _wrap_legacy(["clip"], lambda f, name: clip_as_minimum_maximum(f))
    for (m, op), original in originals.items():
        setattr(m, op, w.float32_where(original, getattr(m, op), rules[op], op))
    widest = set(amp.list_widest_type_cast(amp_dtype))
    numpy_rules = amp_numpy.numpy_rules(lists, target_dtype, widest, set(joins), fallbacks)
    amp_numpy.wrap_numpy_functions(numpy_rules, amp_dtype, warn, rules)


def float32_layers(symbol, target_dtype, which="mxfp16"):
    """The layers of a graph that :func:`init_amp` keeps in float32 beyond the lists, by node name.

    ``amp.convert_model`` takes them as its ``excluded_sym_names``.

    Parameters
    ----------
    symbol : mx.sym.Symbol
        The float32 network.
    target_dtype : str
        ``'bfloat16'`` or ``'float16'``.
    which : str
        A name of :data:`LIST_SETS` (MXNet's lists have no such rule: ``[]``).

    Returns
    -------
    list of str
    """
    rules = float32_rules(target_dtype, which)
    nodes = json.loads(symbol.tojson())["nodes"]
    return [n["name"] for n in nodes if n["op"] in rules and rules[n["op"]](w.LayerCall.of_node(n, nodes))]
