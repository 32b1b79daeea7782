"""Networks for mixed-precision work.

:class:`LSTMClassifier` and :class:`TransformerEncoderClassifier` are the
reference sequence models: they read an image as a sequence of rows (one
time step, or one token, per row; the classic "sequential MNIST" task), so
they train with the same data pipeline, trainer, benchmark and export as the
CNNs (``--model lstm-classifier`` / ``--model transformer-encoder``), and on
scikit-learn's handwritten digits (``mxfp16 data digits``) with nothing to
download.

:class:`ElementwiseDense` is a dense layer written with ``broadcast_mul`` and
``sum`` instead of ``FullyConnected``. MXNet has no float16 GEMM on CPU, but
it has float16 elementwise and reduction kernels, so a network made of these
layers trains in genuine float16 on any machine: it is how mxfp16's tests and
notebooks exercise the float16 recipe without a GPU.
"""
from mxnet import gluon, init

from ._gluoncv import import_gluoncv

__all__ = ["ElementwiseDense", "elementwise_mlp", "small_convnet", "LSTMClassifier",
           "TransformerEncoderClassifier", "SelfAttention", "EncoderBlock", "SEQUENCE_MODELS"]


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
# Sequence models: an image read as a sequence of rows.
# --------------------------------------------------------------------------
def _rows(F, x):
    """``(N, C, H, W)`` images as ``(N, H, C*W)`` sequences: row ``h`` is time step ``h``."""
    return F.reshape(F.transpose(x, axes=(0, 2, 1, 3)), shape=(0, 0, -1))


class LSTMClassifier(gluon.HybridBlock):
    """An LSTM over the rows of an image, mean-pooled over time, then a Dense classifier.

    Under AMP on a CPU the LSTM (MXNet's fused ``RNN`` operator, float32 only
    on CPU) stays float32 and the Dense layers run in bfloat16; see
    ``docs/amp-table.md``.

    Parameters
    ----------
    classes : int
    hidden : int
        LSTM units per direction.
    num_layers : int
    bidirectional : bool
    dropout : float
        Between LSTM layers, and before the classifier.
    """

    def __init__(self, classes, hidden=128, num_layers=1, bidirectional=False, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = gluon.nn.Dense(hidden, flatten=False, activation="relu")
            self.rnn = gluon.rnn.LSTM(hidden, num_layers=num_layers, layout="NTC", dropout=dropout,
                                      bidirectional=bidirectional)
            self.drop = gluon.nn.Dropout(dropout)
            self.output = gluon.nn.Dense(classes)

    def hybrid_forward(self, F, x):
        seq = self.rnn(self.embed(_rows(F, x)))
        return self.output(self.drop(F.mean(seq, axis=1)))


class SelfAttention(gluon.HybridBlock):
    """Multi-head self-attention from Dense, ``batch_dot`` and softmax (as GluonNLP's BERT does it).

    The scores ``q k^T / sqrt(d)`` and the softmax run in float32 under
    mxfp16's AMP (``batch_dot`` has no bfloat16 CPU kernel; softmax is kept
    float32 for its exponent's range); the projections run in bfloat16.
    """

    def __init__(self, units, heads, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        if units % heads:
            raise ValueError(f"units={units} is not a multiple of heads={heads}")
        self._heads, self._scale = heads, 1.0 / (units // heads) ** 0.5
        with self.name_scope():
            self.query = gluon.nn.Dense(units, flatten=False)
            self.key = gluon.nn.Dense(units, flatten=False)
            self.value = gluon.nn.Dense(units, flatten=False)
            self.proj = gluon.nn.Dense(units, flatten=False)
            self.drop = gluon.nn.Dropout(dropout)

    def _split(self, F, x):
        # (N, T, U) -> (N, T, h, U/h) -> (N, h, T, U/h) -> (N*h, T, U/h)
        x = F.transpose(F.reshape(x, shape=(0, 0, self._heads, -1)), axes=(0, 2, 1, 3))
        return F.reshape(x, shape=(-1, 0, 0), reverse=True)

    def hybrid_forward(self, F, x):
        q, k, v = (self._split(F, layer(x)) for layer in (self.query, self.key, self.value))
        scores = F.batch_dot(q, k, transpose_b=True) * self._scale
        context = F.batch_dot(self.drop(F.softmax(scores, axis=-1)), v)
        # (N*h, T, U/h) -> (N, h, T, U/h) -> (N, T, h, U/h) -> (N, T, U)
        context = F.transpose(F.reshape(context, shape=(-1, self._heads, 0, 0), reverse=True), axes=(0, 2, 1, 3))
        return self.proj(F.reshape(context, shape=(0, 0, -1)))


class EncoderBlock(gluon.HybridBlock):
    """A BERT-style encoder block: attention and a GELU feed-forward, each residual and post-LayerNorm."""

    def __init__(self, units, heads, ffn_units, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.attention = SelfAttention(units, heads, dropout)
            self.norm1 = gluon.nn.LayerNorm()
            self.ffn1 = gluon.nn.Dense(ffn_units, flatten=False)
            self.gelu = gluon.nn.GELU()
            self.ffn2 = gluon.nn.Dense(units, flatten=False)
            self.drop = gluon.nn.Dropout(dropout)
            self.norm2 = gluon.nn.LayerNorm()

    def hybrid_forward(self, F, x):
        x = self.norm1(x + self.drop(self.attention(x)))
        return self.norm2(x + self.drop(self.ffn2(self.gelu(self.ffn1(x)))))


class TransformerEncoderClassifier(gluon.HybridBlock):
    """A small Transformer encoder over the rows of an image: one token per row, mean-pooled.

    Parameters
    ----------
    classes : int
    seq_len : int
        Tokens per input (image rows); sizes the learned position embedding.
    units, heads, ffn_units, num_layers : int
        Width, attention heads, feed-forward width and number of :class:`EncoderBlock`.
    dropout : float
    """

    def __init__(self, classes, seq_len, units=64, heads=4, ffn_units=128, num_layers=2, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = gluon.nn.Dense(units, flatten=False)
            self.position = self.params.get("position", shape=(1, seq_len, units), init=init.Normal(0.02))
            self.blocks = gluon.nn.HybridSequential()
            for _ in range(num_layers):
                self.blocks.add(EncoderBlock(units, heads, ffn_units, dropout))
            self.output = gluon.nn.Dense(classes)

    def hybrid_forward(self, F, x, position):
        tokens = F.broadcast_add(self.embed(_rows(F, x)), position)
        return self.output(F.mean(self.blocks(tokens), axis=1))


# --------------------------------------------------------------------------
# The trainer's model factory (appended for the reference trainer).
# --------------------------------------------------------------------------
#: A test model that trains in genuine float16 on a CPU (see ElementwiseDense).
ELEMENTWISE_MLP = "elementwise-mlp"
#: The reference sequence models, by ``--model`` name.
LSTM_CLASSIFIER = "lstm-classifier"
TRANSFORMER_ENCODER = "transformer-encoder"
SEQUENCE_MODELS = (LSTM_CLASSIFIER, TRANSFORMER_ENCODER)


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
                         "resnet50_v2, resnet50_v1d or cifar_resnet20_v1, a sequence model "
                         f"({', '.join(SEQUENCE_MODELS)}), or {ELEMENTWISE_MLP!r}; "
                         "gluoncv.model_zoo.get_model_list() lists them all") from None


def build_model(name, classes, pretrained=False, ctx=None, in_shape=None, root=None):
    """Build and initialise a classification network.

    Parameters
    ----------
    name : str
        A gluoncv model-zoo name (``'resnet50_v2'``, ``'resnet50_v1d'``,
        ``'cifar_resnet20_v1'`` ...), a sequence model (``'lstm-classifier'``,
        ``'transformer-encoder'``: an image read row by row) or
        ``'elementwise-mlp'``.
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

    if name in SEQUENCE_MODELS:
        if pretrained:
            raise ModelError(f"{name!r} has no pretrained weights; drop --pretrained")
        if not in_shape:
            raise ModelError(f"{name!r} needs in_shape=(channels, height, width)")
        prefix = name.replace("-", "") + "_"
        if name == LSTM_CLASSIFIER:
            net = LSTMClassifier(classes, prefix=prefix)
        else:
            net = TransformerEncoderClassifier(classes, seq_len=int(in_shape[1]), prefix=prefix)
        net.initialize(init.Xavier(), ctx=ctx)
        return _materialise(net, in_shape, ctx)

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
