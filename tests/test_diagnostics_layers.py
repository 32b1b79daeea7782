"""Per-layer access: activation-gradient probes and the float16 forward check (elementwise nets, CPU)."""
from mxfp16.casting import cast_net
from mxfp16.diagnostics import float16_forward_runs_here, forward_check, gradient_ranges
from mxfp16.diagnostics.collect import _activation_probes
from mxfp16.diagnostics.layers import leaf_blocks
from mxfp16.models import ElementwiseDense, elementwise_mlp

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon


def _mlp(seed=0, prefix="diag_"):
    mx.random.seed(seed)
    net = elementwise_mlp(8, (16, 16), 4, batchnorm=False, prefix=prefix)
    net.initialize()
    return net


def _batch(seed=0, n=6):
    rng = np.random.default_rng(seed)
    return mx.nd.array(rng.uniform(0.5, 1.0, (n, 8))), mx.nd.array(rng.integers(0, 4, n))


def _param_grads(net, x, y, probes):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    with _activation_probes(net, probes) as taps:
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
    return [p.grad().asnumpy().copy() for p in net.collect_params().values()], taps


def test_probe_gradient_at_the_output_layer_is_softmax_minus_onehot():
    net = _mlp()
    x, y = _batch()
    _, taps = _param_grads(net, x, y, probes=True)
    logits = net(x).asnumpy().astype(np.float64)
    expected = np.exp(logits - logits.max(axis=1, keepdims=True))
    expected /= expected.sum(axis=1, keepdims=True)
    expected[np.arange(len(expected)), y.asnumpy().astype(int)] -= 1.0   # d(sum of losses)/d logits
    name, probe = taps[-1]
    assert name == leaf_blocks(net)[-1].name
    np.testing.assert_allclose(probe.grad.asnumpy(), expected, rtol=1e-5, atol=1e-7)


def test_probes_leave_parameter_gradients_unchanged_and_are_removed_afterwards():
    net = _mlp()
    x, y = _batch(seed=1)
    plain, _ = _param_grads(net, x, y, probes=False)
    probed, taps = _param_grads(net, x, y, probes=True)
    assert len(taps) == len(leaf_blocks(net))
    for a, b in zip(plain, probed):
        np.testing.assert_array_equal(a, b)
    assert all("forward" not in vars(block) for block in leaf_blocks(net))


def test_gradient_ranges_reports_every_parameter_and_layer():
    net = _mlp()
    batches = [_batch(seed=s) for s in range(2)]
    stats = gradient_ranges(net, gluon.loss.SoftmaxCrossEntropyLoss(), batches).stats
    kinds = {}
    for s in stats:
        kinds.setdefault(s.kind, []).append(s)
    assert [s.name for s in kinds["parameter"]] == list(net.collect_params().keys())
    assert [s.name for s in kinds["activation"]] == [b.name for b in leaf_blocks(net)]
    weight = net.collect_params()[kinds["parameter"][0].name]
    assert kinds["parameter"][0].count == 2 * weight.shape[0] * weight.shape[1]
    assert all(s.batches == 2 for s in stats)


def test_a_hybridized_network_is_diagnosed_like_the_imperative_one_and_stays_hybridized():
    batches = [_batch(seed=s) for s in range(2)]
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    plain = gradient_ranges(_mlp(), loss_fn, batches).stats
    net = _mlp()
    net.hybridize(static_alloc=True)
    net(batches[0][0])  # the cached graph exists before the diagnosis
    hybrid = gradient_ranges(net, loss_fn, batches).stats
    assert [(s.name, s.kind, s.count) for s in hybrid] == [(s.name, s.kind, s.count) for s in plain]
    for a, b in zip(hybrid, plain):
        assert a.max_abs == b.max_abs and a.min_nonzero == b.min_nonzero and (a.binades == b.binades).all()
    assert net._active and ("static_alloc", True) in net._flags
    assert all("forward" not in vars(block) for block in leaf_blocks(net))
    x, y = batches[0]
    np.testing.assert_allclose(net(x).asnumpy(), _mlp()(x).asnumpy(), rtol=1e-6)


def _huge_second_layer(dtype):
    net = _mlp(prefix=f"huge{dtype}_")
    dense = [b for b in leaf_blocks(net) if isinstance(b, ElementwiseDense)]
    # Inputs and first-layer outputs are O(1); 16 products of 1e4 push the second layer past 65504.
    dense[1].weight.set_data(mx.nd.ones_like(dense[1].weight.data()) * 1e4)
    cast_net(net, dtype)
    return net, dense


def test_forward_check_names_the_layer_that_overflows_float16_first():
    net, dense = _huge_second_layer("float16")
    x, _ = _batch()
    check = forward_check(net, x.astype("float16"))
    assert check.dtype == "float16"
    assert check.first_bad_layer == dense[1].name
    names = [name for name, _ in check.layers]
    assert names == [b.name for b in leaf_blocks(net)]
    assert all(finite for _, finite in check.layers[:names.index(dense[1].name)])
    assert not check.output_finite


def test_forward_check_of_the_same_network_in_float32_finds_nothing():
    net, _ = _huge_second_layer("float32")
    x, _ = _batch()
    check = forward_check(net, x)
    assert check.first_bad_layer is None and check.output_finite


def test_float16_forward_runs_on_cpu_only_without_gemm_layers():
    assert float16_forward_runs_here(_mlp(), mx.cpu())[0]
    conv = gluon.nn.HybridSequential()
    conv.add(gluon.nn.Conv2D(4, 3), gluon.nn.Dense(2))
    runs, why = float16_forward_runs_here(conv, mx.cpu())
    assert not runs and "Conv2D" in why and "gpu" in why
    assert float16_forward_runs_here(conv, mx.gpu(0))[0]


def test_gradient_ranges_copies_to_the_host_once_per_batch(monkeypatch):
    net = _mlp()
    batches = [_batch(seed=s) for s in range(3)]
    copies = []
    original = mx.nd.NDArray.asnumpy
    monkeypatch.setattr(mx.nd.NDArray, "asnumpy", lambda self: copies.append(1) or original(self))
    monkeypatch.setattr(mx.nd.NDArray, "asscalar", lambda self: pytest.fail("asscalar syncs the host"))
    monkeypatch.setattr(mx.nd.NDArray, "wait_to_read", lambda self: pytest.fail("wait_to_read syncs the host"))
    gradient_ranges(net, gluon.loss.SoftmaxCrossEntropyLoss(), batches)
    assert len(copies) == len(batches)


def test_a_float16_network_is_refused_because_its_gradients_are_already_float16():
    net = _mlp()
    cast_net(net, "float16")
    x, y = _batch()
    with pytest.raises(ValueError, match="float32"):
        gradient_ranges(net, gluon.loss.SoftmaxCrossEntropyLoss(), [(x.astype("float16"), y)])
