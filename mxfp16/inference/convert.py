"""A trained Gluon network as a deployable graph and parameters in one precision, and back into a block.

A deployed model is an MXNet symbol whose one input, ``data``, takes float32 NCHW images and whose output is
float32 logits, whatever precision runs inside, plus its parameters in the ``arg:``/``aux:`` form of
``HybridBlock.export`` (plain MXNet loads the pair with ``gluon.SymbolBlock.imports``). ``docs/inference.md``
("How each precision is converted") says how each precision gets there.
"""
import warnings
from dataclasses import dataclass, field

import mxnet as mx
from mxnet import gluon

from .._internals import renew_parameter_symbols
from ..amp.recurrent import fused
from ..precision import Precision

__all__ = ["INPUT_NAME", "Deployable", "traced", "deployable", "load_block"]

#: The name of the deployed graph's input.
INPUT_NAME = "data"


@dataclass
class Deployable:
    """A graph and its parameters, ready to save or to load into a block.

    Attributes
    ----------
    symbol : mx.sym.Symbol
        float32 ``data`` in, float32 logits out.
    params : dict
        ``{'arg:<name>': NDArray, 'aux:<name>': NDArray}`` (``mx.nd.save`` writes it as a ``.params`` file).
    precision : Precision
    notes : dict
        How it was converted (AMP lists, layers kept in float32, list entries AMP's graph pass cannot place).
    """

    symbol: object
    params: dict
    precision: Precision
    notes: dict = field(default_factory=dict)


def traced(net, data=None):
    """The graph of a Gluon network and its parameters, traced symbolically.

    Parameters
    ----------
    net : gluon.HybridBlock
        Every parameter initialised (:func:`mxfp16.train.parts.build_network` does that).
    data : mx.sym.Symbol, optional
        What to feed the network (default: the variable ``data``).

    Returns
    -------
    (mx.sym.Symbol, dict, dict)
        The output symbol, ``{name: NDArray}`` of its arguments and of its auxiliary states.
    """
    renew_parameter_symbols(net)
    with fused(net):  # recurrent layers auto (or the user) unfused: exported fused, for any sequence length
        out = net(mx.sym.var(INPUT_NAME) if data is None else data)
    params = {name: p.data() for name, p in net.collect_params().items()}
    args, auxs = set(out.list_arguments()), set(out.list_auxiliary_states())
    return (out, {k: v for k, v in params.items() if k in args},
            {k: v for k, v in params.items() if k in auxs})


def _joined(arg_params, aux_params):
    return {**{f"arg:{k}": v for k, v in arg_params.items()}, **{f"aux:{k}": v for k, v in aux_params.items()}}


def _placeable(lists, target_dtype):
    """The AMP lists cut to what ``amp.convert_symbol`` accepts, and what was cut.

    ``amp.init`` takes any operator name; the graph pass asserts that each one
    is in MXNet's own lists for the target. An operator that only AMP's
    "widest type" rule knows (``elemwise_add``, ``_Plus``) would stop the
    export; it keeps its inputs' type instead, and the cut is recorded.
    """
    from mxnet.contrib import amp

    key = amp.amp.bfloat16 if target_dtype == "bfloat16" else target_dtype
    legal = set(amp.list_lp16_ops(key) + amp.list_fp32_ops(key) + amp.list_lp16_fp32_ops(key)
                + [c[0] for c in amp.list_conditional_fp32_ops(key)])
    kept = {
        "target_dtype_ops": [op for op in lists["target_precision_ops"] if op in legal],
        "fp32_ops": [op for op in lists["fp32_ops"] if op in legal],
        "conditional_fp32_ops": [(op, param, list(values)) for op, param, values in lists["conditional_fp32_ops"]
                                 if op in legal],
    }
    dropped = sorted({op for op in lists["target_precision_ops"] + lists["fp32_ops"] if op not in legal}
                     | {c[0] for c in lists["conditional_fp32_ops"] if c[0] not in legal})
    return kept, dropped


def deployable(net, precision, amp_lists="mxfp16"):
    """Convert a trained network into a :class:`Deployable` of ``precision`` (``docs/inference.md``).

    Parameters
    ----------
    net : gluon.HybridBlock
        The trained network with ``precision.param_dtype`` parameters, as :func:`mxfp16.train.parts.build_network`
        builds it; only traced, never changed.
    precision : Precision
    amp_lists : str
        ``'mxfp16'`` or ``'mxnet'``: the operator lists of an AMP conversion.

    Returns
    -------
    Deployable

    Raises
    ------
    ValueError
        The network's parameter dtype does not match ``precision``, or unknown AMP lists.
    """
    from ..amp.lists import LIST_SETS, float32_layers, operator_lists
    from ..amp.wrappers import dtype_name

    dtypes = {dtype_name(p.dtype) for p in net.collect_params().values()}
    # BatchNorm keeps float32 parameters in a float16 network, so float32 may appear in any of them.
    if not dtypes <= {precision.param_dtype, "float32"} or precision.param_dtype not in dtypes:
        raise ValueError(f"a {precision.name} export needs a network with {precision.param_dtype} parameters; "
                         f"this one has {', '.join(sorted(dtypes))} (build it with "
                         "mxfp16.train.parts.build_network; bfloat16 parameters, of "
                         "mxfp16.amp.bfloat16_deconvolution, go back exactly with mxfp16.cast_net(net, 'float32'))")
    if precision.amp and amp_lists not in LIST_SETS:
        raise ValueError(f"AMP lists {amp_lists!r}: choose one of {', '.join(LIST_SETS)}")
    if precision.name == "float32":
        symbol, args, auxs = traced(net)
        return Deployable(symbol, _joined(args, auxs), precision, {})
    if not precision.amp:
        # The first layer sees float16; the caller keeps feeding float32 and reading float32.
        symbol, args, auxs = traced(net, mx.sym.cast(mx.sym.var(INPUT_NAME), dtype=precision.compute_dtype))
        return Deployable(mx.sym.cast(symbol, dtype="float32"), _joined(args, auxs), precision,
                          {"cast": "every layer in float16 except BatchNorm's parameters (float32)"})
    from mxnet.contrib import amp

    symbol, args, auxs = traced(net)
    lists, dropped = _placeable(operator_lists(precision.compute_dtype, amp_lists), precision.compute_dtype)
    keep_float32 = float32_layers(symbol, precision.compute_dtype, amp_lists)
    # convert_model replaces the entries it casts: give it its own dictionaries.
    symbol, args, auxs = amp.convert_model(symbol, dict(args), dict(auxs), target_dtype=precision.compute_dtype,
                                           excluded_sym_names=keep_float32, cast_optional_params=True, **lists)
    return Deployable(symbol, _joined(args, auxs), precision,
                      {"amp_lists": amp_lists, "float32_layers": keep_float32, "ops_not_placeable": dropped})


def load_block(symbol, params, ctx):
    """A hybridized ``SymbolBlock`` of a deployed graph, as ``SymbolBlock.imports`` builds one.

    Parameters
    ----------
    symbol : mx.sym.Symbol
    params : dict
        ``arg:``/``aux:`` parameters; each keeps the dtype it has (bfloat16 and float16 included).
    ctx : mx.Context or list of mx.Context

    Returns
    -------
    gluon.SymbolBlock
        Static memory and shapes, as the trainer hybridizes.
    """
    with warnings.catch_warnings():
        # SymbolBlock warns that it cannot tell the input's dtype: the first batch decides it.
        warnings.filterwarnings("ignore", message="Cannot decide type", category=UserWarning)
        block = gluon.SymbolBlock(symbol, [mx.sym.var(INPUT_NAME)])
    block.collect_params().load_dict(params, ctx=ctx, cast_dtype=True, dtype_source="saved")
    block.hybridize(static_alloc=True, static_shape=True)
    return block
