"""The training step shared by the trainer and the benchmark, and its evaluation twin.

One function serves every precision (a disabled loss scaler costs nothing).
:func:`train_step` is built from the loss scaler's public seams; a step it does
not cover is written from the same seams (docs/getting-started.md, "Your own step").
"""
import weakref
from dataclasses import dataclass

import mxnet as mx
import numpy as np
from mxnet import autograd

from .amp.lists import warn_if_numpy_mode
from .casting import to_float32
from .losses import check_class_labels, class_label_axis
from .precision import check_activated
from .scaler import LossScaler, check_loss

__all__ = ["BatchLoss", "StepResult", "train_step", "eval_step"]

# Networks whose graphs were already checked against AMP (check_activated): a graph built later is built
# under AMP, which cannot be switched off, so one look per network is enough.
_CHECKED_NETS = weakref.WeakSet()
# Network -> the losses whose labels _check_labels_once checked.
_LABELS_CHECKED = weakref.WeakKeyDictionary()


class BatchLoss:
    """A loss computed over the whole batch at once, every device's outputs together, for :func:`train_step`.

    ``train_step`` calls a plain ``loss_fn`` once per device. GluonCV's
    ``SSDMultiBoxLoss`` (and YOLO's, Faster R-CNN's) divides by the positive
    anchors of the whole batch, so it needs all devices at once, and
    ``batch_size=1`` (docs/porting-gluoncv.md, "A detection loss over all devices").

    Parameters
    ----------
    fn : callable
        ``fn(outputs, labels)``, with one float32 output and one label entry
        (as :func:`mxfp16.cast_batch` returned it) per device; it returns one
        entry per device: the per-sample losses, or a tuple of loss terms.
    """

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError(f"BatchLoss takes a function fn(outputs, labels), got {type(fn).__name__}")
        self.fn = fn

    def __call__(self, outputs, labels):
        return self.fn(outputs, labels)

    def __repr__(self):
        return f"BatchLoss({getattr(self.fn, '__name__', self.fn)!r})"


@dataclass(frozen=True)
class StepResult:
    """What one step did.

    Attributes
    ----------
    loss : mx.np.ndarray
        The weighted total loss averaged over the batch, float32, shape (1,), on the first device, not read.
    skipped : bool
        The update was skipped because a gradient overflowed.
    loss_scale : float
        The scale used for this step's backward pass.
    grad_norm : mx.np.ndarray or None
        Global L2 norm of the unscaled gradients before clipping (only when clipping), shape (1,), not read.
    outputs : tuple
        The network's float32 outputs, one per device, as the loss saw them.
    losses : tuple of mx.np.ndarray
        Each loss term averaged over the batch, unweighted, shape (1,).
    """

    loss: object
    skipped: bool
    loss_scale: float
    grad_norm: object = None
    outputs: tuple = ()
    losses: tuple = ()


def train_step(net, loss_fn, trainer, data, label=None, scaler=None, batch_size=None, clip_grad_norm=None,
               loss_weights=None, skip_unused_params=False):
    """Forward, float32 loss, scaled backward, reduce, check, clip and update.

    Parameters
    ----------
    net : gluon.Block
        Already cast (or under AMP) for the precision.
    loss_fn : callable, BatchLoss or None
        ``loss_fn(outputs, *labels)`` on each device's float32 outputs,
        returning per-sample losses (or a tuple of such arrays); a
        :class:`BatchLoss`; or ``None`` when the network returns its own loss(es).
    trainer : gluon.Trainer
        From :func:`mxfp16.make_trainer`; with an enabled scaler or clipping
        it must not update on the kvstore.
    data : list
        One entry per device, from :func:`mxfp16.cast_batch`: an array, or a
        tuple of arrays for a network with several inputs (``net(*inputs)``).
    label : list or None
        One entry per device: an array, or a tuple for a loss with several
        labels; ``None`` when ``loss_fn`` is ``None`` (the labels are among
        the network's inputs).
    scaler : LossScaler or None
        ``None`` (or a disabled scaler) is a plain step without scaling.
    batch_size : int or float, optional
        What the optimizer divides the summed losses by, as in
        ``trainer.step(batch_size)``; by default the slices' total length.
    clip_grad_norm : float, optional
        Clip the global norm of the gradient the optimizer applies (unscaled, batch-averaged) to this value.
    loss_weights : sequence of float, optional
        One weight per loss term; by default every weight is 1.
    skip_unused_params : bool
        Leave the parameters that received no gradient (an unused head)
        unchanged instead of raising :class:`~mxfp16.scaler.UnusedParameterError`.

    Returns
    -------
    StepResult

    Raises
    ------
    mxfp16.precision.AMPStateError
        The scaler's precision uses AMP but :func:`mxfp16.activate` was not
        called, or came after the network's graph was built.

    Notes
    -----
    Host synchronisations, each where the design needs one:

    * the overflow flag in :meth:`LossScaler.step`, with an enabled scaler only;
    * the labels' range on a network's first step with a class-index loss
      (:func:`check_class_labels`);
    * whatever a :class:`BatchLoss` reads itself (SSD's count of positive anchors).
    """
    datas, labels = _check_batch(data, label, loss_fn)
    scaler = LossScaler(enabled=False) if scaler is None else scaler
    _check_set_up(net, scaler)
    if batch_size is None:
        batch_size = sum(_first(x).shape[0] for x in datas)
    scale = scaler.scale
    with autograd.record():
        raw = [net(*x) if isinstance(x, tuple) else net(x) for x in datas]
        warn_if_numpy_mode(_first(raw[0]))
        outputs = [to_float32(out) for out in raw]
        if isinstance(loss_fn, BatchLoss):
            terms = _batch_loss_terms(loss_fn, outputs, label)
        else:
            _check_labels_once(net, loss_fn, outputs, labels)
            terms = [_loss_terms(loss_fn, out, y) for out, y in zip(outputs, labels)]
        weights = _check_weights(loss_weights, len(terms[0]))
        heads = [term if w == 1.0 else term * w for device in terms for w, term in zip(weights, device)]
        heads = scaler.scale_loss(heads)
    autograd.backward(heads)

    grad_norm = None
    if scaler.checks_overflow or clip_grad_norm is not None:
        grads = scaler.unscale(trainer, batch_size, skip_unused_params)
        if clip_grad_norm is not None:
            grad_norm = grads.clip_(clip_grad_norm)
    skipped = scaler.step(trainer, batch_size, skip_unused_params)
    scaler.update()
    means = [_batch_mean([device[i] for device in terms], batch_size) for i in range(len(weights))]
    total = means[0] * weights[0] if len(means) == 1 else sum(m * w for m, w in zip(means, weights))
    return StepResult(total, skipped, scale, grad_norm, tuple(outputs), tuple(means))


def eval_step(net, data):
    """The network's outputs for one batch, in inference mode, as float32: what a metric reads.

    Nothing is recorded for autograd (docs/getting-started.md, "Evaluation").

    Parameters
    ----------
    net : gluon.Block
    data : list
        As for :func:`train_step`.

    Returns
    -------
    list
        One float32 output per device, of the network's kind (``mx.np`` arrays in numpy mode).
    """
    datas = _check_data(data, "eval_step()")
    with autograd.pause(train_mode=False):
        return [to_float32(net(*x) if isinstance(x, tuple) else net(x)) for x in datas]


def _first(value):
    """The first array of an output or input that may be a tuple (with ``None`` for heads not computed)."""
    if isinstance(value, (tuple, list)):
        return next(_first(v) for v in value if v is not None)
    return value


def _check_data(data, caller):
    if not isinstance(data, list):  # a tuple is one device's inputs, not a list of devices
        raise TypeError(f"{caller} takes data as a list with one entry per device (from mxfp16.cast_batch), "
                        f"got {type(data).__name__}")
    if not data:
        raise ValueError(f"{caller} got an empty data list: pass one batch slice per device, as "
                         "mxfp16.cast_batch(x, y, precision.data_dtype, ctx) returns them")
    return list(data)


def _check_batch(data, label, loss_fn):
    """The per-device data and labels, checked against each other and the loss."""
    datas = _check_data(data, "train_step()")
    if label is None:
        if loss_fn is not None:
            raise ValueError("train_step() got no labels but a loss_fn: pass the labels (one per device, from "
                             "mxfp16.cast_batch), or loss_fn=None for a network that returns its own loss")
        return datas, [()] * len(datas)
    if not isinstance(label, list) or not label:
        raise ValueError("train_step() takes label as a non-empty list with one entry per device (from "
                         "mxfp16.cast_batch), or None when the network returns its own loss")
    if len(label) != len(datas):
        raise ValueError(f"train_step() got {len(datas)} data slice(s) but {len(label)} label slice(s): one each "
                         "per device")
    if loss_fn is None:
        raise ValueError("train_step() got labels but loss_fn=None: a network that returns its own loss takes "
                         "its labels among its inputs (pass them in data, and label=None)")
    return datas, [y if isinstance(y, tuple) else (y,) for y in label]


def _check_set_up(net, scaler):
    """Refuse an AMP precision that is not active for this network (see :func:`check_activated`), once per net."""
    precision = getattr(scaler, "precision", None)
    if precision is not None and precision.amp:  # the graph once per net; the host-side flag every step (cheap)
        check_activated(precision, None if net in _CHECKED_NETS else net)
        _CHECKED_NETS.add(net)


def _check_labels_once(net, loss_fn, outputs, labels):
    """:func:`check_class_labels` on the first step of ``net`` with ``loss_fn`` (its host read is not repeated)."""
    if loss_fn is None or class_label_axis(loss_fn) is None:
        return
    checked = _LABELS_CHECKED.setdefault(net, weakref.WeakSet())
    if loss_fn not in checked:
        check_class_labels(loss_fn, outputs, [y[0] for y in labels])
        checked.add(loss_fn)


def _batch_loss_terms(loss_fn, outputs, label):
    """A :class:`BatchLoss`'s per-device loss terms, float32, checked like a per-device loss's."""
    value = loss_fn(list(outputs), label)
    if not isinstance(value, (list, tuple)) or len(value) != len(outputs):
        got = f"{len(value)} entries" if isinstance(value, (list, tuple)) else type(value).__name__
        raise ValueError(f"{loss_fn!r} returned {got} for {len(outputs)} device(s): a BatchLoss returns one entry per "
                         "device (that device's per-sample losses, or a tuple of loss terms)")
    terms = []
    for entry in value:
        check_loss(entry, repr(loss_fn))
        terms.append(tuple(to_float32(t) for t in (entry if isinstance(entry, (list, tuple)) else (entry,))))
    if len({len(t) for t in terms}) > 1:
        raise ValueError(f"{loss_fn!r} returned a different number of loss terms per device: {[len(t) for t in terms]}")
    return terms


def _loss_terms(loss_fn, outputs, labels):
    """The float32 loss term(s) of one device: ``loss_fn(outputs, *labels)``, or the network's own loss."""
    value = outputs if loss_fn is None else loss_fn(outputs, *labels)
    check_loss(value, "the network (loss_fn=None)" if loss_fn is None else "loss_fn")
    terms = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    return tuple(to_float32(term) for term in terms)


def _check_weights(weights, count):
    if weights is None:
        return (1.0,) * count
    weights = tuple(float(w) for w in weights)
    if len(weights) != count:
        raise ValueError(f"train_step() got {len(weights)} loss weight(s) for {count} loss term(s): give one weight "
                         "per term the loss (or the network) returns")
    if not all(np.isfinite(w) for w in weights):
        raise ValueError(f"loss weights must be finite numbers, got {weights}")
    return weights


def _batch_mean(per_device, batch_size):
    """``sum(losses) / batch_size`` over the devices, float32, shape (1,), on the first device, as ``mx.np``."""
    arrays = [term.as_nd_ndarray() if isinstance(term, mx.np.ndarray) else term for term in per_device]
    ctx = arrays[0].ctx
    total = arrays[0].sum() if len(arrays) == 1 else mx.nd.add_n(*[a.sum().as_in_context(ctx) for a in arrays])
    return (total / batch_size).reshape((1,)).as_np_ndarray()
