"""The training loss: softmax cross-entropy on float32 outputs, with optional label smoothing.

:func:`mxfp16.train.parts.build_parts` makes it, whatever the precision.
"""
import mxnet as mx
from mxnet import gluon

from ._internals import sparse_label_axis

__all__ = ["classification_loss", "class_label_axis", "check_class_labels"]


class _SmoothedCrossEntropy(gluon.loss.Loss):
    """Softmax cross-entropy against label-smoothed one-hot targets (integer labels in)."""

    #: The output axis its labels name a class of (see :func:`class_label_axis`).
    class_axis = -1

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


def class_label_axis(loss_fn):
    """The output axis whose classes ``loss_fn``'s labels index, or ``None`` when its labels are not class indices.

    Gluon's ``SoftmaxCrossEntropyLoss`` (``sparse_label=True``, its default)
    and :func:`classification_loss`'s losses take class indices.
    """
    if isinstance(loss_fn, _SmoothedCrossEntropy):
        return loss_fn.class_axis
    return sparse_label_axis(loss_fn)


def check_class_labels(loss_fn, outputs, labels):
    """Refuse class labels outside ``[0, width)`` of the output axis ``loss_fn`` picks from.

    MXNet's ``pick`` (and ``one_hot``) clip an index past the last class (or
    give an all-zero target): a wrong target without an error. Reads the
    labels' extremes on the host, once per network and loss (:func:`mxfp16.train_step`).

    Parameters
    ----------
    loss_fn : callable
        Nothing is checked unless :func:`class_label_axis` knows its axis.
    outputs : list
        One float32 output per device (a tuple, for several outputs, is not judged).
    labels : list
        The class labels, one array per device.
    """
    axis = class_label_axis(loss_fn)
    if axis is None or not all(isinstance(out, mx.nd.NDArray) for out in outputs):
        return
    width = outputs[0].shape[axis]
    ends = [e.as_nd_ndarray() if isinstance(e, mx.np.ndarray) else e for y in labels for e in (y.min(), y.max())]
    values = mx.nd.concat(*[e.astype("float64").reshape((1,)).as_in_context(ends[0].ctx) for e in ends],
                          dim=0).asnumpy()
    low, high = float(values.min()), float(values.max())
    bad = high if high > width - 1 else low if low < 0 else None
    if bad is not None:
        raise ValueError(
            f"label {bad:g} has no class in the network's output: {type(loss_fn).__name__} reads labels as class "
            f"numbers 0 to {width - 1} (the {width} values on axis {axis} of the output), and would train on a wrong "
            f"target without an error (MXNet's pick clips {bad:g} to class {width - 1 if bad > 0 else 0}). Check "
            "the dataset's labels (classes numbered from 0), or give the network's last layer one output per class")
