"""Loss scaling: keep small float16 gradients from flushing to zero.

The loss is multiplied by a scale S before backward, so every gradient is S
times larger and lands inside float16's range; the optimizer divides S back
out (``trainer.update(batch_size * S)``). A *dynamic* scaler starts high, backs
off whenever a gradient overflows (and that step is skipped), and grows again
after a run of clean steps.
"""
import math
from collections import deque

from .float_formats import format_scale

__all__ = ["LossScaler", "LossScaleDivergedError", "make_loss_scaler", "parse_loss_scale"]


class LossScaleDivergedError(FloatingPointError):
    """Gradients overflow even at the minimum loss scale: training has diverged."""


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
        Consecutive overflowing steps tolerated before backing off (each of
        them is still skipped). 1 backs off on every overflow.
    min_scale, max_scale : float, default 1.0 and 2**24
        Clamps for the dynamic scale.
    dynamic : bool, default True
        ``False`` keeps ``init_scale`` fixed (overflowing steps are still
        skipped).
    enabled : bool, default True
        ``False`` makes a true no-op: scale 1, nothing checked, nothing
        skipped, so one training step serves every precision.
    max_overflows_at_min : int, default 50
        Consecutive overflowing steps at the minimum scale (or at the fixed
        scale of a static scaler) after which :meth:`update` raises
        :class:`LossScaleDivergedError` instead of skipping forever.
    history_size : int, default 1000
        How many recent scales :attr:`history` keeps.

    Attributes
    ----------
    skipped_at : list of int
        The steps skipped, numbered by :attr:`steps` (from 1). In the trainer
        the scaler sees every step, so these are the run's global step
        numbers; :attr:`skipped_steps` counts them. The trainer keeps no count
        of its own.
    """

    STATE_VERSION = 1
    _COUNTERS = ("clean_steps", "overflows_left", "overflows_at_min", "steps", "skipped_steps")
    _CONFIG = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "hysteresis",
               "min_scale", "max_scale", "dynamic", "enabled", "max_overflows_at_min")

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, hysteresis=1, min_scale=1.0, max_scale=2.0 ** 24,
                 dynamic=True, enabled=True, max_overflows_at_min=50, history_size=1000):
        self._check(init_scale, growth_factor, backoff_factor, growth_interval, hysteresis, min_scale, max_scale,
                    dynamic, enabled, max_overflows_at_min)
        self.init_scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.hysteresis = int(hysteresis)
        self.min_scale = float(min_scale)
        self.max_scale = float(max_scale)
        self.dynamic = bool(dynamic)
        self.enabled = bool(enabled)
        self.max_overflows_at_min = int(max_overflows_at_min)
        self.history = deque(maxlen=history_size)
        self._reset()

    @staticmethod
    def _check(init_scale, growth_factor, backoff_factor, growth_interval, hysteresis, min_scale, max_scale,
               dynamic, enabled, max_overflows_at_min):
        """Refuse settings that would make the scale meaningless (nan and inf compare False with everything)."""
        finite = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                     for v in (init_scale, growth_factor, backoff_factor, min_scale, max_scale))
        if not finite or not (init_scale > 0 and min_scale > 0 and max_scale >= min_scale):
            raise ValueError("loss scales must be positive finite numbers with min_scale <= max_scale, got "
                             f"init_scale={init_scale!r}, min_scale={min_scale!r}, max_scale={max_scale!r}")
        if not (growth_factor > 1.0 and 0.0 < backoff_factor < 1.0):
            raise ValueError("growth_factor must be > 1 and backoff_factor in (0, 1)")
        counts = (growth_interval, hysteresis, max_overflows_at_min)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in counts):
            raise ValueError("growth_interval, hysteresis and max_overflows_at_min must be whole numbers >= 1")
        for name, value in (("dynamic", dynamic), ("enabled", enabled)):
            if not isinstance(value, bool):  # "no" and "false" are truthy strings
                raise ValueError(f"{name} must be True or False, got {value!r}")

    def _reset(self):
        self._scale = min(max(self.init_scale, self.min_scale), self.max_scale) if self.dynamic else self.init_scale
        self._clean_steps = 0            # consecutive clean steps since the last growth or overflow
        self._overflows_left = self.hysteresis
        self._overflows_at_min = 0
        self.steps = 0
        self.skipped_at = []
        self._earlier_skips = 0  # skips restored from a state that did not record their steps
        self.last_step_skipped = False
        self.history.clear()

    @property
    def skipped_steps(self):
        """How many steps were skipped: the one count of skipped steps (the trainer reads it too)."""
        return self._earlier_skips + len(self.skipped_at)

    @property
    def scale(self):
        """The scale to multiply the loss by now (1.0 when disabled)."""
        return self._scale if self.enabled else 1.0

    @property
    def checks_overflow(self):
        """Whether the step must check gradients for inf/NaN (costs one host sync)."""
        return self.enabled

    def update(self, overflow):
        """Record one step's outcome and adjust the scale.

        Parameters
        ----------
        overflow : bool
            Whether any (reduced) gradient was inf or NaN.

        Returns
        -------
        bool
            ``True`` when the step must be skipped.

        Raises
        ------
        LossScaleDivergedError
            After ``max_overflows_at_min`` consecutive overflows at the
            minimum (or static) scale.
        """
        if not self.enabled:
            return False
        self.steps += 1
        if overflow:
            self.skipped_at.append(self.steps)
            self.last_step_skipped = True
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
            self.history.append(self._scale)
            if self._overflows_at_min >= self.max_overflows_at_min:
                raise LossScaleDivergedError(
                    f"training has diverged: gradients overflowed on {self._overflows_at_min} "
                    f"consecutive steps at loss scale {format_scale(self._scale)} (step {self.steps}). Lower "
                    "the learning rate, enable --clip-grad-norm, or train in float32 to find the "
                    "layer that blows up (mxfp16 diagnose)."
                )
            return True
        self.last_step_skipped = False
        self._overflows_at_min = 0
        self._overflows_left = self.hysteresis
        self._clean_steps += 1
        if self.dynamic and self._clean_steps >= self.growth_interval:
            self._scale = min(self._scale * self.growth_factor, self.max_scale)
            self._clean_steps = 0
        self.history.append(self._scale)
        return False

    def state_dict(self):
        """Plain numbers for the checkpoint, with a version field."""
        state = {name: getattr(self, name) for name in self._CONFIG}
        state.update(
            version=self.STATE_VERSION, scale=self._scale, clean_steps=self._clean_steps,
            overflows_left=self._overflows_left, overflows_at_min=self._overflows_at_min,
            steps=self.steps, skipped_steps=self.skipped_steps, skipped_at=list(self.skipped_at),
            last_step_skipped=self.last_step_skipped, history=list(self.history),
        )
        return state

    def load_state_dict(self, state):
        """Restore a :meth:`state_dict`, configuration included.

        Raises
        ------
        ValueError
            For a missing or newer version, or missing fields.
        """
        version = state.get("version")
        if version != self.STATE_VERSION:
            raise ValueError(f"loss-scaler state version {version!r} is not {self.STATE_VERSION}; "
                             "it was written by another mxfp16 version")
        missing = [name for name in self._CONFIG + self._COUNTERS + ("scale", "last_step_skipped")
                   if name not in state]
        if missing:
            raise ValueError(f"loss-scaler state lacks field(s) {', '.join(missing)}")
        # Checked as the constructor checks its arguments, without converting: "false" is not False.
        self._check(*(state[name] for name in self._CONFIG))
        scale = state["scale"]
        if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"loss-scaler state has scale {scale!r}; a scale is a positive finite number")
        bad = [name for name in self._COUNTERS
               if not (isinstance(state[name], int) and not isinstance(state[name], bool) and state[name] >= 0)]
        if bad or not isinstance(state["last_step_skipped"], bool):
            raise ValueError(f"loss-scaler state has malformed field(s) {', '.join(bad) or 'last_step_skipped'}")
        for name in self._CONFIG:
            setattr(self, name, state[name] if isinstance(state[name], bool) else type(getattr(self, name))(state[name]))
        self._scale = float(scale)
        self._clean_steps, self._overflows_left, self._overflows_at_min, self.steps, skipped = (
            state[name] for name in self._COUNTERS)
        # The steps skipped, by this scaler's step count (from 1); a state written before they were
        # recorded keeps only its count.
        skipped_at = state.get("skipped_at")
        if skipped_at is not None and not (isinstance(skipped_at, list) and len(skipped_at) == skipped and all(
                isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= self.steps for n in skipped_at)):
            raise ValueError("loss-scaler state has malformed field(s) skipped_at")
        self.skipped_at = list(skipped_at or [])
        self._earlier_skips = skipped - len(self.skipped_at)
        self.last_step_skipped = state["last_step_skipped"]
        self.history.clear()
        self.history.extend(float(s) for s in state.get("history", ()))

    def __repr__(self):
        if not self.enabled:
            return "LossScaler(enabled=False)"
        kind = "dynamic" if self.dynamic else "static"
        return f"LossScaler({kind}, scale={format_scale(self._scale)}, skipped_steps={self.skipped_steps})"


def parse_loss_scale(setting):
    """Read a loss-scale setting; the one parser the trainer's flags and :func:`make_loss_scaler` share.

    Parameters
    ----------
    setting : str, float or None
        ``'dynamic'``, ``'none'`` / ``'off'`` (no scaling), a positive finite
        number (a static scale), or ``None`` (the precision's default).

    Returns
    -------
    'dynamic', 'none', float or None
        ``None`` only for ``None``.

    Raises
    ------
    ValueError
        Anything else, naming the accepted forms.
    """
    if setting is None:
        return None
    if isinstance(setting, str):
        text = setting.strip().lower()
        if text in ("dynamic", "none"):
            return text
        if text == "off":
            return "none"
        try:
            value = float(text)
        except ValueError:
            value = None
    elif isinstance(setting, bool):
        value = None  # True/False are not scales
    else:
        value = float(setting)
    if value is None or not (0 < value < float("inf")):
        raise ValueError(f"loss scale {setting!r}: use 'dynamic', 'none' (no scaling) or a positive number "
                         "such as 1024 (not 0, inf or nan)")
    return value


def make_loss_scaler(setting, precision, **options):
    """Build the scaler for a run from a user setting.

    Parameters
    ----------
    setting : str, float or None
        Anything :func:`parse_loss_scale` reads; ``None`` is the precision's
        default (dynamic for float16 and amp-float16, none otherwise).
    precision : Precision
    **options
        Passed to :class:`LossScaler` (``growth_interval``, ``hysteresis`` ...).

    Returns
    -------
    LossScaler
    """
    value = parse_loss_scale(setting)
    if value is None:
        value = "dynamic" if precision.loss_scaling else "none"
    if value == "dynamic":
        return LossScaler(dynamic=True, **options)
    if value == "none":
        return LossScaler(enabled=False, **options)
    return LossScaler(init_scale=value, dynamic=False, **options)
