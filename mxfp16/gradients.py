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

Anything that touches the gradients before they are unscaled gets them
scaled: ``gluon.utils.clip_global_norm(grads, max_norm)`` there clips them to
``max_norm`` while they carry ``batch_size * S``, so the update shrinks by
that factor and training crawls without an error. :class:`GradientWatch`
notices such a change between the scaled backward pass and ``unscale()``.
"""
import weakref

import numpy as np

from ._lazy import module

mx = module("mxnet")

__all__ = ["Gradients", "GradientWatch", "grads_are_finite", "clip_global_norm_"]

# multi_all_finite / multi_sum_sq take a bounded number of inputs per call.
_CHUNK = 128


def _legacy(array):
    """A legacy-NDArray view of ``array`` (same memory): the multi-tensor operators refuse numpy-mode arrays."""
    return array.as_nd_ndarray() if isinstance(array, mx.np.ndarray) else array


def _chunks(arrays):
    """``arrays`` in groups a multi-tensor operator takes at once: one dtype, one device, at most ``_CHUNK``."""
    groups = {}
    for a in arrays:
        groups.setdefault((np.dtype(a.dtype).name, str(a.ctx)), []).append(a)
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
    if len(flags) == 1:
        return flags[0]
    return mx.nd.min(mx.nd.concat(*[f.as_in_context(flags[0].ctx) for f in flags], dim=0), keepdims=True)


def _global_norm(grads, divisor=1.0):
    """The global L2 norm of ``grads / divisor``, shape (1,), float32, on the first gradient's device.

    The gradients may live on several devices; each device sums its own
    squares and the first device adds them up.

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


class GradientWatch:
    """Notices gradients changed between the scaled backward pass and ``unscale()``: clipped while still scaled.

    The loss scaler keeps one. A scaled loss it hands out reports its
    ``backward()`` here (:meth:`watched`); the global norm of each known
    trainer's gradients is then taken on the device (the reference), and
    taken again when the trainer's gradients are accumulated or unscaled.
    Nothing legitimate changes them in between, so two different readings
    mean something touched them while they still carried the scale.

    The same reduction of the same numbers gives the same result (the
    tolerance only allows for a device whose reduction order may vary), and
    a clip changes the norm by the factor it clips by. It costs two passes
    over the gradients on the device per step and no host read of its own:
    the readings travel to the host with the overflow flag, in the read the
    step makes anyway. What it cannot see it does not judge: a
    backward pass started another way (``autograd.backward(heads)``), a
    trainer on its first step (it is learnt at its first accumulate,
    unscale or step), and an unscaled loss (scale 1, nothing to get wrong).
    """

    #: Relative difference of two readings taken as a change (far above the rounding of a reordered float32 sum).
    TOLERANCE = 1e-5

    def __init__(self):
        self._trainers = weakref.WeakValueDictionary()  # id(trainer) -> trainer, learnt at the seams
        self._classes = {}                              # (loss type, reports) -> its subclass with backward()
        self.reset()

    def reset(self):
        """Forget everything of the step (the scaler's update() ends it)."""
        self._references = {}   # id(trainer) -> the norm just after the last reported backward (device)
        self._readings = {}     # id(trainer) -> [(reference, now)] compared since, waiting for the host
        self._unreported = set()  # ids of scaled losses whose backward() has not reported yet

    def learn(self, trainer):
        """A trainer the scaler saw: its gradients are read after each reported backward from now on."""
        self._trainers[id(trainer)] = trainer

    def watched(self, scaled, report=True):
        """``scaled`` (a loss, or a list or tuple of them) as an object whose ``backward()`` reports here.

        An array keeps its memory and its graph (its class becomes a
        subclass of its own that adds the report); a list or tuple becomes
        one of a subclass with a ``backward()`` of its own. Any other type
        is returned as it is, unwatched. With ``report=False`` (a loss scale
        of 1: nothing to watch) a list or tuple still gets its
        ``backward()``, which reports nothing, and an array is returned as
        it is.
        """
        if not report:
            kind = self._kind(type(scaled), False) if isinstance(scaled, (list, tuple)) else None
            return scaled if kind is None else kind(scaled)
        kind = self._kind(type(scaled), True)
        if kind is None:
            return scaled
        if isinstance(scaled, (list, tuple)):
            scaled = kind(scaled)
        else:
            scaled.__class__ = kind
        self._unreported.add(id(scaled))
        self._references.clear()  # a new backward pass is coming; what was read before it says nothing
        return scaled

    def _kind(self, base, report):
        if base not in (mx.nd.NDArray, mx.np.ndarray, list, tuple):
            return None
        if (base, report) not in self._classes:
            watch = weakref.ref(self) if report else (lambda: None)

            def backward(heads, *args, **kwargs):
                """Back-propagate (as the type it extends does), then let the loss scaler read the gradients."""
                if isinstance(heads, (list, tuple)):
                    mx.autograd.backward(list(heads), *args, **kwargs)
                else:
                    base.backward(heads, *args, **kwargs)
                owner = watch()
                if owner is not None:
                    owner._reported(id(heads))

            name = ("Scaled" if report else "Loss") + base.__name__[0].upper() + base.__name__[1:]
            self._classes[base, report] = type(name, (base,), {"__slots__": (), "backward": backward})
        return self._classes[base, report]

    def _reported(self, head):
        from ._internals import grad_is_fresh

        self._unreported.discard(head)
        for key, trainer in list(self._trainers.items()):
            params = _watched_params(trainer)
            if any(grad_is_fresh(p) for p in params):
                self._references[key] = _norm_of(params)

    def check(self, trainer, keep=False):
        """Compare the trainer's gradients with the reading after the last reported backward (on the device).

        Parameters
        ----------
        trainer : gluon.Trainer
        keep : bool
            Keep the new reading as the reference: :meth:`LossScaler.accumulate`
            leaves the gradient arrays as they are until the next backward or
            ``unscale()``, which may compare again.
        """
        reference = self._references.pop(id(trainer), None)
        if reference is None or self._unreported:  # a backward this watch did not see may have come after
            return
        now = _norm_of(_watched_params(trainer))
        self._readings.setdefault(id(trainer), []).append((reference, now))
        if keep:
            self._references[id(trainer)] = now

    def take_readings(self, trainer):
        """The trainer's pending readings as device arrays of shape (1,), reference then later reading, in pairs."""
        return [reading for pair in self._readings.pop(id(trainer), []) for reading in pair]

    @classmethod
    def changed(cls, values):
        """The first ``(reference, later)`` pair of host readings that differ, or ``None``.

        Non-finite readings are left to the overflow check, which skips the step.
        """
        for reference, later in zip(values[0::2], values[1::2]):
            if np.isfinite(reference) and np.isfinite(later) and abs(later - reference) > cls.TOLERANCE * reference:
                return float(reference), float(later)
        return None


def _norm_of(params):
    """The global norm of every device's gradient of ``params``, outside any autograd recording."""
    with mx.autograd.pause():  # a backward() called inside record() reports from inside it
        return _global_norm([g for p in params for g in p.list_grad()])


def _watched_params(trainer):
    """The trainer's parameters that hold a gradient: trainable and initialised."""
    from ._internals import param_is_deferred, trainer_params

    return [p for p in trainer_params(trainer) if p.grad_req != "null" and not param_is_deferred(p)]
