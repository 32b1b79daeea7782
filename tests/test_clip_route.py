"""``clip`` as ``maximum(minimum(x, a_max), a_min)`` under mxfp16's bfloat16 lists (mxfp16/amp/clip.py).

MXNet 1.9.1's own ``clip`` (MobileNet's ReLU6) and its backward were most of MobileNet v2's step. The route must
give the same values and the same gradient, ties at either bound included (``clip`` passes the gradient where
``a_min <= x <= a_max``). Which operators the graph then holds, and in which dtype, is checked from the typed
graphs in tests/test_amp_routes.py; here the arithmetic, in float32 on any CPU, against numpy in float64.
"""
from mxfp16.amp.clip import clip_as_minimum_maximum

import mxnet as mx
import numpy as np
import pytest

ROUTE = clip_as_minimum_maximum(mx.nd.clip)


def _values_and_grad(clip, x, head, *args, **kwargs):
    data = mx.nd.array(x)
    data.attach_grad()
    with mx.autograd.record():
        out = clip(data, *args, **kwargs)
    out.backward(mx.nd.array(head))
    return out.asnumpy(), data.grad.asnumpy()


@pytest.mark.parametrize("shape, low, high", [((4, 6, 5, 5), 0.0, 6.0), ((3, 7), -1.0, 1.0), ((50,), 0.5, 0.75)])
def test_the_route_is_clip_forward_and_backward_with_ties_at_both_bounds(shape, low, high):
    rng = np.random.RandomState(0)
    x = rng.uniform(low - 2, high + 2, shape)
    x.flat[:4] = [low, high, low, high]  # ties: the gradient passes there
    x = x.astype(np.float32)
    head = rng.standard_normal(shape).astype(np.float32)
    exact = np.clip(x.astype(np.float64), low, high)
    passes = (x >= low) & (x <= high)
    for clip, args, kwargs in ((mx.nd.clip, (low, high), {}), (ROUTE, (low, high), {}),
                               (ROUTE, (), {"a_min": low, "a_max": high})):
        values, grad = _values_and_grad(clip, x, head, *args, **kwargs)
        np.testing.assert_array_equal(values, exact.astype(np.float32))
        np.testing.assert_array_equal(grad, np.where(passes, head, 0))


def test_a_call_the_route_does_not_take_is_clips_own():
    x = mx.nd.array([-1.0, 3.0, 9.0])
    out = mx.nd.zeros((3,))
    ROUTE(x, 0, 6, out=out)  # into out=: MXNet's clip writes it
    np.testing.assert_array_equal(out.asnumpy(), [0.0, 3.0, 6.0])
    with pytest.raises(mx.MXNetError):
        ROUTE(x, 0)  # without a_max: clip's own error
    assert ROUTE.__name__ == "clip"
