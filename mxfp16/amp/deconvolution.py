"""A transposed convolution with one output channel, computed as a convolution: MXNet 1.9.1's own fails.

MXNet 1.9.1's oneDNN ``Deconvolution`` (Gluon's ``Conv2DTranspose``) with one
output channel fails its backward pass when its input gradient is needed, in
float32 too (docs/amp-table.md, "Conv2DTranspose"). The same layer is a
``Convolution`` of the input with ``s - 1`` zeros inserted between pixels,
padded by ``k - 1 - p``, with the weight flipped in space and its channel axes
swapped: ``s * s`` times the multiply-adds, which one output channel keeps
small, and in bfloat16 under AMP. (A ``Deconvolution`` padded to two output
channels by a computed weight crashes the process in 1.9.1.)
:func:`mxfp16.amp.lists.init_amp` puts :func:`single_channel_as_convolution`
around ``mx.nd.Deconvolution`` and ``mx.sym.Deconvolution``.

AMP keeps every other ``Deconvolution`` in float32, because MXNet 1.9.1's
backward crashes whenever the layer's weight is computed in the graph, and
AMP's cast of a float32 weight is (docs/results/deconv-bf16-zen5). With a
weight that *is* bfloat16, a leaf, the layer trains in bfloat16.
:func:`mxfp16.amp.bfloat16_deconvolution` gives a network's transposed
convolutions such weights (their float32 master copies live in the
optimizer's state: :func:`mxfp16.optim.with_bfloat16_masters`), and
:func:`bfloat16_weight_call`, put around the operator by
:func:`~mxfp16.amp.lists.init_amp`, runs a call whose weight is bfloat16 in
bfloat16.
"""
import functools

from ..float_formats import BFLOAT16, is_bfloat16
from .wrappers import as_tuple, cast, module_of, named_like

__all__ = ["single_channel_as_convolution", "routed", "bfloat16_weight_call", "is_bfloat16_leaf"]

#: The inputs of ``Deconvolution``, in its order.
_INPUTS = ("data", "weight", "bias")


def routed(kwargs):
    """Whether a ``Deconvolution`` call with these arguments takes the convolution route.

    One output channel, no groups or dilation, a 2-D kernel, ``pad <= kernel - 1``, no ``target_shape``, NCHW.
    """
    kernel = as_tuple(kwargs.get("kernel", ""))
    pad = as_tuple(kwargs.get("pad", "")) or (0,) * len(kernel)
    return (str(kwargs.get("num_filter")) == "1" and str(kwargs.get("num_group", 1)) == "1"
            and len(kernel) == 2 and set(as_tuple(kwargs.get("dilate", "")) or (1,)) == {1}
            and not as_tuple(kwargs.get("target_shape", "")) and kwargs.get("layout") in (None, "NCHW")
            and all(0 <= p <= k - 1 for p, k in zip(pad, kernel)))


def single_channel_as_convolution(f):
    """``f`` (``Deconvolution``), with one-output-channel layers computed as a convolution (see the module docstring).

    The convolution is looked up when the layer is called (``mx.nd`` or
    ``mx.sym`` by its input), so under AMP it is AMP's: bfloat16.
    """
    def deconvolution(*args, **kwargs):
        inputs, options = _split(args, kwargs)
        # Without a weight the call declares its own (Gluon's shape inference): nothing is computed.
        if "weight" not in inputs or not routed(kwargs):
            return f(*args, **kwargs)
        return _as_convolution(inputs["data"], inputs["weight"], inputs.get("bias"), options)

    return named_like(deconvolution, f, "Deconvolution")


def _split(args, kwargs):
    """A ``Deconvolution`` call's ``({input name: tensor}, {attribute: value})``."""
    inputs = dict(zip(_INPUTS, args))
    inputs.update({k: kwargs[k] for k in _INPUTS if k in kwargs})
    return inputs, {k: v for k, v in kwargs.items() if k not in _INPUTS}


@functools.lru_cache(maxsize=None)
def _bfloat16_flag():
    """The ``__dtype__`` attribute a graph variable declared bfloat16 carries (MXNet's type flag, as a string)."""
    from mxnet import symbol

    return symbol.var("bfloat16", dtype=BFLOAT16).list_attr()["__dtype__"]


def is_bfloat16_leaf(x):
    """Whether ``x`` is a bfloat16 array, or a graph variable declared bfloat16 (a bfloat16 parameter's ``var()``)."""
    from mxnet import ndarray, symbol

    if isinstance(x, ndarray.NDArray):
        return is_bfloat16(x)
    return (isinstance(x, symbol.Symbol) and x.get_children() is None
            and x.list_attr().get("__dtype__") == _bfloat16_flag())


def bfloat16_weight_call(f, original):
    """``f`` (``Deconvolution`` as AMP runs it, in float32), but ``original`` in bfloat16 where the weight is bfloat16.

    A call whose weight is a bfloat16 leaf (:func:`is_bfloat16_leaf`) gets
    its data cast to bfloat16 and runs MXNet's own operator on it, so no
    cast sits between the weight and the layer (a computed weight crashes
    MXNet 1.9.1's backward: see the module docstring). Its output is bfloat16.

    Raises
    ------
    TypeError
        A bfloat16 weight beside a bias of another dtype (:func:`mxfp16.amp.bfloat16_deconvolution` casts both).
    """
    def deconvolution(*args, **kwargs):
        inputs, options = _split(args, kwargs)
        weight, bias = inputs.get("weight"), inputs.get("bias")
        if weight is None or not is_bfloat16_leaf(weight):
            return f(*args, **kwargs)
        if bias is not None and not options.get("no_bias", False) and not is_bfloat16_leaf(bias):
            raise TypeError("a Deconvolution (Conv2DTranspose) has a bfloat16 weight and a bias of another dtype; "
                            "MXNet 1.9.1 cannot cast either inside the layer: give both bfloat16 "
                            "(mxfp16.amp.bfloat16_deconvolution(net) does), or both float32")
        tensors = [cast(inputs["data"], BFLOAT16), weight] + ([bias] if bias is not None else [])
        return original(*tensors, **options)

    return named_like(deconvolution, f, "Deconvolution")


def _as_convolution(data, weight, bias, kwargs):
    F = module_of(data)
    kernel = as_tuple(kwargs["kernel"])
    stride = as_tuple(kwargs.get("stride", "")) or (1, 1)
    pad = as_tuple(kwargs.get("pad", "")) or (0, 0)
    adj = as_tuple(kwargs.get("adj", "")) or (0, 0)
    x = data
    for axis, (s, a) in enumerate(zip(stride, adj), start=2):
        x = _zeros_between(F, x, axis, s)
        if a:
            x = F.concat(x, F.slice_axis(F.zeros_like(x), axis=axis, begin=0, end=a), dim=axis)
    # transpose, not swapaxes: shape inference runs backward through it, so a deferred weight (in_channels=0, as
    # Gluon declares a Conv2DTranspose without in_channels) gets its shape from the convolution.
    w = F.transpose(F.flip(F.flip(weight, axis=2), axis=3), axes=(1, 0, 2, 3))
    no_bias = bias is None or str(kwargs.get("no_bias", bias is None)) == "True"
    inputs = [x, w] if no_bias else [x, w, bias]
    return F.Convolution(*inputs, kernel=kernel, num_filter=1, no_bias=no_bias,
                         pad=tuple(k - 1 - p for k, p in zip(kernel, pad)), name=kwargs.get("name"))


def _zeros_between(F, x, axis, s):
    """``x`` with ``s - 1`` zeros inserted between neighbours along ``axis`` (2 or 3), none after the last."""
    if s == 1:
        return x
    spread = F.expand_dims(x, axis=axis + 1)
    spread = F.concat(spread, *[F.zeros_like(spread)] * (s - 1), dim=axis + 1)
    spread = F.reshape(spread, shape=(0, 0, -3, 0) if axis == 2 else (0, 0, 0, -3))
    return F.slice_axis(spread, axis=axis, begin=0, end=-(s - 1))
