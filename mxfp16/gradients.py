"""A trainer's reduced gradients, read as the optimizer will apply them, and the Gluon bookkeeping under the seams.

Under loss scaling the gradients in memory are ``batch_size * S`` times the
gradient of the mean loss. They stay that way: dividing float16 buffers in
place would flush the small values that scaling kept. The optimizer divides
instead (``trainer.update(batch_size * S)``), and whatever reads the gradients
before it divides by the same number: :class:`Gradients` carries it. Nothing
here waits for the host.
"""
import contextlib
import weakref
from dataclasses import dataclass

import numpy as np

from ._internals import (
    amp_initialized,
    grad_is_fresh,
    param_is_deferred,
    set_grads_fresh,
    trainer_params,
    trainer_update_on_kvstore_setting,
    trainer_updates_on_kvstore,
)
from ._lazy import module
from .float_formats import BFLOAT16, is_bfloat16

mx = module("mxnet")

__all__ = ["Gradients", "GradientWatch", "grads_are_finite", "clip_global_norm_", "GradientSums", "ParamUse",
           "param_use", "params_sitting_out", "reduce_gradients", "kvstore_applies_updates", "refuse_kvstore_updates",
           "fresh_params", "check_batch_size"]

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
    """Device-side check that every gradient is finite: an NDArray of shape (1,), 1.0 when all are.

    ``multi_all_finite`` has no bfloat16 kernel: bfloat16 gradients (of
    :func:`mxfp16.amp.bfloat16_deconvolution`'s layers) are checked in float32,
    which keeps their infinities and NaNs.
    """
    grads = [_legacy(g) for g in grads]
    grads = [g.astype("float32") if is_bfloat16(g) else g for g in grads]
    flags = [mx.nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=True) for chunk in _chunks(grads)]
    if len(flags) == 1:
        return flags[0]
    return mx.nd.min(mx.nd.concat(*[f.as_in_context(flags[0].ctx) for f in flags], dim=0), keepdims=True)


def _global_norm(grads, divisor=1.0):
    """The global L2 norm of ``grads / divisor``, shape (1,), float32, on the first gradient's device.

    ``gluon.utils.clip_global_norm`` cannot serve float16 gradients: it sums
    ``dot(x, x)`` in the gradient's dtype, which overflows float16 and has no
    float16 kernel on CPU. ``multi_sum_sq`` also accumulates in its input
    dtype, so float16 gradients are widened to float32 first.
    """
    grads = [_legacy(g) for g in grads]
    ctx = grads[0].ctx
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
        The loss scale times the batch size (the trainer's rescale divisor).
    replicas : list of NDArray
        Further copies (other devices) that receive the same clipping factor.

    Returns
    -------
    NDArray
        The global norm of ``grads / scale`` before clipping, shape (1,), float32, not read.
    """
    norm = _global_norm(grads, scale)
    ctx = norm.ctx
    factor = mx.nd.minimum(max_norm / (norm + 1e-6), mx.nd.ones((1,), ctx=ctx))
    for g in [_legacy(g) for g in list(grads) + list(replicas)]:
        if is_bfloat16(g):  # no bfloat16 multiplication on arrays: scaled in float32, rounded back in place
            mx.nd.amp_cast(mx.nd.broadcast_mul(g.astype("float32"), factor.as_in_context(g.ctx)), dtype=BFLOAT16,
                           out=g)
        else:
            g *= factor.as_in_context(g.ctx).astype(g.dtype, copy=False)
    return norm


class Gradients:
    """The reduced gradients of one trainer in one step, and the number the optimizer divides them by.

    :meth:`mxfp16.LossScaler.unscale` returns it; read the gradients through
    it, never from the parameters, which hold them scaled.

    Attributes
    ----------
    arrays : list of NDArray
        One copy of each applied gradient (the first device's), as stored: scaled, in the parameter's dtype.
    replicas : list of NDArray
        The same gradients on the other devices; clipping scales them too.
    divisor : float
        ``batch_size * loss scale``: ``arrays[i] / divisor`` is the gradient of the mean loss.
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
        """Clip in place so the unscaled global norm is at most ``max_norm``; return the norm before (``mx.np``)."""
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

    A scaled loss reports its ``backward()`` here (:meth:`watched`); each
    known trainer's gradient norm is taken on the device then, and again when
    its gradients are accumulated or unscaled. The readings ride with the
    overflow flag (no host read of their own). Not judged: a backward pass
    started another way, a trainer on its first step, an unscaled loss.
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

        An array keeps its memory and graph (its class becomes a subclass);
        a list or tuple gets a ``backward()``. With ``report=False`` (scale 1)
        only a list or tuple changes.
        """
        several = isinstance(scaled, (list, tuple))
        kind = self._kind(type(scaled), report) if report or several else None
        if kind is None:
            return scaled
        if several:
            scaled = kind(scaled)
        else:
            scaled.__class__ = kind
        if report:
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
            Keep the new reading as the reference (after
            :meth:`LossScaler.accumulate`, ``unscale()`` may compare again).
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
        """The first ``(reference, later)`` pair of host readings that differ, or ``None`` (inf/NaN: not judged)."""
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
    return [p for p in trainer_params(trainer) if p.grad_req != "null" and not param_is_deferred(p)]


def is_positive_number(value):
    """Whether ``value`` is a positive finite number (a bool is not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def is_count(value, low=1):
    """Whether ``value`` is a whole number (a bool is not) of at least ``low``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def check_batch_size(batch_size):
    """A positive finite number of samples (the optimizer divides by it)."""
    if not is_positive_number(batch_size):
        raise ValueError(f"batch_size must be a positive number of samples, got {batch_size!r}")
    return batch_size


@dataclass
class ParamUse:
    """Which of a trainer's parameters a step applies, read from the gradients the backward passes left.

    Attributes
    ----------
    applied : list of gluon.Parameter
        Trainable, with a gradient from this step.
    unused : list of gluon.Parameter
        Trainable, with no gradient since their last update.
    sitting_out : list of gluon.Parameter
        The unused ones never initialised: without a gradient array they sit
        out of Gluon's reduction and update (:func:`params_sitting_out`).
    """

    applied: list
    unused: list
    sitting_out: list

    def unused_names(self, shown=6):
        """The first ``shown`` unused parameters' names, and how many more there are."""
        more = len(self.unused) - shown
        return ", ".join(p.name for p in self.unused[:shown]) + (f" and {more} more" if more > 0 else "")


def param_use(params):
    """Sort ``params`` (a trainer's) by whether this step's backward passes reached them: a :class:`ParamUse`.

    Host-side flags only, nothing read from the devices.
    """
    trainable = [p for p in params if p.grad_req != "null"]
    if not trainable:
        raise ValueError("this trainer has no parameter to train (every grad_req is 'null')")
    adding = [p.name for p in trainable if p.grad_req == "add"]
    if adding and amp_initialized():
        raise ValueError(
            f"grad_req='add' under AMP ({', '.join(adding[:3])}{' ...' if len(adding) > 3 else ''}): MXNet "
            "1.9.1's amp_cast ignores it in the backward pass, so these parameters would receive zero "
            "gradients. Keep grad_req='write' and call scaler.accumulate(trainer) after each micro-batch's "
            "backward; step() then applies the sum")
    unused = [p for p in trainable if not grad_is_fresh(p)]
    return ParamUse([p for p in trainable if grad_is_fresh(p)], unused, [p for p in unused if param_is_deferred(p)])


@contextlib.contextmanager
def params_sitting_out(params):
    """Within the context, ``params`` (never initialised) have ``grad_req='null'``, so Gluon passes them by."""
    saved = [(param, param.grad_req) for param in params]
    for param, _ in saved:
        param.grad_req = "null"
    try:
        yield
    finally:
        for param, grad_req in saved:
            param.grad_req = grad_req


def reduce_gradients(trainer, use, divisor):
    """Sum the applied gradients over devices and workers (``trainer.allreduce_grads()``): a :class:`Gradients`.

    Parameters
    ----------
    trainer : gluon.Trainer
    use : ParamUse
        What this step applies; its parameters sitting out stay out of the reduction.
    divisor : float
        :attr:`Gradients.divisor`.
    """
    with params_sitting_out(use.sitting_out):
        trainer.allreduce_grads()
    params = use.applied
    return Gradients([p.list_grad()[0] for p in params], [g for p in params for g in p.list_grad()[1:]], divisor,
                     [p.name for p in params])


def kvstore_applies_updates(trainer):
    """Whether the trainer's kvstore applies the updates (``update_on_kvstore``): no reduced gradient to read."""
    # Asked for explicitly counts even where Gluon has no kvstore (one device): there it fails later
    # with "'NoneType' object has no attribute 'is_capable'".
    return trainer_update_on_kvstore_setting(trainer) is True or trainer_updates_on_kvstore(trainer)


def refuse_kvstore_updates(trainer, why, checks_overflow):
    """``ValueError`` for a trainer that updates on the kvstore: no reduced gradients for ``why`` or the scaler."""
    if not kvstore_applies_updates(trainer):
        return
    if checks_overflow:
        raise ValueError(
            "this trainer updates on the kvstore (update_on_kvstore=True): the kvstore would apply each "
            "update before the loss scaler could check the reduced gradients for overflow, and it cannot "
            "divide by a scale that changes every step. Build it with mxfp16.make_trainer(params, ..., "
            "precision, scaler), which sets update_on_kvstore=False, or pass update_on_kvstore=False to "
            "gluon.Trainer")
    raise ValueError(f"{why}, which a trainer that updates on the kvstore (update_on_kvstore=True) never "
                     "has; build the trainer with update_on_kvstore=False")


def fresh_params(trainer):
    """The trainer's trainable parameters that a backward pass reached since their last update (or accumulation)."""
    return [p for p in trainer_params(trainer) if p.grad_req != "null" and grad_is_fresh(p)]


class GradientSums:
    """Micro-batches' gradients summed per trainer on the devices (``accumulate()`` adds, the step folds)."""

    def __init__(self):
        self._sums = {}  # id(trainer) -> {id(param): (param, [sum per device])}

    def __bool__(self):
        return bool(self._sums)

    def add(self, trainer, params):
        """Add ``params``' fresh gradients to the trainer's sums (then marked applied); return how many it holds.

        A bfloat16 gradient is summed in float32: bfloat16's 8 bits would round
        each micro-batch's share, and MXNet has no bfloat16 addition on arrays.
        """
        sums = self._sums.setdefault(id(trainer), {})
        for param in params:
            if id(param) in sums:
                for total, grad in zip(sums[id(param)][1], param.list_grad()):
                    total += grad.astype("float32") if is_bfloat16(grad) else grad
            else:
                sums[id(param)] = (param, [grad.astype("float32") if is_bfloat16(grad) else grad.copy()
                                           for grad in param.list_grad()])
        set_grads_fresh(params, False)
        return len(sums)

    def fold(self, trainer):
        """Put the trainer's sums into its gradient arrays (plus any micro-batch not yet added), and forget them."""
        sums = self._sums.pop(id(trainer), {})
        for param, totals in sums.values():
            newest = grad_is_fresh(param)
            for grad, total in zip(param.list_grad(), totals):
                if is_bfloat16(grad):  # the float32 sum (and the newest micro-batch), rounded once
                    mx.nd.amp_cast(total + grad.astype("float32") if newest else total, dtype=BFLOAT16, out=grad)
                elif newest:
                    grad += total
                else:
                    grad[:] = total
        set_grads_fresh([param for param, _ in sums.values()], True)
