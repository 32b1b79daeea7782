"""A trainer's reduced gradients, read as the optimizer will apply them.

Under loss scaling the gradients in memory are ``batch_size * S`` times the
gradient of the mean loss. They stay that way: for float16 parameters the
gradient buffers are float16, and dividing them in place would flush the
small values that scaling kept (2**-24 and below become zero). The
optimizer divides instead (``trainer.update(batch_size * S)``, in float32
with ``multi_precision``), and whatever reads the gradients before it
divides by the same number: :class:`Gradients` carries it.

Every function here runs on the devices and returns device arrays; nothing
waits for the host.
"""
import mxnet as mx
import numpy as np

__all__ = ["Gradients", "grads_are_finite", "clip_global_norm_"]

# multi_all_finite / multi_sum_sq take a bounded number of inputs per call.
_CHUNK = 128


def _legacy(array):
    """A legacy-NDArray view of ``array`` (same memory): the multi-tensor operators refuse numpy-mode arrays."""
    return array.as_nd_ndarray() if isinstance(array, mx.np.ndarray) else array


def _chunks(arrays):
    groups = {}
    for a in arrays:
        groups.setdefault(np.dtype(a.dtype).name, []).append(a)
    for group in groups.values():
        for i in range(0, len(group), _CHUNK):
            yield group[i:i + _CHUNK]


def grads_are_finite(grads):
    """Device-side check that every gradient is finite.

    Returns an NDArray of shape (1,) holding 1.0 when all are finite; nothing
    is copied to the host. MXNet's ``multi_all_finite`` requires one dtype per
    call, so gradients are grouped by dtype.
    """
    grads = [_legacy(g) for g in grads]
    flags = [mx.nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=True) for chunk in _chunks(grads)]
    return flags[0] if len(flags) == 1 else mx.nd.min(mx.nd.concat(*flags, dim=0), keepdims=True)


def _global_norm(grads, divisor=1.0):
    """The global L2 norm of ``grads / divisor``, shape (1,), float32, on the first gradient's device.

    ``gluon.utils.clip_global_norm`` cannot serve float16 gradients: it sums
    ``dot(x, x)`` in the gradient's dtype, which overflows float16 and has no
    float16 kernel on CPU. Here the sum of squares is accumulated in float32
    (``multi_sum_sq`` on float32 views).
    """
    grads = [_legacy(g) for g in grads]
    ctx = grads[0].ctx
    # multi_sum_sq accumulates in its input dtype, so float16 groups are
    # widened first: squared scaled gradients overflow float16 easily.
    sums = [mx.nd.multi_sum_sq(*chunk, num_arrays=len(chunk)).sum().as_in_context(ctx)
            for chunk in _chunks([g if g.dtype == np.float32 else g.astype("float32") for g in grads])]
    return mx.nd.sqrt(mx.nd.add_n(*sums) if len(sums) > 1 else sums[0]).reshape((1,)) / divisor


def clip_global_norm_(grads, max_norm, scale=1.0, replicas=()):
    """Clip gradients (in place) so the global L2 norm of ``grads / scale`` is at most ``max_norm``.

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
        The global norm of ``grads / scale`` before clipping, shape (1,),
        float32. No host synchronisation: an overflowing step gives an
        infinite or NaN norm (and gradients), which the skip discards.
    """
    norm = _global_norm(grads, scale)
    ctx = norm.ctx
    factor = mx.nd.minimum(max_norm / (norm + 1e-6), mx.nd.ones((1,), ctx=ctx))
    for g in [_legacy(g) for g in list(grads) + list(replicas)]:
        g *= factor.as_in_context(g.ctx).astype(g.dtype, copy=False)
    return norm


class Gradients:
    """The reduced gradients of one trainer in one step, and the number the optimizer divides them by.

    :meth:`mxfp16.LossScaler.unscale` returns it; read the gradients through
    it, never straight from the parameters, which hold them scaled.

    Attributes
    ----------
    arrays : list of NDArray
        One copy of each gradient that will be applied (the first device's),
        as stored: scaled, in the parameter's dtype.
    replicas : list of NDArray
        The same gradients on the other devices (identical after the
        reduction); clipping scales them too.
    divisor : float
        ``batch_size * loss scale``: ``arrays[i] / divisor`` is the gradient
        of the mean loss, which the optimizer applies.
    names : list of str
        The parameter of each array.
    """

    def __init__(self, arrays, replicas, divisor, names):
        self.arrays = list(arrays)
        self.replicas = list(replicas)
        self.divisor = float(divisor)
        self.names = list(names)

    def norm(self):
        """The global L2 norm of the unscaled gradients: ``mx.np`` float32 of shape (1,), not read (``.item()``)."""
        return _global_norm(self.arrays, self.divisor).as_np_ndarray()

    def clip_(self, max_norm):
        """Clip in place so the unscaled global norm is at most ``max_norm``; return the norm before clipping.

        On every device, with one factor. On a step that overflowed the norm
        is inf or NaN and so are the clipped gradients; the step skips them.
        The norm is an ``mx.np`` float32 array of shape (1,), not read.
        """
        return clip_global_norm_(self.arrays, max_norm, self.divisor, self.replicas).as_np_ndarray()

    def unscaled(self):
        """float32 copies of ``arrays / divisor``, for reading (what the optimizer will apply)."""
        return [_legacy(g).astype("float32") / self.divisor for g in self.arrays]

    def __len__(self):
        return len(self.arrays)

    def __repr__(self):
        return f"Gradients({len(self.arrays)} arrays, divisor={self.divisor:g})"
