"""The training loss: softmax cross-entropy on float32 outputs, with optional label smoothing.

:func:`mxfp16.train.parts.build_parts` makes it; call it with float32
outputs (:func:`mxfp16.to_float32`) and float32 labels, whatever the precision.
"""
from mxnet import gluon

__all__ = ["classification_loss"]


class _SmoothedCrossEntropy(gluon.loss.Loss):
    """Softmax cross-entropy against label-smoothed one-hot targets (integer labels in)."""

    def __init__(self, classes, label_smoothing, **kwargs):
        super().__init__(weight=None, batch_axis=0, **kwargs)
        self._classes = classes
        self._smoothing = label_smoothing
        self._loss = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)

    def hybrid_forward(self, F, output, label):
        target = F.one_hot(label, self._classes) * (1 - self._smoothing) + self._smoothing / self._classes
        return self._loss(output, target)


def classification_loss(classes, label_smoothing=0.0):
    """Softmax cross-entropy over ``classes``, with optional label smoothing.

    Parameters
    ----------
    classes : int
    label_smoothing : float
        0 gives Gluon's ``SoftmaxCrossEntropyLoss`` on integer labels.

    Returns
    -------
    gluon.loss.Loss
        Call it with float32 outputs (:func:`mxfp16.to_float32`) and float32 labels.
    """
    if not 0 <= label_smoothing < 1:
        raise ValueError(f"label_smoothing={label_smoothing}: must be in [0, 1)")
    if label_smoothing == 0:
        return gluon.loss.SoftmaxCrossEntropyLoss()
    return _SmoothedCrossEntropy(classes, label_smoothing)
