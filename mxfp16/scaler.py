"""Loss scaling: keep small float16 gradients from flushing to zero.

The loss is multiplied by a scale S before backward, so the gradients land
inside float16's range; the optimizer divides S back out
(``trainer.update(batch_size * S)``). A *dynamic* scaler backs off when a
gradient overflows (that step is skipped) and grows after a run of clean steps.

:class:`LossScaler` keeps a step's four seams in order, as PyTorch's
``GradScaler`` does: :meth:`~LossScaler.scale_loss` (:meth:`~LossScaler.accumulate`
after each micro-batch), :meth:`~LossScaler.unscale`, :meth:`~LossScaler.step`
and :meth:`~LossScaler.update` (docs/getting-started.md, "Your own step").
Trainers sharing one scaler (a GAN's two) are each skipped only when *their*
gradients overflowed; the scale backs off when any did.
"""
from collections import deque
from dataclasses import dataclass

from ._internals import set_grads_fresh, trainer_params
from ._lazy import module
from .float_formats import format_scale
from .gradients import (
    GradientSums,
    GradientWatch,
    check_batch_size,
    fresh_params,
    grads_are_finite,
    is_count,
    is_positive_number,
    kvstore_applies_updates,
    param_use,
    params_sitting_out,
    reduce_gradients,
    refuse_kvstore_updates,
)
from .optim import check_bfloat16_masters
from .precision import Precision

mx = module("mxnet")

__all__ = ["LossScaler", "LossScaleDivergedError", "StepOrderError", "UnusedParameterError", "make_loss_scaler",
           "parse_loss_scale"]


class LossScaleDivergedError(FloatingPointError):
    """Gradients overflow even at the minimum loss scale: training has diverged."""


class StepOrderError(RuntimeError):
    """A seam of the step called out of order: unscale twice, step before backward, update twice ..."""


class UnusedParameterError(ValueError):
    """Parameters of the trainer received no gradient in this step (the forward pass did not use them)."""


@dataclass
class _TrainerStep:
    """Where one trainer is in the current step."""

    trainer: object
    stage: str                 # 'unscaled' or 'stepped'
    batch_size: float
    params: list               # the parameters this step applies
    grads: object = None       # from unscale() (None: stepped on the kvstore)
    finite: object = None      # device flag, 1.0 when every reduced gradient is finite (None: not checked)
    skip_unused: bool = False
    sitting_out: list = ()     # ParamUse.sitting_out
    overflow: bool = False


def check_loss(loss, source="scale_loss()"):
    """Refuse a loss that is not a device array (a Python or numpy number has left the graph).

    Parameters
    ----------
    loss : NDArray, mx.np.ndarray, or a list or tuple of them
    source : str
        What produced it, for the message.
    """
    items = loss if isinstance(loss, (list, tuple)) else [loss]
    if not items:
        raise ValueError(f"{source} got an empty list of losses: pass the loss array(s) of the forward pass")
    for item in items:
        if isinstance(item, mx.nd.NDArray):  # mx.np.ndarray is a subclass
            continue
        kind = type(item).__name__
        if isinstance(item, (int, float)) or type(item).__module__ == "numpy":
            origin = "Python" if type(item).__module__ == "builtins" else "numpy"
            raise TypeError(
                f"{source} got a {origin} {kind} ({item!r:.40}) as the loss, not an MXNet array: a "
                "number read from the loss (.item(), .asscalar(), .asnumpy(), float()) has left the autograd "
                "graph, so backward cannot reach the parameters. Pass the loss array the forward pass returned "
                "inside autograd.record()")
        raise TypeError(f"{source} got {kind} as the loss; it must be an MXNet array (or a list of them) "
                        "computed inside autograd.record()")


class LossScaler:
    """Static or dynamic loss scale, and the record of skipped steps.

    Parameters
    ----------
    init_scale : float, default 2**16
        The starting scale.
    growth_factor : float, default 2.0
        Multiplier applied after ``growth_interval`` consecutive clean steps.
    backoff_factor : float, default 0.5
        Multiplier applied on overflow.
    growth_interval : int, default 2000
        Clean steps between growths.
    hysteresis : int, default 1
        Consecutive overflowing steps (each still skipped) tolerated before backing off.
    min_scale, max_scale : float, default 1.0 and 2**24
        Clamps for the dynamic scale.
    dynamic : bool, default True
        ``False`` keeps ``init_scale`` fixed (overflowing steps are still skipped).
    enabled : bool, default True
        ``False`` is a no-op: scale 1, nothing checked or skipped (one step serves every precision).
    max_overflows_at_min : int, default 50
        Consecutive overflows at the minimum (or static) scale after which
        :meth:`update` raises :class:`LossScaleDivergedError` instead of skipping forever.
    history_size : int, default 1000
        How many recent scales :attr:`history` keeps.
    precision : Precision, optional
        So a step can refuse an AMP precision never activated. Not part of the state.

    Attributes
    ----------
    skipped_at : list of int
        The steps skipped, numbered by :attr:`steps` (from 1).
    """

    STATE_VERSION = 1
    _COUNTERS = ("clean_steps", "overflows_left", "overflows_at_min", "steps", "skipped_steps")
    #: The settings, each with the type it is kept as.
    _CONFIG = {"init_scale": float, "growth_factor": float, "backoff_factor": float, "growth_interval": int,
               "hysteresis": int, "min_scale": float, "max_scale": float, "dynamic": bool, "enabled": bool,
               "max_overflows_at_min": int}

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, hysteresis=1, min_scale=1.0, max_scale=2.0 ** 24,
                 dynamic=True, enabled=True, max_overflows_at_min=50, history_size=1000, precision=None):
        arguments = locals()
        self._check(*(arguments[name] for name in self._CONFIG))
        for name, kind in self._CONFIG.items():
            setattr(self, name, kind(arguments[name]))
        self.history = deque(maxlen=history_size)
        self._precision = precision
        self._watch = GradientWatch()
        self._reset()

    @staticmethod
    def _check(init_scale, growth_factor, backoff_factor, growth_interval, hysteresis, min_scale, max_scale,
               dynamic, enabled, max_overflows_at_min):
        """Refuse settings that would make the scale meaningless (nan and inf compare False with everything)."""
        if not all(map(is_positive_number, (init_scale, min_scale, max_scale))) or max_scale < min_scale:
            raise ValueError("loss scales must be positive finite numbers with min_scale <= max_scale, got "
                             f"init_scale={init_scale!r}, min_scale={min_scale!r}, max_scale={max_scale!r}")
        if not (all(map(is_positive_number, (growth_factor, backoff_factor))) and growth_factor > 1.0 > backoff_factor):
            raise ValueError("growth_factor must be > 1 and backoff_factor in (0, 1)")
        if not all(map(is_count, (growth_interval, hysteresis, max_overflows_at_min))):
            raise ValueError("growth_interval, hysteresis and max_overflows_at_min must be whole numbers >= 1")
        for name, value in (("dynamic", dynamic), ("enabled", enabled)):
            if not isinstance(value, bool):  # "no" and "false" are truthy strings
                raise ValueError(f"{name} must be True or False, got {value!r}")

    def _reset(self):
        self._scale = min(max(self.init_scale, self.min_scale), self.max_scale) if self.dynamic else self.init_scale
        self._clean_steps = 0
        self._overflows_left = self.hysteresis
        self._overflows_at_min = 0
        self.steps = 0
        self.skipped_at = []
        self._earlier_skips = 0  # skips restored from a state that did not record their steps
        self.last_step_skipped = False
        self.history.clear()
        self._end_step()

    def _end_step(self, ended_by=None):
        """Forget the iteration's seams; ``ended_by`` says how :meth:`update` recorded its outcome."""
        self._open = {}           # id(trainer) -> _TrainerStep
        self._accumulated = GradientSums()
        self._watch.reset()
        # 'step': the outcome came from step() (train_step's too); 'given': from update(overflow=...); None: a
        # seam has been called since (a new iteration began), or nothing was recorded yet.
        self._last_update = ended_by

    @property
    def precision(self):
        """The run's precision (a :class:`~mxfp16.Precision`, or ``None`` when none was given)."""
        return self._precision

    def settle_precision(self, precision):
        """Take the precision ``auto`` settled on (:class:`mxfp16.MixedPrecision` calls it); the scale stays."""
        if not isinstance(precision, Precision):
            raise TypeError(f"settle_precision() takes a resolved mxfp16.Precision, got {precision!r}")
        self._precision = precision

    @property
    def skipped_steps(self):
        """How many steps were skipped."""
        return self._earlier_skips + len(self.skipped_at)

    @property
    def scale(self):
        """The scale to multiply the loss by now (1.0 when disabled)."""
        return self._scale if self.enabled else 1.0

    @property
    def checks_overflow(self):
        """Whether the step must check gradients for inf/NaN (costs one host sync)."""
        return self.enabled

    def scale_loss(self, loss):
        """The first seam: ``loss`` times the scale, to call ``backward`` on.

        Recorded for autograd even outside ``autograd.record()``. Call ``.backward()`` on what it returns (a
        list has one too), so that :meth:`step` can refuse gradients changed before :meth:`unscale`.

        Parameters
        ----------
        loss : NDArray, mx.np.ndarray, or a list or tuple of them
            Per-sample losses (one array per device or per loss term).

        Returns
        -------
        The same structure, scaled (the arrays themselves at scale 1), with a ``backward()``.
        """
        check_loss(loss)
        self._last_update = None  # a new iteration's loss: what update(overflow=...) says next is about it
        scale = self.scale
        if scale == 1.0:  # nothing scaled, nothing to watch; a list still gets its backward()
            return self._watch.watched(loss, report=False)
        if isinstance(loss, (list, tuple)):
            return self._watch.watched(type(loss)(self._scaled(item, scale) for item in loss))
        return self._watch.watched(self._scaled(loss, scale))

    @staticmethod
    def _scaled(loss, scale):
        if mx.autograd.is_recording():
            return loss * scale
        with mx.autograd.record():  # the product must be in the graph for backward to reach the loss
            return loss * scale

    def accumulate(self, trainer):
        """Keep the gradients of the micro-batch just back-propagated, and make room for the next.

        Call it after each micro-batch's ``backward``; :meth:`unscale` /
        :meth:`step` with the samples of all micro-batches apply the sum (not
        ``grad_req='add'``, which AMP ignores: docs/getting-started.md).

        Parameters
        ----------
        trainer : gluon.Trainer

        Returns
        -------
        int
            How many parameters hold an accumulated gradient.
        """
        if id(trainer) in self._open:
            raise StepOrderError("accumulate() after unscale() or step() for this trainer: accumulate each "
                                 "micro-batch first, then unscale()/step() once")
        self._last_update = None
        self._watch.learn(trainer)
        fresh = fresh_params(trainer)
        if not fresh:
            raise StepOrderError("accumulate() before backward: no parameter of this trainer received a gradient "
                                 "since the last accumulate() or update()")
        self._watch.check(trainer, keep=True)  # before the sums: the gradients as this micro-batch left them
        return self._accumulated.add(trainer, fresh)

    def unscale(self, trainer, batch_size, skip_unused_params=False):
        """The second seam: reduce the trainer's gradients, check them for overflow, hand them out unscaled.

        The check runs on the device after ``allreduce_grads()``; :meth:`step` calls it when it was not.

        Parameters
        ----------
        trainer : gluon.Trainer
            Built with ``update_on_kvstore=False`` (as :func:`mxfp16.make_trainer` does for an enabled scaler).
        batch_size : int or float
            The samples whose summed losses made the gradients (all devices,
            workers and micro-batches), as in ``trainer.step(batch_size)``.
        skip_unused_params : bool
            Leave parameters that received no gradient unchanged (and unchecked) instead of raising
            :class:`UnusedParameterError`.

        Returns
        -------
        Gradients
        """
        state = self._open.get(id(trainer))
        if state is not None:
            raise StepOrderError(
                "unscale() was already called for this trainer in this iteration; the gradients it returned are "
                "still valid (scaler.clip_global_norm(trainer, max_norm) clips them). Call it once per trainer and "
                "iteration, then step() and update()" if state.stage == "unscaled" else
                "unscale() after step() for this trainer: the update was already applied or skipped; call "
                "scaler.update() to end the iteration")
        self._last_update = None
        self._watch.learn(trainer)
        refuse_kvstore_updates(trainer, "unscale() reads the reduced gradients", self.checks_overflow)
        batch_size = check_batch_size(batch_size)
        self._watch.check(trainer)  # as the backward pass left them: before the sums and the reduction
        self._accumulated.fold(trainer)
        use = self._param_use(trainer, skip_unused_params)
        grads = reduce_gradients(trainer, use, batch_size * self.scale)
        finite = grads_are_finite(grads.arrays) if self.checks_overflow else None
        self._open[id(trainer)] = _TrainerStep(trainer, "unscaled", batch_size, use.applied, grads, finite,
                                               skip_unused_params, use.sitting_out)
        return grads

    def clip_global_norm(self, trainer, max_norm):
        """Clip the trainer's unscaled gradients to a global L2 norm of ``max_norm``, after :meth:`unscale`.

        The norm is that of the gradient the optimizer applies (unscaled,
        batch-averaged): a threshold for Gluon's summed gradients becomes
        ``max_norm / batch_size``.

        Parameters
        ----------
        trainer : gluon.Trainer
        max_norm : float

        Returns
        -------
        mx.np.ndarray
            The global norm before clipping, float32, shape (1,), not read.
        """
        if not is_positive_number(max_norm):
            raise ValueError(f"clip_global_norm() takes max_norm as a positive finite number, got {max_norm!r}")
        state = self._open.get(id(trainer))
        if state is None:
            raise StepOrderError(
                "clip_global_norm() before unscale() for this trainer: its gradients still carry the loss scale "
                "and the batch size. Call scaler.unscale(trainer, batch_size) first, then clip, then step()")
        if state.stage == "stepped" or state.grads is None:
            raise StepOrderError("clip_global_norm() after step() for this trainer: the update was already applied "
                                 "or skipped; clip between unscale() and step()")
        return state.grads.clip_(max_norm)

    def step(self, trainer, batch_size=None, skip_unused_params=False):
        """The third seam: apply the trainer's update, or skip it when its reduced gradients overflowed.

        With an enabled scaler this is the step's one host synchronisation:
        the flag is computed after the reduction so every worker takes the
        same branch (a kvstore deadlocks otherwise).

        Parameters
        ----------
        trainer : gluon.Trainer
        batch_size : int or float, optional
            As for :meth:`unscale`; needed when :meth:`unscale` was not
            called, and must agree with it when it was.
        skip_unused_params : bool
            As for :meth:`unscale`, when it was not called.

        Returns
        -------
        bool
            ``True`` when the update was skipped (a gradient was inf or NaN).
        """
        state = self._open.get(id(trainer))
        if state is not None and state.stage == "stepped":
            raise StepOrderError(
                "step() was already called for this trainer in this iteration: each trainer steps once between two "
                "update()s. Call scaler.update() after the last trainer's step() (with one trainer, after every "
                "step(); train_step does both)")
        if state is None:
            if batch_size is None:
                raise TypeError("step() needs batch_size when unscale() was not called for this trainer")
            if not self.checks_overflow and kvstore_applies_updates(trainer):
                return self._step_on_kvstore(trainer, check_batch_size(batch_size), skip_unused_params)
            self.unscale(trainer, batch_size, skip_unused_params)
            state = self._open[id(trainer)]
        elif batch_size is not None and check_batch_size(batch_size) != state.batch_size:
            raise ValueError(f"step() got batch_size {batch_size!r}, but unscale() was given {state.batch_size!r}: "
                             "the gradients were unscaled for that batch")
        readings = self._watch.take_readings(trainer)
        values = self._read([state.finite] if state.finite is not None else [], readings)
        changed = GradientWatch.changed(values[len(values) - len(readings):])
        if changed is not None:
            self._refuse_changed_gradients(state, *changed)
        state.overflow = state.finite is not None and bool(values[0] < 1.0)
        if state.overflow:
            # A skipped update leaves the gradients unapplied; without this they would count as fresh
            # next step, and a parameter unused then would carry this step's inf into its check.
            set_grads_fresh(state.params, False)
        else:
            check_bfloat16_masters(state.trainer, state.params)  # a host-side check of dtypes: no wait
            with params_sitting_out(state.sitting_out):
                state.trainer.update(state.batch_size * self.scale, ignore_stale_grad=state.skip_unused)
        state.stage = "stepped"
        return state.overflow

    @staticmethod
    def _read(flags, readings):
        """The overflow flag and the gradient watch's readings on the host, in one transfer (or none when empty)."""
        arrays = list(flags) + list(readings)
        if not arrays:
            return []
        ctx = arrays[0].ctx
        joined = arrays[0] if len(arrays) == 1 else mx.nd.concat(*[a.as_in_context(ctx) for a in arrays], dim=0)
        return [float(v) for v in joined.asnumpy()]

    def _refuse_changed_gradients(self, state, before, after):
        # Nothing is applied; the trainer's iteration ends here, so a retried step() cannot apply them either.
        set_grads_fresh(state.params, False)
        del self._open[id(state.trainer)]
        raise StepOrderError(
            f"this trainer's gradients changed between the scaled backward pass and unscale(): their global norm "
            f"went from {before:.6g} to {after:.6g} while they still carried the loss scale times the batch size "
            f"({format_scale(self.scale)} x {state.batch_size:g}). A clip there (gluon.utils.clip_global_norm(grads, "
            "max_norm) before unscale) shrinks every update by that factor, and training crawls without an error. "
            "Clip after unscale(): scaler.unscale(trainer, batch_size), then scaler.clip_global_norm(trainer, "
            "max_norm), then scaler.step(trainer); max_norm bounds the batch-averaged gradient the optimizer "
            "applies, so a threshold written for Gluon's summed gradients (a script that calls "
            "trainer.step(batch_size)) is divided by the batch size")

    def update(self, overflow=None):
        """The last seam: record the iteration's outcome and adjust the scale, once per iteration.

        Parameters
        ----------
        overflow : bool, optional
            Only for a step checked by other means (no :meth:`step` in it).
            By default any trainer's overflow in :meth:`step`.

        Returns
        -------
        bool
            ``True`` when the iteration was (or must be) skipped, wholly or for some trainer.
        """
        if overflow is None:
            stepped = [state for state in self._open.values() if state.stage == "stepped"]
            if self._accumulated or any(state.stage == "unscaled" for state in self._open.values()):
                raise StepOrderError(
                    "update() while a trainer's gradients were unscaled or accumulated but not stepped: call "
                    "scaler.step(trainer) for each such trainer first (it skips an update that overflowed), then "
                    "update() once")
            if not stepped:
                if self._last_update is not None:
                    raise StepOrderError(
                        "update() was called twice in one iteration: the scale would grow twice as fast. "
                        "train_step() already updates the scale; with your own step call update() once, after the "
                        "last trainer's step()")
                raise StepOrderError("update() before step(): no trainer was stepped since the last update; call "
                                     "scaler.step(trainer, batch_size) first")
            overflow, ended_by = any(state.overflow for state in stepped), "step"
        elif self._open or self._accumulated:
            raise StepOrderError("update(overflow=...) while a step is in progress: after step(), call update() "
                                 "without arguments (the step knows whether it overflowed)")
        elif self._last_update == "step":
            raise StepOrderError(
                "update(overflow=...) right after an update that ended a step of the seams (train_step() ends its "
                "own): that step's outcome is already recorded, and a second one would count it twice, so a "
                "dynamic scale would grow twice as fast. Drop this call: update(overflow=...) is for a step checked "
                "by other means, once per step")
        else:
            ended_by = "given"
        self._end_step(ended_by)
        return self._record(bool(overflow))

    def _step_on_kvstore(self, trainer, batch_size, skip_unused_params):
        """A disabled scaler with a trainer that updates on the kvstore: Gluon's own step, nothing read."""
        self._last_update = None
        self._accumulated.fold(trainer)
        use = self._param_use(trainer, skip_unused_params)
        with params_sitting_out(use.sitting_out):
            trainer.step(batch_size, ignore_stale_grad=skip_unused_params)
        self._open[id(trainer)] = _TrainerStep(trainer, "stepped", batch_size, use.applied,
                                               skip_unused=skip_unused_params)
        return False

    @staticmethod
    def _param_use(trainer, skip_unused_params):
        """The trainer's :class:`~mxfp16.gradients.ParamUse` for this step; unused parameters refused unless skipped."""
        use = param_use(trainer_params(trainer))
        if not use.applied:
            raise StepOrderError(
                "no parameter of this trainer received a gradient since its last update: call backward first, on "
                "the scaled loss (scaler.scale_loss(loss).backward(), with the loss computed inside "
                "autograd.record()), then unscale() or step()")
        if use.unused and not skip_unused_params:
            raise UnusedParameterError(
                f"{len(use.unused)} parameter(s) received no gradient in this step: {use.unused_names()}. The forward "
                "pass did not use them (an unused head?). Pass skip_unused_params=True (to train_step, or to the "
                "scaler's unscale()/step()) to leave them unchanged, or stop training them with grad_req='null' "
                "(block.collect_params().setattr('grad_req', 'null'))")
        return use

    def _record(self, overflow):
        """One step's outcome: count it, adjust the scale, return whether it was skipped."""
        if not self.enabled:
            return False
        self.steps += 1
        self.last_step_skipped = overflow
        if overflow:
            self.skipped_at.append(self.steps)
            self._clean_steps = 0
            # An overflow counts towards divergence when it happened at the floor,
            # not when it merely brought the scale down to it.
            at_floor = (not self.dynamic) or self._scale <= self.min_scale
            if self.dynamic:
                self._overflows_left -= 1
                if self._overflows_left <= 0:
                    self._scale = max(self._scale * self.backoff_factor, self.min_scale)
                    self._overflows_left = self.hysteresis
            self._overflows_at_min = self._overflows_at_min + 1 if at_floor else 0
        else:
            self._overflows_at_min = 0
            self._overflows_left = self.hysteresis
            self._clean_steps += 1
            if self.dynamic and self._clean_steps >= self.growth_interval:
                self._scale = min(self._scale * self.growth_factor, self.max_scale)
                self._clean_steps = 0
        self.history.append(self._scale)
        if self._overflows_at_min >= self.max_overflows_at_min:
            raise LossScaleDivergedError(
                f"training has diverged: gradients overflowed on {self._overflows_at_min} "
                f"consecutive steps at loss scale {format_scale(self._scale)} (step {self.steps}). Lower "
                "the learning rate, enable --clip-grad-norm, or train in float32 to find the "
                "layer that blows up (mxfp16 diagnose).")
        return overflow

    def state_dict(self):
        """Plain numbers for the checkpoint, with a version field."""
        return dict({name: getattr(self, name) for name in self._CONFIG},
                    version=self.STATE_VERSION, scale=self._scale, clean_steps=self._clean_steps,
                    overflows_left=self._overflows_left, overflows_at_min=self._overflows_at_min,
                    steps=self.steps, skipped_steps=self.skipped_steps, skipped_at=list(self.skipped_at),
                    last_step_skipped=self.last_step_skipped, history=list(self.history))

    def load_state_dict(self, state):
        """Restore a :meth:`state_dict`, configuration included (``ValueError`` for another version or bad fields)."""
        version = state.get("version")
        if version != self.STATE_VERSION:
            raise ValueError(f"loss-scaler state version {version!r} is not {self.STATE_VERSION}; "
                             "it was written by another mxfp16 version")
        missing = [name for name in (*self._CONFIG, *self._COUNTERS, "scale", "last_step_skipped")
                   if name not in state]
        if missing:
            raise ValueError(f"loss-scaler state lacks field(s) {', '.join(missing)}")
        # Checked as the constructor checks its arguments, without converting: "false" is not False.
        self._check(*(state[name] for name in self._CONFIG))
        scale = state["scale"]
        if not is_positive_number(scale):
            raise ValueError(f"loss-scaler state has scale {scale!r}; a scale is a positive finite number")
        bad = [name for name in self._COUNTERS if not is_count(state[name], 0)]
        if bad or not isinstance(state["last_step_skipped"], bool):
            raise ValueError(f"loss-scaler state has malformed field(s) {', '.join(bad) or 'last_step_skipped'}")
        for name, kind in self._CONFIG.items():
            setattr(self, name, kind(state[name]))
        self._scale = float(scale)
        self._clean_steps, self._overflows_left, self._overflows_at_min, self.steps, skipped = (
            state[name] for name in self._COUNTERS)
        # The steps skipped, by this scaler's step count (from 1); a state written before they were
        # recorded keeps only its count.
        skipped_at = state.get("skipped_at")
        if skipped_at is not None and not (isinstance(skipped_at, list) and len(skipped_at) == skipped and all(
                is_count(n) and n <= self.steps for n in skipped_at)):
            raise ValueError("loss-scaler state has malformed field(s) skipped_at")
        self.skipped_at = list(skipped_at or [])
        self._earlier_skips = skipped - len(self.skipped_at)
        self.last_step_skipped = state["last_step_skipped"]
        self.history.clear()
        self.history.extend(float(s) for s in state.get("history", ()))
        self._end_step()

    def __repr__(self):
        if not self.enabled:
            return "LossScaler(enabled=False)"
        kind = "dynamic" if self.dynamic else "static"
        return f"LossScaler({kind}, scale={format_scale(self._scale)}, skipped_steps={self.skipped_steps})"


def parse_loss_scale(setting):
    """Read a loss-scale setting (the trainer's flags, :func:`make_loss_scaler`).

    Parameters
    ----------
    setting : str, float or None
        ``'dynamic'``, ``'none'`` / ``'off'`` (no scaling), a positive finite
        number (a static scale), or ``None`` (the precision's default).

    Returns
    -------
    'dynamic', 'none', float or None
    """
    if setting is None:
        return None
    text = setting.strip().lower() if isinstance(setting, str) else None
    if text in ("dynamic", "none", "off"):
        return "none" if text == "off" else text
    try:
        value = None if isinstance(setting, bool) else float(setting)  # True/False are not scales
    except ValueError:
        value = None
    if value is None or not (0 < value < float("inf")):
        raise ValueError(f"loss scale {setting!r}: use 'dynamic', 'none' (no scaling) or a positive number "
                         "such as 1024 (not 0, inf or nan)")
    return value


def make_loss_scaler(precision, setting=None, **options):
    """Build the scaler for a run: the precision's default, or a user setting.

    Parameters
    ----------
    precision : Precision
        From :func:`mxfp16.resolve_precision`.
    setting : str, float or None
        Anything :func:`parse_loss_scale` reads; ``None`` (the default) is
        the precision's: dynamic for float16 and amp-float16, none otherwise.
    **options
        Passed to :class:`LossScaler` (``growth_interval``, ``hysteresis`` ...).

    Returns
    -------
    LossScaler
    """
    if not isinstance(precision, Precision):
        swapped = " (the Precision came second: swap the two)" if isinstance(setting, Precision) else ""
        raise TypeError(f"make_loss_scaler(precision, setting=None) takes the resolved precision first, got "
                        f"{precision!r}{swapped}: write make_loss_scaler(precision) for the precision's default, "
                        "or make_loss_scaler(precision, 'dynamic' | 'none' | 1024)")
    value = parse_loss_scale(setting) or ("dynamic" if precision.loss_scaling else "none")
    settings = {"dynamic": {"dynamic": True}, "none": {"enabled": False}}
    return LossScaler(precision=precision, **settings.get(value, {"init_scale": value, "dynamic": False}), **options)

