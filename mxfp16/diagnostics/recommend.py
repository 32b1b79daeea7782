"""A static loss scale read off the measured gradient range (docs/diagnostics.md gives the rule and the margin)."""
import math
from dataclasses import asdict, dataclass

from ..float_formats import FLOAT16
from .stats import MAX_LOG2_SCALE, MIN_LOG2_SCALE

__all__ = ["DEFAULT_MARGIN", "Recommendation", "recommend_loss_scale"]

DEFAULT_MARGIN = 8.0


@dataclass(frozen=True)
class Recommendation:
    """The recommended loss scale and what it changes.

    Attributes
    ----------
    scale : float
        A power of two.
    margin : float
        ``max_abs * scale * margin <= FLOAT16.max`` holds.
    max_abs : float
        The largest finite gradient magnitude seen.
    limited_by : str
        ``'largest gradient'``, ``'scale ceiling'`` (``max_scale``) or ``'no non-zero gradients'``.
    underflow_at_1, underflow_at_scale : float
        Fraction of non-zero gradients that underflow in float16 without scaling and at ``scale``.
    subnormal_at_1, subnormal_at_scale : float
        Fraction landing in float16's subnormal range (reduced precision).
    overflow_at_scale : float
        Fraction that would exceed ``FLOAT16.max`` at ``scale`` (0 unless the floor of the scale range was hit).
    """

    scale: float
    margin: float
    max_abs: float
    limited_by: str
    underflow_at_1: float
    underflow_at_scale: float
    subnormal_at_1: float
    subnormal_at_scale: float
    overflow_at_scale: float

    @property
    def log2_scale(self):
        return int(round(math.log2(self.scale)))

    def as_dict(self):
        return dict(asdict(self), log2_scale=self.log2_scale)


def recommend_loss_scale(stats, margin=DEFAULT_MARGIN, max_scale=2.0 ** 24):
    """The largest power-of-two loss scale keeping the largest gradient ``margin`` times under float16's max.

    Parameters
    ----------
    stats : RangeStats
        Usually :func:`mxfp16.diagnostics.stats.total` of every gradient.
    margin : float
        Safety factor, at least 1.
    max_scale : float
        Ceiling (a power of two), as the loss scaler's (2**24).

    Returns
    -------
    Recommendation
    """
    if not margin >= 1.0:
        raise ValueError(f"margin {margin!r} must be at least 1 (it divides the headroom under float16's max)")
    ceiling = min(int(round(math.log2(max_scale))), MAX_LOG2_SCALE)
    if stats.max_abs > 0:
        # frexp avoids log2 rounding: m in [0.5, 1), so 2**s * max_abs * margin <= max for s = floor(log2(max/(..)))
        s = math.frexp(FLOAT16.max / (stats.max_abs * margin))[1] - 1
        while stats.max_abs * margin * 2.0 ** s > FLOAT16.max:
            s -= 1
        limited_by = "largest gradient" if s <= ceiling else "scale ceiling"
    else:
        s, limited_by = ceiling, "no non-zero gradients"
    s = max(MIN_LOG2_SCALE, min(s, ceiling))
    scale = 2.0 ** s
    at_1, at_scale = stats.fractions_at(1.0), stats.fractions_at(scale)
    return Recommendation(scale=scale, margin=float(margin), max_abs=stats.max_abs, limited_by=limited_by,
                          underflow_at_1=at_1["underflow"], underflow_at_scale=at_scale["underflow"],
                          subnormal_at_1=at_1["subnormal"], subnormal_at_scale=at_scale["subnormal"],
                          overflow_at_scale=at_scale["overflow"])
