"""Networks built from elementwise operators, and a small convnet: the float16 recipe's test networks.

:class:`ElementwiseDense` is a dense layer written with ``broadcast_mul`` and
``sum``: MXNet has no float16 GEMM on CPU but has float16 elementwise and
reduction kernels, so mxfp16's tests and notebooks train it in genuine
float16 without a GPU.
"""
from mxnet import gluon, init

__all__ = ["ElementwiseDense", "elementwise_mlp", "small_convnet"]


class ElementwiseDense(gluon.HybridBlock):
    """``y = x W^T + b`` from elementwise ops, so it runs in float16 on CPU.

    Parameters
    ----------
    units : int
    in_units : int
        Needed up front: there is no deferred shape inference.
    activation : str, optional
        An ``Activation`` name applied to the output.
    """

    def __init__(self, units, in_units, activation=None, **kwargs):
        super().__init__(**kwargs)
        self._activation = activation
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(units, in_units), init=init.Xavier())
            self.bias = self.params.get("bias", shape=(units,), init=init.Zero())

    def hybrid_forward(self, F, x, weight, bias):
        # (N, 1, in) * (1, units, in) -> sum over in -> (N, units)
        y = F.sum(F.broadcast_mul(F.expand_dims(x, axis=1), F.expand_dims(weight, axis=0)), axis=2)
        y = F.broadcast_add(y, F.expand_dims(bias, axis=0))
        return F.Activation(y, act_type=self._activation) if self._activation else y


def elementwise_mlp(in_units, hidden, classes, batchnorm=True, prefix=None):
    """A small MLP of :class:`ElementwiseDense` layers (with BatchNorm, to show it stays float32).

    Parameters
    ----------
    in_units : int
    hidden : sequence of int
        Width of each hidden layer.
    classes : int
    batchnorm : bool

    Returns
    -------
    gluon.nn.HybridSequential
    """
    net = gluon.nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        width = in_units
        for units in hidden:
            net.add(ElementwiseDense(units, width))
            if batchnorm:
                net.add(gluon.nn.BatchNorm(in_channels=units))
            net.add(gluon.nn.Activation("relu"))
            width = units
        net.add(ElementwiseDense(classes, width))
    return net


def small_convnet(classes, width=16, prefix="smallconvnet_"):
    """Two convolutions with BatchNorm, global pooling and a dense layer: a few steps train in seconds on a CPU.

    The fixed prefix gives the same parameter names in every process.

    Parameters
    ----------
    classes : int
    width : int
        Channels of the first convolution; the second has twice as many.

    Returns
    -------
    gluon.nn.HybridSequential
        Not initialised.
    """
    net = gluon.nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        net.add(gluon.nn.Conv2D(width, 3, padding=1, use_bias=False),
                gluon.nn.BatchNorm(),
                gluon.nn.Activation("relu"),
                gluon.nn.Conv2D(2 * width, 3, strides=2, padding=1, use_bias=False),
                gluon.nn.BatchNorm(),
                gluon.nn.Activation("relu"),
                gluon.nn.GlobalAvgPool2D(),
                gluon.nn.Dense(classes))
    return net
