"""The wrappers AMP puts around an operator's function, for every kind of array MXNet has.

Each casts an operator's inputs first: to the target dtype, to float32, or to
the widest dtype among them, where ``amp.init``'s own fail or are slow, and
for numpy mode's functions, which AMP does not wrap. A numpy-mode input stays
numpy-mode: MXNet's ``amp_cast`` and ``amp_multicast`` are legacy operators,
so it goes through ``as_nd_ndarray`` and back (the same array, with its
autograd history).
"""
import functools

import numpy as np

from .._internals import block_op_kwargs, block_operator, numpy_symbol_class, rebuild_symbol
from ..float_formats import BFLOAT16

__all__ = ["dtype_name", "is_low_precision", "cast", "named_like", "target_call", "target_rebuild",
           "float32_call", "widest_call", "conditional_float32_call", "LayerCall", "float32_where",
           "as_tuple", "module_of"]

_FLOAT16 = np.dtype(np.float16)
_FLOAT32 = np.dtype(np.float32)


def dtype_name(dtype):
    """``'bfloat16'`` for MXNet's bfloat16, else numpy's name (``'float32'``)."""
    dtype = np.dtype(dtype)
    return "bfloat16" if dtype == BFLOAT16 else dtype.name


def is_low_precision(dtype):
    """Whether ``dtype`` is one of AMP's 16-bit floats (bfloat16 or float16)."""
    return np.dtype(dtype) in (BFLOAT16, _FLOAT16)


@functools.lru_cache(maxsize=None)
def _kinds():
    """MXNet's array and graph modules and the numpy-mode classes, looked up once: every wrapped call asks."""
    from mxnet import ndarray, numpy, symbol

    return ndarray, symbol, numpy.ndarray, numpy_symbol_class()


def module_of(x):
    """``mx.sym`` for a Symbol, else ``mx.nd``: the operators a call on ``x`` takes."""
    ndarray, symbol, _, _ = _kinds()
    return symbol if isinstance(x, symbol.Symbol) else ndarray


def _is_tensor(x):
    ndarray, symbol, _, _ = _kinds()
    return isinstance(x, (ndarray.NDArray, symbol.Symbol))


def cast(x, dtype):
    """``x`` through ``amp_cast`` to ``dtype``, numpy-mode kept numpy-mode; anything else unchanged.

    ``amp_cast`` leaves integer inputs alone, so indices pass through.
    """
    ndarray, symbol, np_ndarray, np_symbol = _kinds()
    if isinstance(x, (np_symbol, np_ndarray)):  # subclasses of the legacy classes: tested first
        return cast(x.as_nd_ndarray(), dtype).as_np_ndarray()
    if isinstance(x, (symbol.Symbol, ndarray.NDArray)):
        return module_of(x).amp_cast(x, dtype=dtype)
    return x


def _each(x, fn):
    """``fn`` applied to ``x``, or to each tensor of a list or tuple ``x`` (numpy's ``concatenate([a, b])``)."""
    if isinstance(x, (list, tuple)) and any(_is_tensor(v) for v in x):
        return type(x)(fn(v) for v in x)
    return fn(x)


def named_like(wrapper, f, name):
    """``wrapper`` named and documented as ``f`` (``name`` where ``f`` has no name): how a patched operator reads."""
    wrapper.__name__ = getattr(f, "__name__", name)
    wrapper.__doc__ = getattr(f, "__doc__", None)
    wrapper.__module__ = getattr(f, "__module__", wrapper.__module__)
    return wrapper


def _to_target(x, target_dtype):
    """A float32 (or other 16-bit) array cast to ``target_dtype``, as AMP casts; every Symbol cast."""
    ndarray, symbol, _, _ = _kinds()
    if isinstance(x, symbol.Symbol):
        return cast(x, target_dtype)
    if isinstance(x, ndarray.NDArray):
        dtype = np.dtype(x.dtype)
        pair = (_FLOAT32, BFLOAT16) if x.ctx.device_type == "cpu" else (_FLOAT32, _FLOAT16)
        if dtype != np.dtype(target_dtype) and dtype in pair:
            return cast(x, target_dtype)
    return x


def target_call(f, name, target_dtype, skip=("out",)):
    """``f`` with its float inputs cast to ``target_dtype`` first (AMP's rule for the target list).

    Keyword arguments in ``skip`` are left alone (numpy's ``out=`` is no input).
    """
    def target_op(*args, **kwargs):
        args = [_each(a, lambda v: _to_target(v, target_dtype)) for a in args]
        kwargs = {k: v if k in skip else _each(v, lambda u: _to_target(u, target_dtype)) for k, v in kwargs.items()}
        return f(*args, **kwargs)

    return named_like(target_op, f, name)


def target_rebuild(f, name, target_dtype):
    """AMP's target-list wrapper for legacy symbols, without its cost.

    AMP builds the node, then rebuilds it on cast inputs (so that a
    ``weight`` variable the call created is cast too), and lists the whole
    graph's auxiliary states at every call to leave them uncast: tracing a
    deep network is quadratic (16 s instead of 2 s for residualattentionnet452).
    Used only for operators with no auxiliary state; NDArrays are cast first.
    """
    _, symbol, _, np_symbol = _kinds()
    cast_first = target_call(f, name, target_dtype)

    def target_op(*args, **kwargs):
        probe = next((v for v in list(args) + list(kwargs.values()) if _is_tensor(v)), None)
        if not isinstance(probe, symbol.Symbol) or isinstance(probe, np_symbol):
            return cast_first(*args, **kwargs)
        sym = f(*args, **kwargs)
        inputs = [cast(x, target_dtype) for x in sym.get_children()]
        return rebuild_symbol(sym, inputs)

    return named_like(target_op, f, name)


def _to_float32(x):
    """``x`` cast to float32 when it is a 16-bit array or a graph node; anything else unchanged."""
    ndarray, symbol, _, _ = _kinds()
    if isinstance(x, symbol.Symbol):
        # A parameter (a variable that declares its dtype: Parameter.var()) is float32 under AMP: a cast would
        # only add a node, and through one Deconvolution's deferred shape inference crashes MXNet. A graph's
        # input is cast: a hybridized layer in a plain Block gets what the layer before returned (bfloat16).
        if x.get_children() is None and "__dtype__" in x.list_attr():
            return x
        return cast(x, "float32")
    if isinstance(x, ndarray.NDArray) and is_low_precision(x.dtype):
        return cast(x, "float32")
    return x


def float32_call(f, name, on_first_use=None, skip=("out",)):
    """``f`` with its tensor inputs cast to float32 first; ``on_first_use(name)`` runs once, at the first call.

    AMP's own wrapper for symbols rebuilds the node on cast inputs after
    ``f``: that fails for operators with no inputs (an RNN's ``begin_state``)
    and crashes the process for ``Deconvolution``.
    """
    pending = [on_first_use] if on_first_use else []

    def float32_op(*args, **kwargs):
        if pending:
            pending.pop()(name)
        args = [_each(a, _to_float32) for a in args]
        kwargs = {k: v if k in skip else _each(v, _to_float32) for k, v in kwargs.items()}
        return f(*args, **kwargs)

    return named_like(float32_op, f, name)


def widest_call(f, name, target_dtype, skip=("out",)):
    """``f`` with its inputs cast to the widest float dtype among them first (AMP's ``WIDEST_TYPE_CASTS`` rule).

    For arrays: float32 when any input is float32, but an in-place update
    (numpy's ``y += x``, ``add(y, x, out=y)``) into a 16-bit ``out`` casts
    the float32 inputs down, as numpy's own does. Graph nodes go through one
    ``amp_multicast``, which casts to the widest once types are inferred.
    """
    ndarray, symbol, _, _ = _kinds()
    target = np.dtype(target_dtype)

    def widest_op(*args, **kwargs):
        args = list(args)
        slots = []
        for i, a in enumerate(args):
            if isinstance(a, (list, tuple)) and any(_is_tensor(v) for v in a):
                args[i] = list(a)
                slots += [(args[i], j) for j, v in enumerate(a) if _is_tensor(v)]
            elif _is_tensor(a):
                slots.append((args, i))
        slots += [(kwargs, k) for k, v in kwargs.items() if k not in skip and _is_tensor(v)]
        tensors = [where[key] for where, key in slots]
        out = kwargs.get("out")
        if any(isinstance(t, symbol.Symbol) for t in tensors):
            widened = _multicast(tensors) if len(tensors) > 1 else tensors
        elif isinstance(out, ndarray.NDArray) and np.dtype(out.dtype) == target:
            widened = [cast(t, target_dtype) if np.dtype(t.dtype) == _FLOAT32 else t for t in tensors]
        elif any(np.dtype(t.dtype) == _FLOAT32 for t in tensors):
            widened = [cast(t, "float32") if np.dtype(t.dtype) == target else t for t in tensors]
        else:
            widened = tensors
        for (where, key), t in zip(slots, widened):
            where[key] = t
        return f(*args, **kwargs)

    return named_like(widest_op, f, name)


def _multicast(symbols):
    """``amp_multicast`` over legacy or numpy-mode symbols; each output keeps its input's class."""
    _, symbol, _, np_symbol = _kinds()
    legacy = [s.as_nd_ndarray() if isinstance(s, np_symbol) else s for s in symbols]
    out = symbol.amp_multicast(*legacy, num_outputs=len(legacy))
    return [o.as_np_ndarray() if isinstance(s, np_symbol) else o for s, o in zip(symbols, out)]


def conditional_float32_call(f, name, rules):
    """``f`` on float32 inputs when a keyword argument has one of the listed values, else ``f`` as it is.

    ``rules`` is ``[(argument, values)]``, as AMP's ``conditional_fp32_ops``
    (``Activation`` with ``act_type='softrelu'``).
    """
    return _float32_if(f, f, lambda args, kwargs: any(kwargs.get(arg) in values for arg, values in rules), name)


def _float32_if(original, wrapped, test, name):
    """``wrapped``, but ``original`` on float32 inputs for a call where ``test(args, kwargs)`` holds."""
    plain = float32_call(original, name)

    def conditional_op(*args, **kwargs):
        return (plain if test(args, kwargs) else wrapped)(*args, **kwargs)

    return named_like(conditional_op, wrapped, name)


def as_tuple(value):
    """An operator parameter as a tuple of ints: ``(7, 7)``, ``'(7, 7)'`` and ``7`` (as ``(7,)``)."""
    if isinstance(value, str):
        value = [v for v in value.strip("()[] ").replace(" ", "").split(",") if v]
    if isinstance(value, int):
        value = (value,)
    try:
        return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        return ()


class LayerCall:
    """What one call of a layer's operator says about the layer: what a float32 rule may key on.

    From a call (:meth:`of_call`) or a graph node (:meth:`of_node`), with the
    same ``attrs``: MXNet stores each argument in the graph as ``str(value)``.

    Attributes
    ----------
    op : str
        The operator (``'Convolution'``).
    attrs : dict
        ``{argument: str(value)}``, tensors and the node's name left out.
    weight : str or None
        The name of the weight parameter (the second input) when the call
        builds a graph node, else ``None``.
    shapes : tuple or None
        The input shapes when the call runs on arrays, else ``None``.
    weight_shape : tuple
        The weight's shape as far as it is known (a graph node's declares
        ``0`` for a size Gluon has yet to infer), else ``()``.
    """

    def __init__(self, op, attrs, weight=None, shapes=None, weight_shape=()):
        self.op, self.attrs, self.weight, self.shapes = op, dict(attrs), weight, shapes
        self.weight_shape = weight_shape

    @classmethod
    def of_call(cls, op, args, kwargs):
        ndarray, symbol, _, _ = _kinds()
        tensors = [a for a in args if _is_tensor(a)] + [kwargs[k] for k in ("data", "weight", "bias")
                                                        if _is_tensor(kwargs.get(k))]
        attrs = {k: str(v) for k, v in kwargs.items() if k not in _NOT_ATTRIBUTES and not _is_tensor(v)}
        weight = tensors[1] if len(tensors) > 1 else None
        name = weight.name if isinstance(weight, symbol.Symbol) and weight.get_children() is None else None
        shapes = tuple(tuple(t.shape) for t in tensors) if tensors and all(
            isinstance(t, ndarray.NDArray) for t in tensors) else None
        declared = weight.list_attr().get("__shape__", "") if name else ""
        return cls(op, attrs, name, shapes, shapes[1] if shapes and len(shapes) > 1 else as_tuple(declared))

    @classmethod
    def of_node(cls, node, nodes):
        """From a node of ``json.loads(symbol.tojson(remove_amp_cast=False))['nodes']``; ``nodes`` names its inputs.

        The weight is found behind AMP's casts (the graph of a network traced
        with AMP on casts each weight before the layer reads it).
        """
        weight, declared = None, ""
        if len(node["inputs"]) > 1:
            index, output, _ = node["inputs"][1]
            while nodes[index]["op"] in ("amp_cast", "amp_multicast"):
                cast = nodes[index]
                index, output, _ = cast["inputs"][output if cast["op"] == "amp_multicast" else 0]
            if nodes[index]["op"] == "null":
                weight, declared = nodes[index]["name"], nodes[index].get("attrs", {}).get("__shape__", "")
        return cls(node["op"], node.get("attrs", {}), weight, weight_shape=as_tuple(declared))

    @classmethod
    def of_block(cls, block):
        """From a Gluon convolution layer, before it runs: its arguments and its weight as far as Gluon knows its
        shape (``0`` input channels while deferred); ``None`` for any other block."""
        op = block_operator(block)
        weight = getattr(block, "weight", None)
        if op is None or weight is None:
            return None
        attrs = {k: str(v) for k, v in block_op_kwargs(block).items() if v is not None}
        return cls(op, attrs, weight.name, weight_shape=tuple(weight.shape or ()))

    def int_attr(self, name, default):
        try:
            return int(self.attrs.get(name, default))
        except ValueError:
            return default

    def tuple_attr(self, name):
        return as_tuple(self.attrs.get(name, ""))


#: Keyword arguments of an operator call that are not attributes of its node.
_NOT_ATTRIBUTES = ("name", "attr", "out")


def float32_where(original, wrapped, keeps_float32, name="Convolution"):
    """``wrapped`` unless ``keeps_float32(LayerCall)`` is true for the call; then ``original`` on float32 inputs.

    AMP's conditional list would wrap the already wrapped target operator,
    casting the inputs to float32 and straight back. ``keeps_float32`` is one
    of :data:`mxfp16.amp.lists.FLOAT32_RULES` or their union.
    """
    return _float32_if(original, wrapped, lambda args, kwargs: keeps_float32(LayerCall.of_call(name, args, kwargs)),
                       name)
