"""The loss-scale recommendation on synthetic gradients with a known maximum."""
import math

from mxfp16.diagnostics import RangeCollector, recommend_loss_scale
from mxfp16.float_formats import FLOAT16

import mxnet as mx
import numpy as np
import pytest


def _stats(values):
    collector = RangeCollector()
    collector.add_batch([("g", "parameter", mx.nd.array(np.asarray(values, dtype=np.float32)))])
    return collector.stats[0]


def _gradients(largest, seed=0):
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal(4000) * np.exp2(rng.uniform(-40, 0, 4000))).astype(np.float32)
    g = np.clip(g, -largest / 2, largest / 2)
    g[7] = largest
    return g


def _largest_allowed_log2(largest, margin):
    """Brute force: the largest s with largest * 2**s * margin <= FLOAT16.max."""
    return max(s for s in range(-60, 60) if largest * 2.0 ** s * margin <= FLOAT16.max)


@pytest.mark.parametrize("largest,margin", [(3.0, 8.0), (1e-3, 2.0), (0.37, 1.0), (250.0, 8.0), (4e-2, 8.0)])
def test_scale_is_the_largest_power_of_two_under_the_margin(largest, margin):
    g = _gradients(largest)
    rec = recommend_loss_scale(_stats(g), margin=margin)
    assert rec.max_abs == pytest.approx(float(np.float32(largest)))
    assert rec.scale == 2.0 ** _largest_allowed_log2(float(np.float32(largest)), margin)
    assert rec.limited_by == "largest gradient"
    assert rec.overflow_at_scale == 0.0
    a = np.abs(g.astype(np.float64))
    nonzero = a[a > 0]
    assert rec.underflow_at_1 == pytest.approx((nonzero < FLOAT16.smallest_subnormal).mean())
    assert rec.underflow_at_scale == pytest.approx((nonzero * rec.scale < FLOAT16.smallest_subnormal).mean())


def test_a_gradient_exactly_on_the_limit_is_allowed_and_just_above_it_is_not():
    margin = 8.0
    on_limit = FLOAT16.max / (margin * 2.0 ** 10)          # exact in float32: 65504 has 11 significant bits
    assert recommend_loss_scale(_stats([on_limit, 1e-9]), margin=margin).scale == 2.0 ** 10
    above = float(np.nextafter(np.float32(on_limit), np.float32(np.inf)))
    assert recommend_loss_scale(_stats([above, 1e-9]), margin=margin).scale == 2.0 ** 9


def test_a_larger_margin_never_gives_a_larger_scale():
    stats = _stats(_gradients(0.5))
    scales = [recommend_loss_scale(stats, margin=m).scale for m in (1, 2, 8, 64)]
    assert scales == sorted(scales, reverse=True)
    assert scales[0] / scales[-1] == 64


def test_small_gradients_stop_at_the_ceiling():
    rec = recommend_loss_scale(_stats([1e-12, -3e-13]), margin=8.0, max_scale=2.0 ** 24)
    assert rec.scale == 2.0 ** 24 and rec.limited_by == "scale ceiling"


def test_all_zero_gradients_get_the_ceiling():
    rec = recommend_loss_scale(_stats(np.zeros(10)), max_scale=2.0 ** 12)
    assert rec.scale == 2.0 ** 12 and rec.limited_by == "no non-zero gradients"
    assert rec.underflow_at_1 == 0.0


def test_gradients_too_large_even_for_scale_one_get_a_scale_below_one():
    rec = recommend_loss_scale(_stats([20000.0, 1.0]), margin=8.0)
    assert rec.scale < 1.0
    assert 20000.0 * rec.scale * 8.0 <= FLOAT16.max
    assert rec.log2_scale == math.log2(rec.scale)


def test_a_margin_below_one_is_refused():
    with pytest.raises(ValueError, match="margin"):
        recommend_loss_scale(_stats([1.0]), margin=0.5)
