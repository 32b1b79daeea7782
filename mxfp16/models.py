"""Networks for mixed-precision work.

:class:`ElementwiseDense` is a dense layer written with ``broadcast_mul`` and
``sum`` instead of ``FullyConnected``. MXNet has no float16 GEMM on CPU, but
it has float16 elementwise and reduction kernels, so a network made of these
layers trains in genuine float16 on any machine: it is how mxfp16's tests and
notebooks exercise the float16 recipe without a GPU.
"""
from mxnet import gluon, init

from ._gluoncv import import_gluoncv

__all__ = ["ElementwiseDense", "elementwise_mlp", "small_convnet"]


class ElementwiseDense(gluon.HybridBlock):
    """``y = x W^T + b`` from elementwise ops, so it runs in float16 on CPU.

    Parameters
    ----------
    units : int
        Output features.
    in_units : int
        Input features (needed up front: there is no deferred shape inference).
    activation : str, optional
        An ``Activation`` name applied to the output (``'relu'``, ``'tanh'`` ...).
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
        Put a BatchNorm after each hidden layer.

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


# --------------------------------------------------------------------------
# The trainer's model factory (appended for the reference trainer).
# --------------------------------------------------------------------------
#: A test model that trains in genuine float16 on a CPU (see ElementwiseDense).
ELEMENTWISE_MLP = "elementwise-mlp"


class ModelError(ValueError):
    """An unknown model name, or pretrained weights that are not on this machine."""


def pretrained_weights_path(name, root=None):
    """Where gluoncv keeps ``name``'s pretrained weights, and whether they are there.

    Returns
    -------
    (pathlib.Path, bool)
        The file gluoncv would load and whether it exists. Nothing is downloaded.
    """
    import os
    from pathlib import Path

    model_store = import_gluoncv().model_zoo.model_store

    if root is None:
        home = os.environ.get("MXNET_HOME")
        root = os.path.join(home, "models") if home else os.path.join("~", ".mxnet", "models")
    try:
        short = model_store.short_hash(name)
    except ValueError:
        raise ModelError(f"gluoncv publishes no pretrained weights for {name!r}; drop --pretrained "
                         "to train it from scratch") from None
    path = Path(os.path.expanduser(root)) / f"{name}-{short}.params"
    return path, path.exists()


def _zoo_model(name, classes):
    import difflib

    zoo = import_gluoncv().model_zoo
    try:
        return zoo.get_model(name, classes=classes)
    except ValueError as err:
        if "is not among" not in str(err):
            raise
        close = difflib.get_close_matches(name.lower(), zoo.get_model_list(), n=4)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ModelError(f"unknown model {name!r}{hint}; use a gluoncv classification model such as "
                         "resnet50_v2, resnet50_v1d or cifar_resnet20_v1, or "
                         f"{ELEMENTWISE_MLP!r}; gluoncv.model_zoo.get_model_list() lists them all") from None


def build_model(name, classes, pretrained=False, ctx=None, in_shape=None, root=None):
    """Build and initialise a classification network.

    Parameters
    ----------
    name : str
        A gluoncv model-zoo name (``'resnet50_v2'``, ``'resnet50_v1d'``,
        ``'cifar_resnet20_v1'`` ...) or ``'elementwise-mlp'``.
    classes : int
    pretrained : bool
        Start the feature layers from gluoncv's ImageNet weights, which must
        already be on this machine (see :func:`pretrained_weights_path`); the
        output layer is new. Nothing is downloaded.
    ctx : mx.Context or list of mx.Context, optional
        Where the parameters live (default: the current context).
    in_shape : tuple of int, optional
        ``(channels, height, width)`` of one image; needed by ``'elementwise-mlp'``,
        which has no deferred shape inference. For zoo models it finishes
        Gluon's deferred initialisation at once (one forward pass of zeros in
        inference mode), so every parameter has its shape before a trainer,
        a kvstore or a checkpoint needs it.
    root : str, optional
        gluoncv's model folder (default ``$MXNET_HOME/models`` or ``~/.mxnet/models``).

    Returns
    -------
    gluon.HybridBlock
        Initialised (MSRA/He for the zoo, Xavier for the MLP), not hybridized,
        float32.

    Raises
    ------
    ModelError
        Unknown name, or ``pretrained`` weights missing locally.
    """
    import mxnet as mx

    if name == ELEMENTWISE_MLP:
        if pretrained:
            raise ModelError(f"{ELEMENTWISE_MLP!r} has no pretrained weights; drop --pretrained")
        if not in_shape:
            raise ModelError(f"{ELEMENTWISE_MLP!r} needs in_shape=(channels, height, width)")
        units = 1
        for n in in_shape:
            units *= int(n)
        net = gluon.nn.HybridSequential(prefix="elementwisemlp_")
        with net.name_scope():
            net.add(gluon.nn.Flatten())
            net.add(elementwise_mlp(units, (64,), classes, prefix="mlp_"))
        net.initialize(init.Xavier(), ctx=ctx)
        return net

    net = _zoo_model(name, classes)
    if not pretrained:
        net.initialize(init.MSRAPrelu(), ctx=ctx)
        return _materialise(net, in_shape, ctx)
    path, present = pretrained_weights_path(name, root)
    if not present:
        raise ModelError(f"pretrained weights for {name!r} are not on this machine (looked for {path}); "
                         "mxfp16 downloads nothing behind your back. Copy the file there (on a machine "
                         f"with internet: gluoncv.model_zoo.get_model({name!r}, pretrained=True)), set "
                         "MXNET_HOME, or drop --pretrained")
    source = import_gluoncv().model_zoo.get_model(name, pretrained=True, root=str(path.parent))
    if not hasattr(net, "features") or not hasattr(net, "output"):
        raise ModelError(f"{name!r} has no features/output split to fine-tune; drop --pretrained")
    net.features = source.features
    net.output.initialize(init.Xavier(), ctx=ctx)
    net.collect_params().reset_ctx(ctx or mx.current_context())
    return _materialise(net, in_shape, ctx)


def _materialise(net, in_shape, ctx):
    import mxnet as mx

    if in_shape:
        first = (ctx[0] if isinstance(ctx, (list, tuple)) else ctx) or mx.current_context()
        net(mx.nd.zeros((1,) + tuple(in_shape), ctx=first))
    return net


# --------------------------------------------------------------------------
# A small convolutional network (for `mxfp16 selftest`).
# --------------------------------------------------------------------------
def small_convnet(classes, width=16, prefix="smallconvnet_"):
    """Two convolutions with BatchNorm, global pooling and a dense layer.

    Small enough to train a few steps in seconds on a CPU, and made of the
    layers the float16 recipe treats specially: ``Conv2D`` and ``Dense``
    (cuDNN / cuBLAS in float16 on a GPU, oneDNN bfloat16 under AMP on a CPU)
    and ``BatchNorm`` (whose parameters stay float32). The fixed prefix gives
    the same parameter names in every process.

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
