"""Where gradients fall in float16's range: device-side histograms, host-side totals.

Each gradient is summarised by one histogram of its magnitudes: zeros, values below ``2**LOG2_MIN``, each binade
``[2**k, 2**(k+1))`` below ``2**LOG2_MAX`` split in two at the float32 number just above ``FLOAT16.max * 2**(k - 15)``,
and values above. A loss scale ``2**s`` moves every value ``s`` binades up, so the underflow, subnormal and overflow
counts at any power-of-two scale are sums of whole bins: exact, with no second pass. docs/diagnostics.md ("Definitions
and limits") defines them.
"""
import functools
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .._lazy import module
from ..float_formats import FLOAT16, FLOAT32

mx = module("mxnet")

__all__ = ["LOG2_MIN", "LOG2_MAX", "MIN_LOG2_SCALE", "MAX_LOG2_SCALE", "RangeStats", "RangeCollector",
           "log2_of_scale", "histogram_edges", "total"]

#: Binades ``[2**k, 2**(k+1))`` with ``LOG2_MIN <= k < LOG2_MAX`` get their own bins.
LOG2_MIN, LOG2_MAX = -64, 20


def _exact_log2(value):
    exponent = int(np.log2(value))
    if 2.0 ** exponent != value:
        raise ValueError(f"{value} is not a power of two")
    return exponent


# float16's thresholds as binade numbers, read from mxfp16.float_formats.
_FLUSH = _exact_log2(FLOAT16.smallest_subnormal)       # -24
_NORMAL = _exact_log2(FLOAT16.smallest_normal)         # -14
_TOP = int(np.floor(np.log2(FLOAT16.max)))             # 15: FLOAT16.max lies in [2**15, 2**16)

#: The loss scales the bins resolve exactly (flush threshold above 2**LOG2_MIN, overflow threshold below 2**LOG2_MAX).
MIN_LOG2_SCALE, MAX_LOG2_SCALE = _TOP + 1 - LOG2_MAX, _FLUSH - LOG2_MIN

_BINADES = LOG2_MAX - LOG2_MIN
# Layout of one summary row: histogram bins, then max |g|, then min non-zero |g|.
_ZERO, _BELOW = 0, 1
_ABOVE = 2 + 2 * _BINADES
_NBINS = _ABOVE + 1
_WIDTH = _NBINS + 2
_F32_MAX = np.float32(FLOAT32.max)


def histogram_edges():
    """The float32 bin edges of :func:`_device_summary` (``_NBINS + 1`` values, increasing).

    The last bin is closed (as in ``numpy.histogram``) and ends at float32's largest value, so inf and NaN fall outside.
    """
    ks = np.arange(LOG2_MIN, LOG2_MAX)
    starts = np.ldexp(np.float32(1), ks).astype(np.float32)
    # |g| * 2**s > FLOAT16.max  <=>  |g| >= nextafter(FLOAT16.max * 2**-s) for float32 |g|
    splits = np.nextafter(np.ldexp(np.float32(FLOAT16.max), ks - _TOP).astype(np.float32), np.float32(np.inf))
    middle = np.stack([starts, splits], axis=1).reshape(-1)
    head = np.array([0.0, np.finfo(np.float32).smallest_subnormal], dtype=np.float32)
    tail = np.array([2.0 ** LOG2_MAX, _F32_MAX], dtype=np.float32)
    return np.concatenate([head, middle, tail])


def log2_of_scale(scale):
    """The exponent ``s`` of a loss scale ``2**s``; a clear error for anything else.

    Raises
    ------
    ValueError
        ``scale`` is not a power of two, or outside ``2**MIN_LOG2_SCALE .. 2**MAX_LOG2_SCALE``.
    """
    scale = float(scale)
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"loss scale {scale!r} must be a positive power of two, e.g. 1024")
    mantissa, exponent = np.frexp(scale)
    if mantissa != 0.5:
        nearest = 2.0 ** round(np.log2(scale))
        raise ValueError(f"loss scale {scale:g} is not a power of two (loss scales are, so multiplying by them is "
                         f"exact); use {nearest:g}")
    s = int(exponent) - 1
    if not MIN_LOG2_SCALE <= s <= MAX_LOG2_SCALE:
        raise ValueError(f"loss scale 2**{s} is outside the range the statistics resolve, "
                         f"2**{MIN_LOG2_SCALE} to 2**{MAX_LOG2_SCALE}")
    return s


@functools.lru_cache(maxsize=None)
def _edges_on(ctx):
    return mx.nd.array(histogram_edges(), ctx=ctx, dtype="float32")


def _device_summary(array):
    """``array``'s (any dtype, read through a float32 copy) bin counts of ``|array|`` over :func:`histogram_edges`,
    then its largest finite and smallest non-zero finite ``|value|`` (inf when none): float64, on its device."""
    if isinstance(array, mx.np.ndarray):
        array = array.as_nd_ndarray()
    magnitude = array.reshape((-1,)).astype("float32").abs()
    counts, _ = mx.nd.histogram(magnitude, bins=_edges_on(array.context))
    finite = magnitude <= _F32_MAX          # False for inf and NaN
    largest = mx.nd.where(finite, magnitude, mx.nd.zeros_like(magnitude)).max()
    usable = finite * (magnitude > 0)
    smallest = mx.nd.where(usable, magnitude, mx.nd.ones_like(magnitude) * np.inf).min()
    return mx.nd.concat(counts.astype("float64"), largest.reshape((1,)).astype("float64"),
                        smallest.reshape((1,)).astype("float64"), dim=0)


@dataclass
class RangeStats:
    """Magnitude statistics of one tensor (or of several), summed over batches.

    Attributes
    ----------
    name : str
    kind : str
        ``'parameter'``, ``'activation'`` (the gradient at a layer's output) or ``'total'``.
    count : int
        Elements seen, over all batches.
    zeros, nonfinite : int
        Exact zeros; inf and NaN.
    max_abs : float
        Largest finite magnitude (0.0 when there is none).
    min_nonzero : float
        Smallest non-zero finite magnitude (inf when there is none).
    below, above : int
        Non-zero magnitudes under ``2**LOG2_MIN``; finite ones of ``2**LOG2_MAX`` or more.
    binades : numpy.ndarray
        int64, shape ``(LOG2_MAX - LOG2_MIN, 2)``: row ``k - LOG2_MIN`` counts ``[2**k, split_k)`` and
        ``[split_k, 2**(k+1))``.
    batches : int
        Batches summed in.
    """

    name: str
    kind: str
    count: int = 0
    zeros: int = 0
    nonfinite: int = 0
    max_abs: float = 0.0
    min_nonzero: float = float("inf")
    below: int = 0
    above: int = 0
    binades: np.ndarray = field(default_factory=lambda: np.zeros((_BINADES, 2), dtype=np.int64))
    batches: int = 0

    @property
    def nonzero(self):
        """Non-zero finite values: the denominator of every fraction."""
        return self.count - self.zeros - self.nonfinite

    def add_summary(self, row, size):
        """Add one :func:`_device_summary` row (as numpy) of a tensor with ``size`` elements."""
        counts = np.rint(row[:_NBINS]).astype(np.int64)
        self.count += int(size)
        self.zeros += int(counts[_ZERO])
        self.nonfinite += int(size) - int(counts.sum())
        self.below += int(counts[_BELOW])
        self.above += int(counts[_ABOVE])
        self.binades += counts[2:_ABOVE].reshape(_BINADES, 2)
        self.max_abs = max(self.max_abs, float(row[_NBINS]))
        self.min_nonzero = min(self.min_nonzero, float(row[_NBINS + 1]))

    def merge(self, other):
        """Add another :class:`RangeStats` into this one (for totals)."""
        for name in ("count", "zeros", "nonfinite", "below", "above"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.binades = self.binades + other.binades
        self.max_abs = max(self.max_abs, other.max_abs)
        self.min_nonzero = min(self.min_nonzero, other.min_nonzero)
        self.batches = max(self.batches, other.batches)
        return self

    def log2_histogram(self):
        """Non-zero finite values per binade.

        Returns
        -------
        (numpy.ndarray, numpy.ndarray, int, int)
            Lower exponents ``k``, the count of ``[2**k, 2**(k+1))`` for each, then the counts below ``2**LOG2_MIN``
            and at ``2**LOG2_MAX`` or above.
        """
        return np.arange(LOG2_MIN, LOG2_MAX), self.binades.sum(axis=1), self.below, self.above

    def counts_at(self, scale):
        """Underflow, subnormal and overflow counts if the values were multiplied by ``scale``.

        Parameters
        ----------
        scale : float
            A power of two (see :func:`log2_of_scale`).

        Returns
        -------
        dict
            ``{'underflow': int, 'subnormal': int, 'overflow': int}``.
        """
        s = log2_of_scale(scale)
        flush = _FLUSH - s - LOG2_MIN          # first binade that survives
        normal = _NORMAL - s - LOG2_MIN        # first normal binade
        top = _TOP - s - LOG2_MIN              # binade holding the overflow threshold
        per_binade = self.binades.sum(axis=1)
        return {
            "underflow": int(self.below + per_binade[:flush].sum()),
            "subnormal": int(per_binade[flush:normal].sum()),
            "overflow": int(self.binades[top, 1] + per_binade[top + 1:].sum() + self.above),
        }

    def fractions_at(self, scale):
        """:meth:`counts_at` as fractions of the non-zero finite values (0.0 when there are none)."""
        counts = self.counts_at(scale)
        return {k: (v / self.nonzero if self.nonzero else 0.0) for k, v in counts.items()}

    def as_dict(self, scales=()):
        """JSON-ready: the counts, the log2 histogram and the fractions at each of ``scales``."""
        exponents, counts, below, above = self.log2_histogram()
        return {
            "name": self.name, "kind": self.kind, "batches": self.batches,
            "count": self.count, "zeros": self.zeros, "nonfinite": self.nonfinite, "nonzero": self.nonzero,
            "max_abs": self.max_abs, "min_nonzero": self.min_nonzero if np.isfinite(self.min_nonzero) else None,
            "log2_histogram": {"lower_exponents": exponents.tolist(), "counts": counts.tolist(),
                               "below": below, "above": above},
            "at_scale": {f"{float(s):g}": dict(self.fractions_at(s), **{f"{k}_count": v
                                                                      for k, v in self.counts_at(s).items()})
                         for s in scales},
        }


def total(stats, name="all", kind="total"):
    """One :class:`RangeStats` summing ``stats``."""
    result = RangeStats(name, kind)
    for item in stats:
        result.merge(item)
    return result


class RangeCollector:
    """Accumulates :class:`RangeStats` per named tensor, one host sync per batch (:meth:`add_batch`)."""

    def __init__(self):
        self._stats = OrderedDict()

    @property
    def stats(self):
        """The :class:`RangeStats` seen so far, in first-seen order."""
        return list(self._stats.values())

    def add_batch(self, tensors):
        """Summarise one batch's tensors on their devices and copy the result to the host once.

        Parameters
        ----------
        tensors : iterable of (str, str, NDArray)
            ``(name, kind, array)``; a name seen twice in a batch (a layer called twice) sums into one
            :class:`RangeStats`.
        """
        tensors = [(name, kind, array) for name, kind, array in tensors if array.size]
        if not tensors:
            return
        home = tensors[0][2].context
        rows = [_device_summary(array).as_in_context(home) for _, _, array in tensors]
        table = mx.nd.concat(*rows, dim=0).asnumpy().reshape(len(rows), _WIDTH)  # the one host sync
        for (name, kind, array), row in zip(tensors, table):
            self._stats.setdefault((kind, name), RangeStats(name, kind)).add_summary(row, array.size)
        for key in {(kind, name) for name, kind, _ in tensors}:
            self._stats[key].batches += 1
