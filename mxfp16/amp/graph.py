"""A network's graph as AMP built it: each operator with its attributes, input shapes and dtypes, and the casts.

:func:`trace` calls a Gluon network on symbols (no weights, no arithmetic,
any CPU) and MXNet's shape and type inference fill in what each operator
takes and gives. With AMP active the graph holds AMP's casts:
:func:`count_casts` says how many tensors a step converts between dtypes.
"""
import json
from dataclasses import dataclass

import numpy as np

from .wrappers import LayerCall, dtype_name

__all__ = ["Node", "Casts", "trace", "count_casts", "CASTS"]

#: AMP's cast operators.
CASTS = ("amp_cast", "amp_multicast")


@dataclass(frozen=True)
class Node:
    """One operator of a traced graph.

    Attributes
    ----------
    name, op : str
    attrs : dict
        ``{argument: str(value)}`` as the graph stores them.
    inputs : tuple of str
        The entries it reads (a variable's name, or another node's output, ``conv0_fwd_output``).
    shapes : tuple
        Each input's shape (``None`` where inference could not tell).
    input_dtypes : tuple
        Each input's dtype name (``None`` unknown).
    dtype : str or None
        The dtype of its first output: the dtype it computes in.
    parameters : tuple of bool
        For each input, whether it is a parameter (a variable that declares its dtype).
    call : LayerCall
        What a float32 rule sees of it.
    """

    name: str
    op: str
    attrs: dict
    inputs: tuple
    shapes: tuple
    input_dtypes: tuple
    dtype: object
    parameters: tuple
    call: LayerCall


@dataclass(frozen=True)
class Casts:
    """How many tensors a graph converts between dtypes, each source and target dtype counted once.

    MXNet merges identical casts of one tensor in a hybridized graph
    (``MXNET_ELIMINATE_COMMON_EXPR``); a cast to the dtype a tensor has is free.

    Attributes
    ----------
    data : int
        Casts of activations (the network's inputs and what its operators compute).
    parameters : int
        Casts of parameters (AMP casts each weight for every call that reads it).
    """

    data: int
    parameters: int


def _entry_names(internals, nodes):
    """``{(node index, output index): entry name}`` for every entry of the graph."""
    variables = {node["name"] for node in nodes if node["op"] == "null"}
    by_node = {}
    for name in internals.list_outputs():
        if name not in variables:
            by_node.setdefault(name.rsplit("_", 1)[0], []).append(name)
    entries = {}
    for index, node in enumerate(nodes):
        if node["op"] == "null":
            entries[(index, 0)] = node["name"]
        else:
            for k, name in enumerate(by_node.get(node["name"], [])):
                entries[(index, k)] = name
    return entries


def trace(net, shapes, numpy_mode=False):
    """The operators of ``net`` called on inputs of ``shapes``, with what shape and type inference say.

    Parameters
    ----------
    net : gluon.HybridBlock
    shapes : list of tuple
        One shape per input of ``net`` (float32 inputs), batch first.
    numpy_mode : bool
        Trace under ``npx.set_np()`` semantics.

    Returns
    -------
    list of Node
        In graph order; AMP's casts included (``op`` in :data:`CASTS`).

    Raises
    ------
    TypeError
        ``net`` is not a HybridBlock.
    mx.MXNetError
        When the graph does not type or shape-check.
    """
    import mxnet as mx
    from mxnet import gluon

    if not isinstance(net, gluon.HybridBlock):
        raise TypeError(f"{type(net).__name__} is not a gluon.HybridBlock: only a HybridBlock's graph can be read "
                        "without running it (make it one, or measure its HybridBlock parts)")
    names = ["data"] if len(shapes) == 1 else [f"data{i}" for i in range(len(shapes))]
    inputs = [mx.sym.var(name) for name in names]
    out = net(*[s.as_np_ndarray() for s in inputs] if numpy_mode else inputs)
    out = out[0] if isinstance(out, (list, tuple)) else out
    if numpy_mode:
        out = out.as_nd_ndarray()
    internals = out.get_internals()
    known = dict(zip(names, [tuple(s) for s in shapes]))
    _, out_shapes, _ = internals.infer_shape_partial(**known)
    _, out_types, _ = internals.infer_type_partial(**{name: "float32" for name in names})
    shape_of = dict(zip(internals.list_outputs(), out_shapes))
    dtype_of = dict(zip(internals.list_outputs(), out_types))
    nodes = json.loads(out.tojson(remove_amp_cast=False))["nodes"]
    entries = _entry_names(internals, nodes)
    found = []
    for index, node in enumerate(nodes):
        if node["op"] == "null":
            continue
        inputs = [entries.get((i, k)) for i, k, _ in node["inputs"]]
        found.append(Node(
            name=node["name"], op=node["op"], attrs=dict(node.get("attrs", {})), inputs=tuple(inputs),
            shapes=tuple(_shape(shape_of.get(name)) for name in inputs),
            input_dtypes=tuple(_dtype(dtype_of.get(name)) for name in inputs),
            dtype=_dtype(dtype_of.get(entries.get((index, 0)))),
            parameters=tuple(nodes[i]["op"] == "null" and "__dtype__" in nodes[i].get("attrs", {})
                             for i, _, _ in node["inputs"]),
            call=LayerCall.of_node(node, nodes)))
    return found


def _shape(shape):
    """A shape inference result, ``None`` when unknown (MXNet gives ``()`` or zeros then)."""
    return None if not shape or 0 in shape else tuple(int(s) for s in shape)


def _dtype(dtype):
    return None if dtype is None else dtype_name(np.dtype(dtype))


def count_casts(nodes):
    """How many tensors the graph of :func:`trace` converts between dtypes (see :class:`Casts`).

    Parameters
    ----------
    nodes : list of Node

    Returns
    -------
    Casts
    """
    done = {"data": set(), "parameters": set()}
    for node in nodes:
        if node.op not in CASTS or node.dtype is None:
            continue
        # amp_cast has one input; amp_multicast casts each of its inputs to the widest dtype among them.
        for source, dtype, parameter in zip(node.inputs, node.input_dtypes, node.parameters):
            if dtype is not None and dtype != node.dtype:
                done["parameters" if parameter else "data"].add((source, node.dtype))
    return Casts(data=len(done["data"]), parameters=len(done["parameters"]))
