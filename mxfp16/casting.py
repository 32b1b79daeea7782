"""Casting a Gluon network and its batches for mixed precision.

The tutorial's recipe: cast the network's parameters to float16, cast each
batch to float16, and compute the loss from float32 logits. Normalisation is
the exception: MXNet's BatchNorm operator takes float16 data with float32
gamma, beta and running statistics, and Gluon's ``BatchNorm.cast`` keeps them
float32. LayerNorm, InstanceNorm and GroupNorm have no such mixed-dtype
kernel in MXNet 1.9.1 (their operators require one dtype), so their
parameters follow the network.
"""
from collections import OrderedDict

import numpy as np

from ._lazy import module

mx = module("mxnet")
gluon = module("mxnet.gluon")


def cast_net(net, precision):
    """Cast ``net`` in place for ``precision`` and return it.

    BatchNorm layers (and their subclasses) keep float32 parameters; see the
    module docstring for why the other normalisation layers cannot.

    Parameters
    ----------
    net : gluon.Block
    precision : Precision or str
        A resolved :class:`~mxfp16.Precision` (its ``param_dtype``; for an
        AMP precision this also checks that :func:`mxfp16.activate` came
        first, :func:`mxfp16.precision.check_activated`), or a dtype name,
        ``'float16'`` or ``'float32'``: an AMP precision's ``param_dtype`` is
        checked as the precision itself would be. bfloat16 is not a Gluon
        parameter dtype in MXNet 1.9.1: use the ``amp-bfloat16`` precision
        instead.

    Returns
    -------
    gluon.Block
        The same ``net`` (``Block.cast`` itself returns ``None``).

    Raises
    ------
    AMPStateError
        An AMP precision whose ``activate`` is missing or came after the
        network's graph was built.
    """
    from .precision import Precision, check_activated, precision_of

    if isinstance(precision, Precision):
        precision = precision.param_dtype
    check_activated(precision_of(precision), net)
    name = np.dtype(precision).name if not isinstance(precision, str) else str(precision)
    if name == "bfloat16":
        raise TypeError("Gluon 1.9.1 cannot cast parameters to bfloat16; use precision "
                        "'amp-bfloat16', which keeps float32 parameters and lets AMP cast operators")
    net.cast(name)
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


def cast_batch(data, label, dtype, ctx_list):
    """Split a batch across devices and cast its floating-point data to ``dtype``.

    Only floating-point data is cast. Integer arrays (token ids, lengths,
    masks) keep their dtype: float16 represents integers exactly only up to
    2048, so token 2049 would silently become 2048. Labels are never cast to
    ``dtype``: integer labels keep their dtype, floating labels become (or
    stay) float32, for the same reason.

    Parameters
    ----------
    data : NDArray, or tuple or list of NDArray
        The batch, batch axis 0; several arrays for a network with several
        inputs (``net(*inputs)``), all with the same batch size.
    label : NDArray, tuple or list of NDArray, or None
        The labels (several for a loss with several, ``loss_fn(out, *labels)``),
        or ``None`` for a network that computes its own loss from its inputs.
    dtype : str
        The dtype for floating-point data (``Precision.data_dtype``).
    ctx_list : list of mx.Context

    Returns
    -------
    (list, list or None)
        One entry per device: an array, or a tuple of arrays where a tuple
        or list was given; ``None`` for the labels when ``label`` is None.

    Raises
    ------
    ValueError
        An empty batch or tuple, or arrays whose batch sizes differ.
    """
    ctx_list = [ctx_list] if isinstance(ctx_list, mx.Context) else list(ctx_list)
    if not ctx_list:
        raise ValueError("cast_batch() got no devices: pass a list of contexts such as [mx.cpu()]")
    datas = _split(data, "data", ctx_list, lambda x: _cast_floating(x, dtype))
    labels = None if label is None else _split(label, "label", ctx_list, _keep_label)
    return datas, labels


def _split(batch, what, ctx_list, cast):
    """``batch`` (an array or a tuple of arrays) as one entry per device, each array passed through ``cast``."""
    several = isinstance(batch, (tuple, list))
    arrays = list(batch) if several else [batch]
    if not arrays:
        raise ValueError(f"cast_batch() got an empty {type(batch).__name__} as {what}: pass the batch's array(s)")
    sizes = {a.shape[0] if a.ndim else 0 for a in arrays}
    if len(sizes) > 1:
        raise ValueError(f"cast_batch(): the {what} arrays have different batch sizes {sorted(sizes)} on axis 0")
    if sizes == {0}:
        raise ValueError(f"cast_batch() got an empty batch ({what} has 0 samples on axis 0)")
    # Cast after the copy: on a GPU the cast is cheap and the host stays free.
    per_array = [[cast(x) for x in gluon.utils.split_and_load(a, ctx_list, batch_axis=0, even_split=False)]
                 for a in arrays]
    per_device = list(zip(*per_array))
    return [tuple(parts) if several else parts[0] for parts in per_device]


def _cast_floating(x, dtype):
    if not np.issubdtype(np.dtype(x.dtype), np.floating) or x.dtype == np.dtype(dtype):
        return x
    return x.astype(dtype, copy=False)


def _keep_label(y):
    if not np.issubdtype(np.dtype(y.dtype), np.floating) or y.dtype == np.float32:
        return y
    return y.astype("float32", copy=False)


def to_float32(output):
    """Cast network output to float32 for the loss (a no-op when it already is).

    Softmax cross-entropy on float16 logits loses the small probabilities that
    carry the gradient; the loss must see float32.
    """
    if isinstance(output, (list, tuple)):
        return type(output)(to_float32(o) for o in output)
    if output is None:  # a head the network did not compute (d2l's BERT without masked positions)
        return None
    return output if output.dtype == np.float32 else output.astype("float32")
