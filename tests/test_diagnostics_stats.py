"""Gradient-range statistics against numpy float64 on known arrays."""
from mxfp16.diagnostics.stats import (
    LOG2_MAX,
    LOG2_MIN,
    MAX_LOG2_SCALE,
    MIN_LOG2_SCALE,
    RangeCollector,
    histogram_edges,
    log2_of_scale,
    total,
)
from mxfp16.float_formats import FLOAT16

import mxnet as mx
import numpy as np
import pytest

SCALES = [2.0 ** s for s in (MIN_LOG2_SCALE, 0, 3, 10, 16, 24, MAX_LOG2_SCALE)]


def _known_array(seed=0, n=20000):
    """Magnitudes over 2^-70..2^22 plus the awkward cases: zeros, inf, NaN, float32 subnormals, exact thresholds."""
    rng = np.random.default_rng(seed)
    x = rng.choice([-1.0, 1.0], n) * np.exp2(rng.uniform(-70, 22, n))
    x = x.astype(np.float32)
    x[:40] = 0.0
    x[40:45] = np.inf
    x[45:48] = -np.inf
    x[48:52] = np.nan
    x[52:60] = np.float32(1e-44)                               # float32 subnormal
    # Every resolvable scale's thresholds, exactly and one float32 step above.
    ks = np.arange(MIN_LOG2_SCALE, MAX_LOG2_SCALE + 1).astype(float)
    groups = [
        np.float32(FLOAT16.max) / np.exp2(ks),                 # exactly at the overflow threshold: not overflow
        np.nextafter(np.float32(FLOAT16.max) / np.exp2(ks).astype(np.float32), np.float32(np.inf)),
        np.float32(FLOAT16.smallest_subnormal) / np.exp2(ks),  # exactly the smallest subnormal: kept
        np.float32(FLOAT16.smallest_normal) / np.exp2(ks),
        np.exp2(np.arange(LOG2_MIN, LOG2_MAX)),                # binade edges
    ]
    edge_cases = np.concatenate(groups).astype(np.float32)
    x[60:60 + edge_cases.size] = edge_cases
    return x


def _reference(x, scale):
    """The definitions of stats.py, in float64 on the host."""
    a = np.abs(x.astype(np.float64))
    finite = np.isfinite(a)
    values = a[finite & (a > 0)] * scale
    return {
        "underflow": int((values < FLOAT16.smallest_subnormal).sum()),
        "subnormal": int(((values >= FLOAT16.smallest_subnormal) & (values < FLOAT16.smallest_normal)).sum()),
        "overflow": int((values > FLOAT16.max).sum()),
    }


def _collect(*batches, dtype="float32"):
    collector = RangeCollector()
    for x in batches:
        collector.add_batch([("g", "parameter", mx.nd.array(x, dtype=dtype))])
    return collector.stats[0]


def test_edges_increase_and_the_last_bin_excludes_infinity():
    edges = histogram_edges().astype(np.float64)
    assert np.all(np.diff(edges) > 0)
    assert np.isfinite(edges).all()


def test_counts_zeros_nonfinite_and_extremes_match_numpy():
    x = _known_array()
    stats = _collect(x)
    a = np.abs(x.astype(np.float64))
    finite = np.isfinite(a)
    assert stats.count == x.size
    assert stats.zeros == int((a == 0).sum())
    assert stats.nonfinite == int((~finite).sum())
    assert stats.nonzero == int((finite & (a > 0)).sum())
    assert stats.max_abs == a[finite].max()
    assert stats.min_nonzero == a[finite & (a > 0)].min()


def test_log2_histogram_matches_numpy_binades():
    x = _known_array(seed=1)
    exponents, counts, below, above = _collect(x).log2_histogram()
    a = np.abs(x.astype(np.float64))
    a = a[np.isfinite(a) & (a > 0)]
    k = np.floor(np.log2(a)).astype(int)    # exact in float64 for float32 inputs
    expected = np.array([(k == e).sum() for e in exponents])
    np.testing.assert_array_equal(counts, expected)
    assert below == int((k < LOG2_MIN).sum())
    assert above == int((k >= LOG2_MAX).sum())
    assert counts.sum() + below + above == a.size


@pytest.mark.parametrize("scale", SCALES)
def test_underflow_subnormal_overflow_counts_at_each_scale_match_numpy(scale):
    x = _known_array(seed=2)
    stats = _collect(x)
    assert stats.counts_at(scale) == _reference(x, scale)
    fractions = stats.fractions_at(scale)
    assert fractions["underflow"] == pytest.approx(_reference(x, scale)["underflow"] / stats.nonzero)


def test_batches_accumulate_like_one_concatenated_array():
    a, b = _known_array(seed=3, n=5000), _known_array(seed=4, n=7000)
    two = _collect(a, b)
    one = _collect(np.concatenate([a, b]))
    assert two.batches == 2 and one.batches == 1
    for name in ("count", "zeros", "nonfinite", "max_abs", "min_nonzero", "below", "above"):
        assert getattr(two, name) == getattr(one, name), name
    np.testing.assert_array_equal(two.binades, one.binades)


def test_float16_gradients_are_read_through_a_float32_copy():
    x = _known_array(seed=5).astype(np.float16)
    stats = _collect(x, dtype="float16")
    wide = x.astype(np.float32)
    for scale in (1.0, 1024.0):
        assert stats.counts_at(scale) == _reference(wide, scale)


def test_total_sums_tensors():
    a, b = _known_array(seed=6, n=3000), _known_array(seed=7, n=4000)
    collector = RangeCollector()
    collector.add_batch([("a", "parameter", mx.nd.array(a)), ("b", "activation", mx.nd.array(b))])
    combined = total(collector.stats)
    both = np.concatenate([a, b])
    assert combined.count == both.size
    assert combined.counts_at(64.0) == _reference(both, 64.0)


def test_one_host_copy_per_batch(monkeypatch):
    copies = []
    original = mx.nd.NDArray.asnumpy

    def counting(self):
        copies.append(self.shape)
        return original(self)

    monkeypatch.setattr(mx.nd.NDArray, "asnumpy", counting)
    monkeypatch.setattr(mx.nd.NDArray, "asscalar", lambda self: pytest.fail("asscalar syncs the host"))
    tensors = [(f"t{i}", "parameter", mx.nd.array(_known_array(seed=i, n=500))) for i in range(6)]
    collector = RangeCollector()
    collector.add_batch(tensors)
    assert len(copies) == 1
    assert len(collector.stats) == 6


@pytest.mark.parametrize("bad", [1000.0, 3.0, 0.0, -8.0, float("inf"), 2.0 ** (MAX_LOG2_SCALE + 1),
                                 2.0 ** (MIN_LOG2_SCALE - 1)])
def test_scales_that_are_not_resolvable_powers_of_two_are_refused(bad):
    with pytest.raises(ValueError, match="loss scale"):
        log2_of_scale(bad)


def test_log2_of_scale_accepts_powers_of_two():
    for s in range(MIN_LOG2_SCALE, MAX_LOG2_SCALE + 1):
        assert log2_of_scale(2.0 ** s) == s
