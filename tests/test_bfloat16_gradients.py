"""Bfloat16 gradients (of ``mxfp16.amp.bfloat16_deconvolution``'s layers) through the loss scaler's seams.

MXNet 1.9.1 has no bfloat16 kernels for ``multi_all_finite`` or for multiplying arrays, and summing micro-batches in
bfloat16 would round each one's share. The overflow check and the clipping work in float32 here, checked against
numpy in float64, on any CPU (only casts run in bfloat16); accumulation in a child, where the CPU has bfloat16
arithmetic.
"""
import json

from mxfp16.float_formats import BFLOAT16
from mxfp16.gradients import clip_global_norm_, grads_are_finite

import mxnet as mx
import numpy as np
import pytest
from conftest import requires_bfloat16, run_python


def bf16(values):
    return mx.nd.amp_cast(mx.nd.array(values, dtype="float32"), dtype=BFLOAT16)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_bfloat16_gradient_is_found_beside_float32_ones(bad):
    finite = [bf16([1.0, -2.5]), mx.nd.array([3.0])]
    assert grads_are_finite(finite).asnumpy()[0] == 1.0
    assert grads_are_finite(finite + [bf16([0.5, bad])]).asnumpy()[0] == 0.0


def test_clipping_scales_bfloat16_gradients_in_place_by_the_float32_factor():
    values, other = np.array([3.0, -4.0, 0.5], dtype=np.float32), np.array([12.0], dtype=np.float32)
    grad, plain = bf16(values), mx.nd.array(other)
    scale, max_norm = 2.0, 1.5
    norm = float(clip_global_norm_([grad, plain], max_norm, scale=scale).asnumpy()[0])
    expected = np.sqrt((values.astype(np.float64) ** 2).sum() + (other.astype(np.float64) ** 2).sum()) / scale
    assert norm == pytest.approx(expected, rel=1e-6)
    factor = max_norm / (expected + 1e-6)
    assert grad.dtype == BFLOAT16
    np.testing.assert_allclose(grad.astype("float32").asnumpy(), values * factor, rtol=2 ** -8)  # one rounding
    np.testing.assert_allclose(plain.asnumpy(), other * factor, rtol=1e-6)


#: Two micro-batches accumulated through the scaler against the two gradients taken one at a time (learning rate 0,
#: so the weights stay): the sum must be the float32 sum rounded to bfloat16 once. Then one step clipped to a global
#: norm of 1e-3. Prints one JSON line.
ACCUMULATE = r"""
import json
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
import mxfp16
from mxfp16.amp import bfloat16_deconvolution
from mxfp16.float_formats import BFLOAT16

mixed = mxfp16.MixedPrecision("amp-bfloat16", ctx=mx.cpu())
net = gluon.nn.HybridSequential(prefix="g_")
with net.name_scope():
    net.add(gluon.nn.Conv2DTranspose(16, 4, 1, 0, use_bias=False), gluon.nn.Activation("relu"),
            gluon.nn.Conv2DTranspose(3, 4, 2, 1))
net.initialize(mx.init.Normal(0.05), ctx=mx.cpu())
net(mx.nd.zeros((1, 8, 1, 1)))
bfloat16_deconvolution(net)
net.hybridize()
trainer = mixed.prepare(net, "sgd", {"learning_rate": 0.0})
rng = np.random.RandomState(0)
batches = [(mx.nd.array(rng.standard_normal((2, 8, 1, 1))), mx.nd.array(rng.uniform(-1, 1, (2, 3, 8, 8))))
           for _ in range(2)]
weight = net[0].weight

def gradient(micro):
    for x, y in micro:
        with autograd.record():
            loss = gluon.loss.L2Loss()(net(x).astype("float32"), y)
        loss.backward()
        if len(micro) > 1:
            mixed.scaler.accumulate(trainer)
    mixed.scaler.step(trainer, 1)
    mixed.scaler.update()
    return weight.grad().astype("float32").asnumpy().astype(np.float64)

singles = [gradient([b]) for b in batches]
both = gradient(batches)
exact = (singles[0] + singles[1]).astype(np.float32)
rounded = mx.nd.amp_cast(mx.nd.array(exact), dtype=BFLOAT16).astype("float32").asnumpy()
out = {"bfloat16": bool(np.dtype(weight.grad().dtype) == BFLOAT16), "nonzero": bool(np.abs(exact).max() > 0),
       "rounded_once": bool(np.array_equal(both, rounded.astype(np.float64)))}
# Clipping under AMP, where MXNet's multiplication is float32's wrapper: the clipped gradients' global norm.
data, label = mixed.cast_batch(*batches[0])
step = mixed.train_step(net, gluon.loss.L2Loss(), trainer, data, label, clip_grad_norm=1e-3)
grads = [p.grad().astype("float32").asnumpy().astype(np.float64) for p in net.collect_params().values()]
out["norm_before"] = float(step.grad_norm.asnumpy()[0])
out["norm_after"] = float(np.sqrt(sum((g ** 2).sum() for g in grads)) / 2)  # the batch of 2 averages
print(json.dumps(out))
"""


@requires_bfloat16
def test_bfloat16_gradients_accumulate_in_float32_and_clip_under_amp():
    out = json.loads(run_python(ACCUMULATE).stdout.strip().splitlines()[-1])
    assert out["bfloat16"] and out["nonzero"] and out["rounded_once"]
    assert out["norm_before"] > 1e-2 and out["norm_after"] == pytest.approx(1e-3, rel=2 ** -7)
