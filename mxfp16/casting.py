"""Casting a Gluon network and its batches for mixed precision.

The tutorial's recipe: cast the parameters and each batch to float16, and
compute the loss from float32 logits. BatchNorm keeps float32 parameters (its
operator takes float16 data with float32 gamma, beta and statistics);
LayerNorm, InstanceNorm and GroupNorm have no such mixed-dtype kernel in
MXNet 1.9.1, so their parameters follow the network.
"""
import itertools
from collections import OrderedDict

import numpy as np

from ._lazy import module
from .float_formats import BFLOAT16, FORMATS, format_scale, is_bfloat16
from .precision import Precision, check_activated, precision_of

mx = module("mxnet")
gluon = module("mxnet.gluon")


def cast_net(net, precision):
    """Cast ``net`` in place for ``precision`` and return it; BatchNorm layers keep float32 parameters.

    Parameters
    ----------
    net : gluon.Block
    precision : Precision or str
        A resolved :class:`~mxfp16.Precision` (an AMP one, or its ``param_dtype``,
        is checked with :func:`mxfp16.precision.check_activated`), or
        ``'float16'`` or ``'float32'`` (bfloat16 is not a Gluon parameter dtype:
        amp-bfloat16 keeps float32 parameters, except those
        :func:`mxfp16.amp.bfloat16_deconvolution` made bfloat16).

    Returns
    -------
    gluon.Block
        The same ``net`` (``Block.cast`` itself returns ``None``).
    """
    if isinstance(precision, Precision):
        precision = precision.param_dtype
    amp = precision_of(precision)
    check_activated(amp, net)
    name = np.dtype(precision).name if not isinstance(precision, str) else str(precision)
    if name == "bfloat16":
        raise TypeError("Gluon 1.9.1 cannot cast parameters to bfloat16; use precision "
                        "'amp-bfloat16', which keeps float32 parameters and lets AMP cast operators")
    # Under amp-bfloat16, the layers mxfp16.amp.bfloat16_deconvolution gave bfloat16 parameters keep them.
    keep = [p for p in net.collect_params().values()
            if amp is not None and amp.compute_dtype == "bfloat16" and is_bfloat16(p)]
    net.cast(name)
    for param in keep:
        param.cast(BFLOAT16)  # exact: float32 holds every bfloat16 value
    # Subclasses that override cast() must not drag BatchNorm statistics to float16.
    net.apply(_keep_batchnorm_float32)
    return net


def _keep_batchnorm_float32(block):
    if isinstance(block, gluon.nn.BatchNorm):
        for param in block.params.values():
            if np.dtype(param.dtype) != np.float32:
                param.cast("float32")


def dtype_report(net):
    """Each parameter's dtype, in the network's order.

    Returns
    -------
    OrderedDict
        ``{parameter name: dtype name}``, e.g.
        ``{'resnetv20_conv0_weight': 'float16', 'resnetv20_batchnorm0_gamma': 'float32'}``.
    """
    return OrderedDict((name, np.dtype(param.dtype).name) for name, param in net.collect_params().items())


def cast_batch(data, label, dtype, ctx_list, keep=()):
    """Split a batch across devices and cast its floating-point data to ``dtype``, changing no value silently.

    Integer arrays are never cast, and floating labels become float32. A
    floating input of whole numbers (token ids) is refused when the cast would
    change one, any input when a finite value would become inf, judged on a
    strided sample of at most :data:`SAMPLE` values (the whole input when the
    sample is whole numbers).

    Parameters
    ----------
    data : NDArray, numpy array or list, or tuple or list of them
        The batch, batch axis 0. A list or tuple of arrays is several inputs
        (``net(*inputs)``), all with the same batch size; a list of numbers
        (or of lists of numbers) is one array, as numpy reads it.
    label : array, tuple or list of arrays, or None
        The labels (several for ``loss_fn(out, *labels)``), or ``None`` for a network that computes its own loss.
    dtype : str
        The dtype for floating-point data (``Precision.data_dtype``).
    ctx_list : list of mx.Context
    keep : int or sequence of int
        Positions in ``data`` (0 for a single array) of inputs passed with
        their own dtype, unchecked: float32 token ids for an ``Embedding``
        (which takes ids of any dtype).

    Returns
    -------
    (list, list or None)
        One entry per device: an array, or a tuple of arrays where a tuple
        or list was given; ``None`` for the labels when ``label`` is None.
    """
    ctx_list = [ctx_list] if isinstance(ctx_list, mx.Context) else list(ctx_list)
    if not ctx_list:
        raise ValueError("cast_batch() got no devices: pass a list of contexts such as [mx.cpu()]")
    datas = _split(data, "data", ctx_list, dtype, _positions(keep, data))
    # Floating labels become float32, never the data dtype (class 2049 in float16 is 2048).
    labels = None if label is None else _split(label, "label", ctx_list, "float32", set(), labels=True)
    return datas, labels


#: How many values of a floating input :func:`cast_batch` reads on the host to tell real-valued data from ids.
SAMPLE = 4096


def _several(batch):
    """Whether ``batch`` is several inputs (a tuple or list of arrays), not one array written as nested lists."""
    return isinstance(batch, (tuple, list)) and (not batch or any(hasattr(item, "dtype") for item in batch))


def _positions(keep, data):
    """``keep`` as a set of input positions, each checked against the inputs ``data`` holds."""
    positions = {keep} if isinstance(keep, int) else set(keep)
    count = len(data) if _several(data) else 1
    wrong = sorted(p for p in positions if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < count)
    if wrong:
        raise ValueError(f"cast_batch(keep={keep!r}): {wrong[0]!r} names no input; the batch has {count} input(s), "
                         f"positions 0..{count - 1}")
    return positions


def _split(batch, what, ctx_list, dtype, keep, labels=False):
    """``batch`` as one entry per device: each input converted, checked, split, then cast to ``dtype`` (or kept)."""
    several = _several(batch)
    if several and not batch:
        raise ValueError(f"cast_batch() got an empty {type(batch).__name__} as {what}: pass the batch's array(s)")
    arrays = [_as_ndarray(a, what) for a in (batch if several else [batch])]
    sizes = {a.shape[0] if a.ndim else 0 for a in arrays}
    if len(sizes) > 1:
        raise ValueError(f"cast_batch(): the {what} arrays have different batch sizes {sorted(sizes)} on axis 0")
    if sizes == {0}:
        raise ValueError(f"cast_batch() got an empty batch ({what} has 0 samples on axis 0)")
    size = sizes.pop()
    if size < len(ctx_list):
        raise ValueError(f"cast_batch(): a batch of {size} sample(s) cannot be split over {len(ctx_list)} devices: "
                         f"each device needs at least one. Use batches of at least {len(ctx_list)} samples (a "
                         f"multiple of {len(ctx_list)} splits evenly; DataLoader(..., last_batch='discard') drops a "
                         "short last batch), or fewer devices")
    targets = []
    for position, a in enumerate(arrays):
        name = f"{what}[{position}]" if several else what
        target = None if position in keep else _target(a, dtype)
        if target is not None:
            _check_cast(a, target, name, "Pass the labels as integers: integer labels are never cast" if labels
                        else f"Pass ids as integers ({name}.astype('int32'): integer arrays are never cast), name "
                        f"the input in keep=({position},) to pass it as it is, or scale real values into range")
        targets.append(target)
    # Cast after the copy: on a GPU the cast is cheap and the host stays free.
    per_array = [[x if target is None else x.astype(target, copy=False) for x in _split_and_load(a, ctx_list)]
                 for a, target in zip(arrays, targets)]
    per_device = list(zip(*per_array))
    return [tuple(parts) if several else parts[0] for parts in per_device]


def _split_and_load(a, ctx_list):
    """``gluon.utils.split_and_load(a, ctx_list, even_split=False)``: the first ``size % devices`` parts one longer.

    Written out because MXNet 1.9.1's numpy-mode split passes numpy integers, which numpy 2 prints as
    ``np.int64(2)``, and MXNet's parser refuses (``Invalid Parameter format for indices``).
    """
    if len(ctx_list) == 1:
        return [a.as_in_context(ctx_list[0])]
    each, extra = divmod(int(a.shape[0]), len(ctx_list))
    bounds = [0, *itertools.accumulate(each + (i < extra) for i in range(len(ctx_list)))]
    return [a[bounds[i]:bounds[i + 1]].as_in_context(ctx) for i, ctx in enumerate(ctx_list)]


def _as_ndarray(a, what):
    """An NDArray of ``a``'s own dtype (``split_and_load`` would make numpy arrays and lists float32)."""
    if isinstance(a, mx.nd.NDArray):
        return a
    values = np.asarray(a)
    if values.dtype.kind in "iub" and values.dtype.type not in _MXNET_DTYPES:
        # MXNet has int8, uint8, int32 and int64; int16, uint16 and uint32 fit int64 exactly.
        if values.dtype == np.uint64 and values.size and values.max() > np.iinfo(np.int64).max:
            raise ValueError(f"cast_batch(): the {what} holds uint64 values beyond int64, which MXNet cannot hold")
        values = values.astype(np.int64)
    elif values.dtype.kind not in "iubf":
        raise ValueError(f"cast_batch(): the {what} is {values.dtype} ({type(a).__name__}); pass numbers: an "
                         "NDArray, a numpy array or a list of numbers")
    make = mx.np.array if mx.util.is_np_array() else mx.nd.array  # what split_and_load would make, dtype kept
    return make(values, dtype=values.dtype)


#: The numpy scalar types MXNet 1.9.1's NDArray holds.
_MXNET_DTYPES = (np.float16, np.float32, np.float64, np.uint8, np.int8, np.int32, np.int64, np.bool_)


def _target(x, dtype):
    """The dtype ``x`` is cast to, or ``None`` when it keeps its own (integers, and what is already there)."""
    source = np.dtype(x.dtype)
    return dtype if np.issubdtype(source, np.floating) and source != np.dtype(dtype) else None


def _check_cast(x, target, name, fix):
    """Refuse a cast of ``x`` to ``target`` that would change whole numbers or overflow (see :func:`cast_batch`)."""
    fmt, source = FORMATS.get(np.dtype(target).name), FORMATS.get(np.dtype(x.dtype).name)
    if fmt is None or (source is not None and source.mantissa_bits <= fmt.mantissa_bits and source.max <= fmt.max):
        return  # a widening cast changes nothing
    flat = x.reshape((-1,))
    sample = flat[::max(1, -(-flat.shape[0] // SAMPLE))].asnumpy().astype(np.float64)
    whole = _whole(sample)
    if not whole and not np.any(np.abs(sample[np.isfinite(sample)]) > fmt.max):
        return  # real-valued data within the range: its rounding is what the precision means
    values = flat.asnumpy().astype(np.float64) if whole else sample
    values = values[np.isfinite(values)]
    cast = values.astype(target).astype(np.float64)
    # Whole numbers are ids or counts: any change is a wrong value. Real values only lose what overflows.
    changed = values[cast != values] if whole and _whole(values) else values[np.isinf(cast)]
    if changed.size:
        shown = np.unique(changed)[:3]
        examples = ", ".join(f"{format_scale(v)} -> {format_scale(float(np.asarray(v).astype(target)))}" for v in shown)
        exact = 2.0 ** (fmt.mantissa_bits + 1)  # every integer up to here has a representation
        raise ValueError(f"cast_batch(): the cast to {fmt.name} would change values of {name}: {examples} "
                         f"({fmt.name} holds every integer only up to {format_scale(exact)}, and nothing beyond "
                         f"{format_scale(fmt.max)}). {fix}")


def _whole(values):
    return bool(values.size) and bool(np.all(np.isfinite(values) & (values == np.round(values))))


def to_float32(output):
    """Cast network output to float32 for the loss (a no-op when it already is).

    Softmax cross-entropy on float16 logits loses the small probabilities that carry the gradient.
    """
    if isinstance(output, (list, tuple)):
        return type(output)(to_float32(o) for o in output)
    if output is None:  # a head the network did not compute (d2l's BERT without masked positions)
        return None
    return output if output.dtype == np.float32 else output.astype("float32")
