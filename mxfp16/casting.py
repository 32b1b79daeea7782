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


def cast_net(net, dtype):
    """Cast ``net`` in place to ``dtype`` and return it.

    BatchNorm layers (and their subclasses) keep float32 parameters; see the
    module docstring for why the other normalisation layers cannot.

    Parameters
    ----------
    net : gluon.Block
    dtype : str or numpy dtype
        ``'float16'`` or ``'float32'``. bfloat16 is not a Gluon parameter
        dtype in MXNet 1.9.1: use the ``amp-bfloat16`` precision instead.

    Returns
    -------
    gluon.Block
        The same ``net`` (``Block.cast`` itself returns ``None``).
    """
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
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
    """Split a batch across devices and cast the data (not the labels).

    Labels stay float32: float16 represents integers exactly only up to 2048,
    so class 2049 would silently become 2048.

    Parameters
    ----------
    data, label : NDArray
        The batch, float32, batch axis 0.
    dtype : str
        The dtype for the data (``Precision.data_dtype``).
    ctx_list : list of mx.Context

    Returns
    -------
    (list of NDArray, list of NDArray)
        Data slices in ``dtype`` and float32 label slices, one per device.
    """
    datas = gluon.utils.split_and_load(data, ctx_list, batch_axis=0, even_split=False)
    labels = gluon.utils.split_and_load(label, ctx_list, batch_axis=0, even_split=False)
    # Cast after the copy: on a GPU the cast is cheap and the host stays free.
    datas = [x if x.dtype == np.dtype(dtype) else x.astype(dtype, copy=False) for x in datas]
    labels = [y if y.dtype == np.float32 else y.astype("float32", copy=False) for y in labels]
    return datas, labels


def to_float32(output):
    """Cast network output to float32 for the loss (a no-op when it already is).

    Softmax cross-entropy on float16 logits loses the small probabilities that
    carry the gradient; the loss must see float32.
    """
    if isinstance(output, (list, tuple)):
        return type(output)(to_float32(o) for o in output)
    return output if output.dtype == np.float32 else output.astype("float32")
