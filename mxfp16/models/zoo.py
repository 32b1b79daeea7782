"""Networks by name: the GluonCV model zoo, the sequence models and the elementwise MLP, built and initialised.

Importing this module does not import MXNet (the names and
:class:`ModelError` are read by commands before MXNet loads).
"""
import difflib
import math
import os
from pathlib import Path

from .gluoncv import import_gluoncv

__all__ = ["build_model", "pretrained_weights_path", "ModelError", "ELEMENTWISE_MLP", "LSTM_CLASSIFIER",
           "TRANSFORMER_ENCODER", "SEQUENCE_MODELS", "MXNET_ZOO_TWINS"]

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


#: Zoo names MXNet's own model zoo builds exactly as gluoncv 0.10.5 does (layers, parameter names and shapes):
#: built from MXNet's code where gluoncv is not installed (``tools/measure.py`` on a machine without network).
#: MobileNet v2 is not one: MXNet's has another first bottleneck.
MXNET_ZOO_TWINS = ("resnet50_v2",)


def _zoo_model(name, classes):
    try:
        zoo = import_gluoncv().model_zoo
    except ImportError:
        if name in MXNET_ZOO_TWINS:
            from mxnet.gluon.model_zoo import vision

            return vision.get_model(name, classes=classes)
        raise ModelError(f"{name!r} comes from gluoncv's model zoo, which is not installed here: pip install -c "
                         f"constraints.txt gluoncv==0.10.5.post0; without it {', '.join(MXNET_ZOO_TWINS)} is "
                         f"built from MXNet's own zoo, and {', '.join(SEQUENCE_MODELS)} from mxfp16's code") from None
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
        A gluoncv model-zoo name (``'resnet50_v2'`` ...), one of
        :data:`SEQUENCE_MODELS` (an image read row by row) or ``'elementwise-mlp'``.
    classes : int
    pretrained : bool
        Start the feature layers from gluoncv's ImageNet weights, already on
        this machine (:func:`pretrained_weights_path`); the output layer is new.
    ctx : mx.Context or list of mx.Context, optional
    in_shape : tuple of int, optional
        ``(channels, height, width)`` of one image (optional for a zoo model);
        a forward pass of zeros gives every parameter its shape before a trainer or checkpoint needs it.
    root : str, optional
        gluoncv's model folder (default ``$MXNET_HOME/models`` or ``~/.mxnet/models``).

    Returns
    -------
    gluon.HybridBlock
        Initialised, not hybridized, float32.

    Raises
    ------
    ModelError
        Unknown name, or ``pretrained`` weights missing locally.
    """
    import mxnet as mx
    from mxnet import gluon, init

    from .sequence import LSTMClassifier, TransformerEncoderClassifier
    from .small import elementwise_mlp

    if name == ELEMENTWISE_MLP or name in SEQUENCE_MODELS:
        if pretrained:
            raise ModelError(f"{name!r} has no pretrained weights; drop --pretrained")
        if not in_shape:
            raise ModelError(f"{name!r} needs in_shape=(channels, height, width)")

    if name == ELEMENTWISE_MLP:
        net = gluon.nn.HybridSequential(prefix="elementwisemlp_")
        with net.name_scope():
            net.add(gluon.nn.Flatten())
            net.add(elementwise_mlp(math.prod(int(n) for n in in_shape), (64,), classes, prefix="mlp_"))
        net.initialize(init.Xavier(), ctx=ctx)
        return net

    if name in SEQUENCE_MODELS:
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
