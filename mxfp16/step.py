"""The training step shared by the trainer and the benchmark.

One function serves float32, float16, amp-float16 and amp-bfloat16: the
precision decides what the batch was cast to and whether the loss scaler is
enabled, and a disabled scaler costs nothing.
"""
from dataclasses import dataclass

import mxnet as mx
import numpy as np
from mxnet import autograd

from ._internals import trainer_params, trainer_updates_on_kvstore
from .amp_lists import warn_if_numpy_mode
from .casting import to_float32

__all__ = ["StepResult", "train_step", "grads_are_finite", "clip_global_norm_"]

# multi_all_finite / multi_sum_sq take a bounded number of inputs per call.
_CHUNK = 128


@dataclass(frozen=True)
class StepResult:
    """What one step did.

    Attributes
    ----------
    loss : NDArray
        Mean loss over the batch, float32, shape (1,), on the first device.
        Not synchronised: reading it (``.asscalar()``) waits for the forward pass.
    skipped : bool
        The update was skipped because a gradient overflowed.
    loss_scale : float
        The scale used for this step's backward pass.
    grad_norm : NDArray or None
        Global L2 norm of the unscaled, batch-averaged gradients before
        clipping (only when clipping), unsynchronised.
    outputs : list of NDArray
        The network's float32 outputs, one per device, as the loss saw them
        (for accuracy counts on the device; reading them waits for the forward).
    """

    loss: mx.nd.NDArray
    skipped: bool
    loss_scale: float
    grad_norm: object = None
    outputs: tuple = ()


def _by_dtype(arrays):
    groups = {}
    for a in arrays:
        groups.setdefault(np.dtype(a.dtype).name, []).append(a)
    return groups.values()


def _chunks(arrays):
    for group in _by_dtype(arrays):
        for i in range(0, len(group), _CHUNK):
            yield group[i:i + _CHUNK]


def grads_are_finite(grads):
    """Device-side check that every gradient is finite.

    Returns an NDArray of shape (1,) holding 1.0 when all are finite; nothing
    is copied to the host. MXNet's ``multi_all_finite`` requires one dtype per
    call, so gradients are grouped by dtype.
    """
    flags = [mx.nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=True) for chunk in _chunks(grads)]
    return flags[0] if len(flags) == 1 else mx.nd.min(mx.nd.concat(*flags, dim=0), keepdims=True)


def clip_global_norm_(grads, max_norm, scale=1.0, replicas=()):
    """Clip gradients (in place) so the global L2 norm of ``grads / scale`` is at most ``max_norm``.

    ``gluon.utils.clip_global_norm`` cannot serve float16 gradients: it sums
    ``dot(x, x)`` in the gradient's dtype, which overflows float16 and has no
    float16 kernel on CPU. Here the sum of squares is accumulated in float32
    (``multi_sum_sq`` on float32 views), and the threshold is compared
    against the norm divided by the loss scale. No host synchronisation.

    Parameters
    ----------
    grads : list of NDArray
        One copy of every gradient (the norm is computed over these).
    max_norm : float
    scale : float
        What the gradients carry beyond the update the optimizer applies:
        the loss scale times the batch size (the trainer's rescale divisor).
    replicas : list of NDArray
        Further copies (other devices) that receive the same clipping factor.

    Returns
    -------
    NDArray
        The global norm of ``grads / scale``, shape (1,), float32.
    """
    ctx = grads[0].ctx
    # multi_sum_sq accumulates in its input dtype, so float16 groups are
    # widened first: squared scaled gradients overflow float16 easily.
    sums = [mx.nd.multi_sum_sq(*chunk, num_arrays=len(chunk)).sum().as_in_context(ctx)
            for chunk in _chunks([g if g.dtype == np.float32 else g.astype("float32") for g in grads])]
    norm = mx.nd.sqrt(mx.nd.add_n(*sums) if len(sums) > 1 else sums[0]).reshape((1,)) / scale
    factor = mx.nd.minimum(max_norm / (norm + 1e-6), mx.nd.ones((1,), ctx=ctx))
    for g in list(grads) + list(replicas):
        g *= factor.as_in_context(g.ctx).astype(g.dtype, copy=False)
    return norm


def train_step(net, loss_fn, trainer, data, label, scaler, batch_size=None, clip_grad_norm=None):
    """Forward, float32 loss, scaled backward, reduce, check, clip and update.

    Parameters
    ----------
    net : gluon.Block
        Already cast (or under AMP) for the precision.
    loss_fn : gluon.loss.Loss
        Receives float32 outputs (see :func:`mxfp16.casting.to_float32`).
    trainer : gluon.Trainer
        From :func:`mxfp16.make_trainer`; must not update on the kvstore when
        the scaler is enabled or clipping is on.
    data, label : list of NDArray
        One slice per device, from :func:`mxfp16.cast_batch`.
    scaler : LossScaler
        A disabled scaler makes this a plain float32-style step.
    batch_size : int, optional
        Total samples across devices; by default the sum of slice lengths.
    clip_grad_norm : float, optional
        Clip the global norm of the gradient the optimizer applies (unscaled,
        averaged over the batch) to this value.

    Returns
    -------
    StepResult

    Notes
    -----
    Host synchronisation points:

    * With an enabled scaler, exactly one: reading the overflow flag
      (``asscalar`` on one float). The skip-or-update decision is a Python
      branch, so it must be on the host; it is taken after
      ``allreduce_grads`` so every device and worker decides the same.
    * With a disabled scaler, none: the loss and the gradient norm are
      returned as device arrays for the caller to read when it wants.
    """
    if batch_size is None:
        batch_size = sum(x.shape[0] for x in data)
    scale = scaler.scale
    with autograd.record():
        raw = [net(x) for x in data]
        warn_if_numpy_mode(raw[0])
        outputs = [to_float32(out) for out in raw]
        losses = [loss_fn(out, y) for out, y in zip(outputs, label)]
        heads = [loss * scale for loss in losses] if scale != 1.0 else losses
    autograd.backward(heads)

    needs_reduced_grads = scaler.checks_overflow or clip_grad_norm is not None
    if not needs_reduced_grads and trainer_updates_on_kvstore(trainer):
        trainer.step(batch_size)
        return StepResult(_mean_loss(losses, batch_size), False, scale, outputs=tuple(outputs))

    trainer.allreduce_grads()
    grads = [p.list_grad()[0] for p in trainer_params(trainer) if p.grad_req != "null"]
    skipped = False
    if scaler.checks_overflow:
        finite = grads_are_finite(grads)
        skipped = scaler.update(overflow=finite.asscalar() < 1.0)  # the one host sync
    grad_norm = None
    if not skipped:
        if clip_grad_norm is not None:
            # Other devices hold identical reduced copies: same factor, norm counted once.
            replicas = [g for p in trainer_params(trainer) if p.grad_req != "null" for g in p.list_grad()[1:]]
            grad_norm = clip_global_norm_(grads, clip_grad_norm, batch_size * scale, replicas)
        trainer.update(batch_size * scale)
    return StepResult(_mean_loss(losses, batch_size), skipped, scale, grad_norm, tuple(outputs))


def _mean_loss(losses, batch_size):
    ctx = losses[0].ctx
    total = losses[0].sum() if len(losses) == 1 else mx.nd.add_n(*[l.sum().as_in_context(ctx) for l in losses])
    return (total / batch_size).reshape((1,))
