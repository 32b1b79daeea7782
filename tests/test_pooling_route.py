"""Global average pooling as a ``mean`` under bfloat16 AMP (mxfp16/amp/pooling.py): the same values, JIT kernels.

MXNet 1.9.1's oneDNN ``Pooling`` with a 1x1 output passes its gradient on in ``acdB16b``, so its backward and
the backward of the BatchNorm before it ran oneDNN's reference code. The route computes the pooling as ``mean``
over the spatial axes (float32 under AMP). Which operators the graph then holds is checked from the typed
graphs in tests/test_amp_routes.py; here its values, on any CPU in float32, and with bfloat16 arithmetic where
the CPU has it, and the kernels oneDNN then runs.
"""
import json

from mxfp16.amp.pooling import global_average_as_mean, routed

import mxnet as mx
import numpy as np
import pytest
from conftest import requires_bfloat16, run_python

#: bfloat16's unit roundoff (8 significant bits, round to nearest) and float32's.
BF16_U, F32_U = 2.0 ** -8, 2.0 ** -24


@pytest.mark.parametrize("kwargs, taken", [
    (dict(global_pool=True, pool_type="avg", kernel=(1, 1)), True),
    (dict(global_pool="True", pool_type="avg", kernel="(1, 1)", layout="NCHW"), True),  # as a graph stores them
    (dict(global_pool=True, pool_type="avg", kernel=(1,), layout="NCW"), True),
    (dict(global_pool=True, pool_type="avg", kernel=(1, 1), layout="NHWC"), False),
    (dict(global_pool=True, pool_type="max", kernel=(1, 1)), False),  # max's gradient differs on ties
    (dict(global_pool=False, pool_type="avg", kernel=(2, 2)), False),
    (dict(pool_type="avg", kernel=(8, 8)), False),
])
def test_only_global_average_pooling_in_a_channels_first_layout_is_routed(kwargs, taken):
    assert routed(kwargs) is taken


@pytest.mark.parametrize("shape", [(2, 5, 7), (3, 4, 6, 5), (2, 3, 3, 4, 2)])
def test_the_route_is_global_average_pooling_forward_and_backward(shape):
    # Without AMP the route is plain float32: the pooled values and the input gradient of MXNet's own Pooling.
    rng = np.random.RandomState(0)
    x = rng.standard_normal(shape).astype(np.float32)
    head = rng.standard_normal(shape[:2] + (1,) * (len(shape) - 2)).astype(np.float32)
    kernel = (1,) * (len(shape) - 2)
    results = []
    for pool in (mx.nd.Pooling, global_average_as_mean(mx.nd.Pooling)):
        data = mx.nd.array(x)
        data.attach_grad()
        with mx.autograd.record():
            out = pool(data, global_pool=True, pool_type="avg", kernel=kernel)
        out.backward(mx.nd.array(head))
        results.append((out.asnumpy(), data.grad.asnumpy()))
    (pooled, grad), (mean, mean_grad) = results
    axes = tuple(range(2, len(shape)))
    length = int(np.prod(shape[2:]))
    exact = x.astype(np.float64).mean(axis=axes, keepdims=True)
    bound = length * F32_U * np.abs(x).astype(np.float64).mean(axis=axes, keepdims=True) + 1e-30
    assert mean.shape == pooled.shape == exact.shape
    assert np.all(np.abs(mean - exact) <= bound) and np.all(np.abs(pooled - exact) <= bound)
    expected_grad = np.broadcast_to(head.astype(np.float64) / length, shape)
    np.testing.assert_allclose(mean_grad, expected_grad, rtol=2 * F32_U, atol=0)
    np.testing.assert_allclose(grad, expected_grad, rtol=2 * F32_U, atol=0)


_OP_UNDER_AMP = """
    import json
    import numpy as np
    import mxfp16
    import mxnet as mx
    from mxfp16.float_formats import BFLOAT16
    from mxfp16.precision import activate, resolve_precision
    activate(resolve_precision("amp-bfloat16", "cpu"))
    rng = np.random.RandomState(1)
    x = rng.standard_normal((4, 32, 8, 8)).astype(np.float32)
    leaf = mx.nd.array(x)
    leaf.attach_grad()
    with mx.autograd.record():
        data = mx.nd.amp_cast(leaf, dtype=BFLOAT16)  # what a bfloat16 convolution hands the pooling
        out = mx.nd.Pooling(data, global_pool=True, pool_type="avg", kernel=(1, 1))
    head = rng.standard_normal((4, 32, 1, 1)).astype(np.float32)
    out.backward(mx.nd.array(head))
    rounded = mx.nd.amp_cast(data, dtype="float32").asnumpy()
    grad = leaf.grad.asnumpy()
    print(json.dumps({"dtype": str(np.dtype(out.dtype)), "x": x.tolist(),
                      "rounded": rounded.tolist(), "out": out.asnumpy().tolist(), "head": head.tolist(),
                      "grad": grad.tolist()}))
"""


@requires_bfloat16
def test_under_amp_bfloat16_the_pooling_of_bfloat16_data_is_a_float32_mean_within_bfloat16s_rounding():
    found = json.loads(run_python(_OP_UNDER_AMP).stdout.strip().splitlines()[-1])
    assert found["dtype"] == "float32"  # mean is on the float32 list: summed in float32
    x, rounded, out = (np.array(found[k], dtype=np.float64) for k in ("x", "rounded", "out"))
    head, grad = np.array(found["head"]), np.array(found["grad"])
    length = 8 * 8
    mean_abs = np.abs(x).mean(axis=(2, 3), keepdims=True)
    # Of the bfloat16 values it was given, the float32 sum loses at most length * u32 relative.
    assert np.all(np.abs(out - rounded.mean(axis=(2, 3), keepdims=True)) <= length * F32_U * mean_abs * 2)
    # Against float32's pooling of the unrounded data: each input rounded once to bfloat16 (u = 2^-8).
    assert np.all(np.abs(out - x.mean(axis=(2, 3), keepdims=True)) <= (BF16_U + length * F32_U) * mean_abs)
    # The gradient, head / length at every pixel, comes back through the bfloat16 input rounded once. (MXNet's
    # own bfloat16 pooling, called on arrays, leaves half of these pixels' gradients 0: its layout fault again.)
    expected = np.broadcast_to(head / length, grad.shape)
    assert np.all(np.abs(grad - expected) <= BF16_U * np.abs(expected))


_TRAIN_UNDER_VERBOSE = """
    import json
    import numpy as np
    import mxfp16
    import mxnet as mx
    from mxnet import gluon
    mp = mxfp16.MixedPrecision("{precision}", "cpu", log=lambda line: None)
    mx.random.seed(0)
    np.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1, use_bias=False), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.Conv2D(32, 3, padding=1, use_bias=False), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.random.normal(shape=(16, 3, 8, 8))
    y = mx.nd.array(np.arange(16) % 10)
    data, label = mp.cast_batch(x, y)
    trainer = mp.prepare(net, "sgd", {{"learning_rate": 0.0}}, example=(x, y))
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    losses = [float(mp.train_step(net, loss, trainer, data, label).loss.mean().asnumpy()) for _ in range(2)]
    print("LOSSES " + json.dumps(losses), flush=True)
"""


@requires_bfloat16
def test_under_amp_bfloat16_the_batchnorm_before_global_pooling_runs_oneDNNs_jit_backward():
    runs = {}
    for precision in ("float32", "amp-bfloat16"):
        proc = run_python(_TRAIN_UNDER_VERBOSE.format(precision=precision), env={"DNNL_VERBOSE": "1",
                                                                                  "OMP_NUM_THREADS": "1"})
        lines = proc.stdout.splitlines()
        runs[precision] = (json.loads(next(l for l in lines if l.startswith("LOSSES "))[len("LOSSES "):]),
                           [l.split(",") for l in lines if l.startswith("dnnl_verbose,exec,")])
    losses, execs = runs["amp-bfloat16"]
    norms = [f for f in execs if f[3] == "batch_normalization" and f[5] == "backward"]
    assert norms and all("jit" in f[4] for f in norms), [f[4] for f in norms]
    assert all("bf16" in f[6] for f in norms)
    assert not [f for f in execs if f[3] == "pooling_v2"]  # no oneDNN pooling left, forward or backward
    assert not [f for f in execs if f[3] != "reorder" and f[4].endswith(":any") and f[3] == "batch_normalization"
                and f[5] == "backward"]
    # The losses (learning rate 0: the same weights both steps) against float32's: the bfloat16 convolutions
    # round their inputs (u = 2^-8) over a reduction of 9 * 16 products; relative, with sqrt(K) growth.
    reference = runs["float32"][0]
    assert np.all(np.isfinite(losses))
    np.testing.assert_allclose(losses, reference, rtol=BF16_U * np.sqrt(9 * 16) * 2)
