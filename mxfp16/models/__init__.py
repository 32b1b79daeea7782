"""Networks for mixed-precision work, by name or by class.

:func:`build_model` (:mod:`~mxfp16.models.zoo`) builds one by ``--model`` name;
:mod:`~mxfp16.models.sequence` and :mod:`~mxfp16.models.small` hold mxfp16's
own, and :mod:`~mxfp16.models.gluoncv` imports GluonCV beside PyTorch 2. The
names below load their module on first use.
"""
from .._lazy import exports

_EXPORTS = {
    "build_model": "zoo", "pretrained_weights_path": "zoo", "ModelError": "zoo", "ELEMENTWISE_MLP": "zoo",
    "LSTM_CLASSIFIER": "zoo", "TRANSFORMER_ENCODER": "zoo", "SEQUENCE_MODELS": "zoo",
    "ElementwiseDense": "small", "elementwise_mlp": "small", "small_convnet": "small",
    "LSTMClassifier": "sequence", "TransformerEncoderClassifier": "sequence", "SelfAttention": "sequence",
    "EncoderBlock": "sequence", "import_gluoncv": "gluoncv",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = exports(__name__, _EXPORTS, mxnet_free=("zoo", "gluoncv"))
