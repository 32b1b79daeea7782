"""Issue 44's routes, read from the graphs AMP builds: attention without cast ping-pong, recurrent layers whose
products run in bfloat16, depthwise and 1x1 convolutions (or every BatchNorm) kept float32 as an option,
Conv2DTranspose in float32, global average pooling as a float32 ``mean`` (tests/test_pooling_route.py checks its
values and kernels, tests/test_batchnorm32.py the BatchNorm option's).

The graphs are traced and typed in one child process per list set (``tests/amp_routes_child.py``; AMP is
process-global), so this runs on any CPU. What the routes do to speed needs a CPU with avx512_bf16
(docs/benchmarks.md); the float32 steps below run here.
"""
import json
import os
import subprocess
import sys

from mxfp16._internals import renew_parameter_symbols
from mxfp16.amp import lists
from mxfp16.amp.wrappers import LayerCall

import mxnet as mx
import numpy as np
import pytest
from conftest import REPO, requires_bfloat16, run_python

CHILD = os.path.join(REPO, "tests", "amp_routes_child.py")
LIST_SETS = ("shape-float32", "mxfp16", "mxfp16+depthwise32", "mxfp16+pointwise32", "mxfp16+batchnorm32",
             "mxfp16+unaligned32")
ATTENTION = ("transformer-encoder", "self-attention", "encoder-block", "fused-attention")


@pytest.fixture(scope="module")
def typed():
    """``{list set: {network: {'casts': [data, parameters], 'ops': [[op, dtype, cast in], ...]}}}``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    children = {which: subprocess.Popen([sys.executable, CHILD, which], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=env) for which in LIST_SETS}
    found = {}
    for which, child in children.items():
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, err[-3000:]
        found[which] = json.loads(out.strip().splitlines()[-1])
    return found


def _ops(report, op):
    return [entry for entry in report["ops"] if entry[0] == op]


def test_shape_operators_follow_their_input_except_those_the_probe_failed():
    follow = set(lists.follow_input_operators())
    from mxnet.contrib.amp.lists import symbol_bf16

    assert follow and follow <= set(symbol_bf16.FP32_FUNCS)  # each one a change from MXNet's float32 list
    assert "transpose" not in follow  # the probe's bfloat16 run of it crashed the process
    assert {"Reshape", "SliceChannel", "split", "slice_axis", "expand_dims", "swapaxes", "_contrib_div_sqrt_dim"} <= \
        follow
    fp32 = set(lists.operator_lists("bfloat16")["fp32_ops"])
    assert not fp32 & follow and "transpose" in fp32 and "batch_dot" in fp32
    assert follow <= set(lists.operator_lists("bfloat16", "mxnet")["fp32_ops"])  # MXNet's own lists unchanged


@requires_bfloat16
def test_the_shape_operators_that_follow_run_in_bfloat16_on_the_installed_wheel():
    # Where the recorded probe knew no input for one, MXNet's source and this project's AVX2 CPU were the
    # evidence; here the probe runs each on a CPU that has bfloat16 kernels, forward and backward.
    sys.path.insert(0, os.path.join(REPO, "tools"))
    try:
        import amp_probe_ops
    finally:
        sys.path.pop(0)
    results = amp_probe_ops.scan(lists.follow_input_operators())
    assert not {name: verdict for name, verdict in results.items() if verdict[0] == "float32"}, results


def test_attention_casts_no_more_tensors_and_its_shape_operators_cast_nothing(typed):
    before, after = typed["shape-float32"], typed["mxfp16"]
    follow = set(lists.follow_input_operators())
    for name in ATTENTION:
        assert after[name]["casts"][0] <= before[name]["casts"][0], (name, before[name]["casts"], after[name]["casts"])
        # Following its input, a shape operator is never where a cast lands; kept float32, it was.
        assert not [op for op in after[name]["ops"] if op[0] in follow and op[2]], name
        assert {dtype for _, dtype, _ in _ops(after[name], "batch_dot")} <= {"float32"}  # no bfloat16 kernel
        assert {dtype for _, dtype, _ in _ops(after[name], "FullyConnected")} == {"bfloat16"}
    landed = [op for name in ATTENTION for op in before[name]["ops"] if op[0] in follow and op[2]]
    assert landed, "the comparison must be able to fail: with float32 shape operators, casts land on them"


def test_gluonnlp_fused_attention_runs_in_float32_with_one_cast_of_its_input(typed):
    report = typed["mxfp16"]["fused-attention"]
    fused = [op for op in report["ops"] if op[0].startswith("_contrib_interleaved_matmul")]
    assert [op[1] for op in fused] == ["float32", "float32"]
    # x in, q/k/v to float32 (one cast, read by both fused operators), the context into the projection,
    # the projection's output into the float32 residual sum.
    assert report["casts"][0] == 4


def test_the_lstms_swapaxes_and_products_stay_bfloat16_once_unfused(typed):
    fused, unfused = typed["mxfp16"]["lstm"], typed["mxfp16"]["lstm-unfused"]
    assert [op[1] for op in _ops(fused, "RNN")] == ["float32"]
    assert _ops(unfused, "RNN") == []
    layers, steps = 2, 8  # LSTMClassifier(num_layers=2) over 8 rows
    products = _ops(unfused, "FullyConnected")
    assert len(products) == 2 + layers * (1 + steps) and {op[1] for op in products} == {"bfloat16"}
    # The embedding's bfloat16 output reaches the input projection through swapaxes without a cast.
    swap = _ops(unfused, "SwapAxis")[0]
    assert swap[1] == "bfloat16" and not swap[2]
    # Each recurrent weight is cast once per call, not once per step: the parameter casts do not grow with steps.
    assert unfused["casts"][1] == 2 * (layers + 2)


def test_conv2d_transpose_runs_in_float32_but_a_single_output_channel_as_a_bfloat16_convolution(typed):
    dcgan, grey = typed["mxfp16"]["dcgan-generator"], typed["mxfp16"]["dense-generator"]
    # Stock AMP leaves a generator of transposed convolutions (3 output channels) entirely in float32.
    assert {op[1] for op in _ops(dcgan, "Deconvolution")} == {"float32"} and dcgan["casts"] == [0, 0]
    # The grey generator's last layer (one output channel) is the convolution route, and AMP runs it in bfloat16.
    assert [op[1] for op in _ops(grey, "Deconvolution")] == ["float32"]
    assert [op[1] for op in _ops(grey, "Convolution")] == ["bfloat16"]
    assert {op[1] for op in _ops(grey, "FullyConnected")} == {"bfloat16"}


def test_global_average_pooling_runs_as_a_float32_mean_and_max_pooling_stays_oneDNNs(typed):
    # MXNet 1.9.1's oneDNN global average pooling hands its gradient on in a layout that sends its own backward
    # and the BatchNorm's before it to reference kernels (mxfp16/amp/pooling.py): under AMP it is a float32 mean.
    for which in ("mxfp16", "mxfp16+depthwise32"):
        avg, top = typed[which]["global-avg-pool"], typed[which]["global-max-pool"]
        assert _ops(avg, "Pooling") == [] and [op[1] for op in _ops(avg, "mean")] == ["float32"]
        assert [op[1] for op in _ops(avg, "Convolution")] == ["bfloat16"]
        assert [op[1] for op in _ops(avg, "BatchNorm")] == ["bfloat16"]
        assert [op[1] for op in _ops(top, "Pooling")] == ["bfloat16"] and _ops(top, "mean") == []
        assert {op[1] for op in _ops(avg, "FullyConnected")} == {"bfloat16"}


def test_the_batchnorm32_option_keeps_every_batchnorm_float32_and_the_convolutions_bfloat16(typed):
    for net in ("separable-block", "global-avg-pool"):
        default, option = typed["mxfp16"][net], typed["mxfp16+batchnorm32"][net]
        assert {op[1] for op in _ops(default, "BatchNorm")} == {"bfloat16"}
        assert _ops(option, "BatchNorm") and {op[1] for op in _ops(option, "BatchNorm")} == {"float32"}
        assert [op[1] for op in _ops(option, "Convolution")] == [op[1] for op in _ops(default, "Convolution")]
        assert {op[1] for op in _ops(option, "Convolution")} == {"bfloat16"}


def test_relu6s_clip_runs_in_float32_between_bfloat16_convolutions(typed):
    # MXNet's own bfloat16 clip is slow enough to be most of MobileNet v2's step (lists.SLOW_IN_BFLOAT16), and its
    # float32 clip slower than a minimum and a maximum with a scalar (mxfp16/amp/clip.py), which take its place.
    assert "clip" in lists.operator_lists("bfloat16")["fp32_ops"]
    assert "clip" not in lists.operator_lists("bfloat16", "mxnet")["fp32_ops"]  # MXNet's lists run it in bfloat16
    for which in ("mxfp16", "mxfp16+batchnorm32"):
        block = typed[which]["relu6-block"]
        assert not _ops(block, "clip")
        assert [op[1] for op in _ops(block, "_minimum_scalar") + _ops(block, "_maximum_scalar")] == ["float32"] * 2
        assert [op[1] for op in _ops(block, "Convolution")] == ["bfloat16", "bfloat16"]
    assert _ops(typed["mxfp16"]["relu6-block"], "_minimum_scalar")[0][2]  # after a bfloat16 BatchNorm: cast up
    assert not _ops(typed["mxfp16"]["relu6-block"], "_maximum_scalar")[0][2]  # the minimum's float32: no cast


def test_the_unaligned32_option_keeps_convolutions_with_unaligned_channels_float32(typed):
    # 3 -> 32 (input), 32 -> 24 (output), 24 -> 32 (input): float32; the aligned depthwise and 1x1: bfloat16.
    convs = _ops(typed["mxfp16+unaligned32"]["unaligned-block"], "Convolution")
    assert [c[1] for c in convs] == ["float32"] * 3 + ["bfloat16"] * 2
    assert [c[1] for c in _ops(typed["mxfp16"]["unaligned-block"], "Convolution")] == ["bfloat16"] * 5


@pytest.mark.parametrize("attrs, weight_shape, kept", [
    ({"num_filter": "24"}, (24, 0, 1, 1), True),  # a deferred weight: judged by its output channels
    ({"num_filter": "32"}, (32, 0, 3, 3), False),
    ({"num_filter": "32"}, (32, 3, 3, 3), True),
    ({"num_filter": "144"}, (144, 24, 1, 1), True),
    ({"num_filter": "96", "num_group": "96"}, (96, 1, 3, 3), False),  # depthwise: 96 channels in
    ({"num_filter": "24", "num_group": "2"}, (24, 8, 3, 3), True),  # grouped: 16 in, 24 out
    ({"num_filter": "32"}, (), False),
])
def test_the_unaligned_rule_reads_input_channels_from_the_weight(attrs, weight_shape, kept):
    assert lists.unaligned_convolution(LayerCall("Convolution", attrs, "w", weight_shape=weight_shape)) is kept
    assert not lists.unaligned_convolution(LayerCall("FullyConnected", {"num_hidden": "24"}, "w",
                                                     weight_shape=(24, 3)))


def test_the_unaligned_rule_reaches_the_export_and_calls_on_arrays():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(32, 3), mx.gluon.nn.Conv2D(16, 1), mx.gluon.nn.Conv2D(24, 1))
    net.initialize()
    net(mx.nd.zeros((1, 3, 8, 8)))  # the parameters get their shapes; the symbols Gluon cached keep in_channels=0
    symbol = net(mx.sym.var("data"))
    stale = lists.float32_layers(symbol, "bfloat16", "mxfp16+unaligned32")
    assert [name.split("_")[0] for name in stale] == [net[2].name]  # only the output channels were known
    renew_parameter_symbols(net)
    symbol = net(mx.sym.var("data"))
    names = [name.split("_")[0] for name in lists.float32_layers(symbol, "bfloat16", "mxfp16+unaligned32")]
    assert names == [net[0].name, net[2].name]  # 3 channels in; 24 out
    call = LayerCall.of_call("Convolution", (mx.nd.zeros((1, 24, 4, 4)), mx.nd.zeros((32, 24, 1, 1))),
                             {"num_filter": 32, "kernel": (1, 1)})
    assert call.weight_shape == (32, 24, 1, 1) and lists.unaligned_convolution(call)


@requires_bfloat16
def test_mixed_precision_judges_a_deferred_network_again_once_it_has_shapes():
    # Traced at its first step, before Gluon knew its input channels, the 24 -> 32 convolution looks aligned: so it
    # stays in a network stepped by mxfp16.train_step alone. MixedPrecision.train_step traces the network again
    # after its first step, and keeps that convolution float32 too (the 32 -> 24 one is float32 from the start).
    # A network given its shapes by a forward pass before it was hybridized (mxfp16.models.build_model's in_shape)
    # has them at its first trace: prepare() drops the symbols Gluon's shape inference cached without them.
    code = """
        import json
        import mxfp16, mxnet as mx
        from mxfp16.amp.wrappers import dtype_name

        mp = mxfp16.MixedPrecision("amp-bfloat16", "cpu", amp_lists="mxfp16+unaligned32", log=lambda line: None)
        found = []
        for step, shaped in ((mp.train_step, False), (lambda *args: mxfp16.train_step(*args, mp.scaler), False),
                             (mp.train_step, True)):
            net = mx.gluon.nn.HybridSequential()
            net.add(mx.gluon.nn.Conv2D(24, 1), mx.gluon.nn.Conv2D(32, 1), mx.gluon.nn.Conv2D(32, 1))
            net.initialize()
            if shaped:
                net(mx.nd.zeros((1, 32, 4, 4)))
            net.hybridize()
            trainer = mp.prepare(net, "sgd", {"learning_rate": 0.01})
            data, label = mp.cast_batch(mx.nd.ones((2, 32, 4, 4)), mx.nd.zeros((2,)))
            losses = [step(net, lambda out, y: (out * out).mean(), trainer, data, label).loss.item()
                      for _ in range(3)]
            graph = net._cached_graph[1]
            internals = graph.get_internals()
            _, types, _ = internals.infer_type(data=mx.nd.ones((1,)).dtype)
            dtype = dict(zip(internals.list_outputs(), types))
            nodes = json.loads(graph.tojson())["nodes"]
            found.append([[dtype_name(dtype[n["name"] + "_output"]) for n in nodes if n["op"] == "Convolution"],
                          losses])
        print(json.dumps(found))
    """
    (retraced, losses), (once, _), (shaped, _) = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert once == ["float32", "bfloat16", "bfloat16"]
    assert retraced == shaped == ["float32", "float32", "bfloat16"]
    assert np.isfinite(losses).all() and losses[2] < losses[0]  # it still trains across the new graph


def _transposed_convolution(x, w, b, stride, pad, adj):
    """numpy float64: each input pixel adds its weighted kernel into the output at ``stride`` steps."""
    n, _, h, wd = x.shape
    k = w.shape[2]
    full = np.zeros((n, w.shape[1], (h - 1) * stride + k + adj, (wd - 1) * stride + k + adj))
    for i in range(h):
        for j in range(wd):
            full[:, :, i * stride:i * stride + k, j * stride:j * stride + k] += np.einsum("nc,cokl->nokl",
                                                                                        x[:, :, i, j], w)
    out = full[:, :, pad:full.shape[2] - pad, pad:full.shape[3] - pad]
    return out + b.reshape(1, -1, 1, 1)


@pytest.mark.parametrize("channels, kernel, stride, pad, adj, size", [
    (16, 4, 2, 1, 0, 4),    # a grey generator's last layer: the shape MXNet's deconvolution fails on
    (100, 4, 1, 0, 0, 1),   # 1x1 noise to 4x4 (DCGAN's first layer, with one output channel)
    (8, 3, 2, 1, 1, 5),     # output_padding
    (3, 5, 3, 2, 0, 4),
])
def test_the_single_channel_route_is_the_transposed_convolution(channels, kernel, stride, pad, adj, size):
    from mxfp16.amp.deconvolution import routed, single_channel_as_convolution

    rng = np.random.RandomState(0)
    x, w, b = rng.normal(size=(2, channels, size, size)), rng.normal(size=(channels, 1, kernel, kernel)), rng.normal(
        size=(1,))
    expected = _transposed_convolution(x, w, b, stride, pad, adj)
    head = rng.normal(size=expected.shape)
    options = dict(kernel=(kernel, kernel), stride=(stride, stride), pad=(pad, pad), adj=(adj, adj), num_filter=1,
                   no_bias=False)
    assert routed(options)
    route = single_channel_as_convolution(mx.nd.Deconvolution)
    arrays = [mx.nd.array(a) for a in (x, w, b)]
    for a in arrays:
        a.attach_grad()
    with mx.autograd.record():
        out = route(*arrays, **options)
    out.backward(mx.nd.array(head))
    assert np.abs(out.asnumpy() - expected).max() < 1e-4 * np.abs(expected).max()
    # The output is linear in x, in w and in b: each gradient entry is the output of a unit input, against the head.
    zero_b = np.zeros_like(b)
    references = [_unit_gradients(x.shape, lambda e: _transposed_convolution(e, w, zero_b, stride, pad, adj), head),
                  _unit_gradients(w.shape, lambda e: _transposed_convolution(x, e, zero_b, stride, pad, adj), head),
                  np.array([head.sum()])]
    for array, reference in zip(arrays, references):
        got = array.grad.asnumpy()
        assert np.abs(got - reference).max() < 1e-4 * np.abs(reference).max()


def _unit_gradients(shape, linear, head):
    """The gradient of ``sum(linear(v) * head)`` with respect to ``v``, for a linear function, entry by entry."""
    grad = np.zeros(shape)
    unit = np.zeros(shape)
    for flat in range(unit.size):
        unit.flat[flat] = 1.0
        grad.flat[flat] = (linear(unit) * head).sum()
        unit.flat[flat] = 0.0
    return grad


def test_the_route_leaves_other_transposed_convolutions_to_mxnet():
    from mxfp16.amp.deconvolution import routed

    base = dict(kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=1)
    assert routed(base)
    assert not routed(dict(base, num_filter=3))
    assert not routed(dict(base, num_filter=2, num_group=2))
    assert not routed(dict(base, dilate=(2, 2)))
    assert not routed(dict(base, kernel=(4,), pad=(1,)))
    assert not routed(dict(base, pad=(4, 4)))  # beyond kernel - 1: no convolution padding expresses it


@pytest.mark.parametrize("which, kept", [("mxfp16", set()), ("mxfp16+depthwise32", {"depthwise"}),
                                         ("mxfp16+pointwise32", {"pointwise"})])
def test_depthwise_and_pointwise_options_keep_those_convolutions_float32(typed, which, kept):
    convs = _ops(typed[which]["separable-block"], "Convolution")  # 1x1, 3x3 depthwise, 1x1
    kinds = ["pointwise", "depthwise", "pointwise"]
    assert [c[1] for c in convs] == ["float32" if kind in kept else "bfloat16" for kind in kinds]


def test_the_options_reach_the_inference_conversion():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, 1), mx.gluon.nn.Conv2D(8, 3, groups=8), mx.gluon.nn.Conv2D(4, 7, padding=3))
    net.initialize()
    symbol = net(mx.sym.var("data"))
    names = [name.split("_")[0] for name in lists.float32_layers(symbol, "bfloat16", "mxfp16+depthwise32")]
    assert names == [net[1].name, net[2].name]  # the depthwise one and the 7x7 stem
    assert lists.float32_layers(symbol, "bfloat16", "mxnet") == []
    with pytest.raises(ValueError, match="choose one of: mxfp16, mxnet, measured"):
        lists.float32_layers(symbol, "bfloat16", "fastest")


def _generator_step(precision, channels):
    return f"""
        import json, sys
        sys.path.insert(0, "tests")
        import mxfp16, mxnet as mx, numpy as np
        from amp_routes_child import Generator, DenseGenerator
        mp = mxfp16.MixedPrecision({precision!r}, "cpu", log=lambda line: None)
        losses = []
        # The Dense one runs imperatively: hybridized, MXNet 1.9.1 fails its second step in float32 here
        # (BatchNorm over a Dense output, reshaped into a convolution: "Check failed: !is_view").
        for build, shape, hybrid in ((Generator, (4, 100, 1, 1), True),
                                     (lambda: DenseGenerator(channels={channels}), (4, 100), False)):
            mx.random.seed(0)
            net = build(); net.initialize(mx.init.Normal(0.05))
            if hybrid:
                net.hybridize()
            trainer = mp.prepare(net, "adam", {{"learning_rate": 1e-3}})
            z = mx.nd.array(np.random.RandomState(0).normal(size=shape))
            data, label = mp.cast_batch(z, mx.nd.zeros(shape[:1]))
            for _ in range(2):
                result = mp.train_step(net, lambda out, y: (out * out).mean(), trainer, data, label)
            losses.append(result.loss.item())
        print(json.dumps(losses))
    """


def test_generators_of_colour_images_train_a_float32_step_on_this_cpu():
    # 100 noise channels into a 1x1 -> 4x4 transposed convolution and a 3-channel output: shapes oneDNN pads.
    # (One output channel fails in float32 without AMP: MXNet's own deconvolution, left as it is.)
    losses = json.loads(run_python(_generator_step("float32", 3)).stdout.strip().splitlines()[-1])
    assert all(np.isfinite(losses)) and all(loss > 0 for loss in losses)


@requires_bfloat16
def test_a_grey_image_generator_trains_under_amp_bfloat16():
    losses = json.loads(run_python(_generator_step("amp-bfloat16", 1)).stdout.strip().splitlines()[-1])
    assert all(np.isfinite(losses)) and all(loss > 0 for loss in losses)


def test_the_route_timing_tool_runs_its_float32_rows_here():
    # tools/route_timing.py measures the routes on a CPU with avx512_bf16; --smoke runs its float32 rows at toy
    # sizes, so the tool that docs/benchmarks.md names is known to run before it is carried to such a CPU.
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "route_timing.py"), "--smoke", "--rounds", "1",
                           "--iters", "1", "--case", "lstm"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split(" | ")[0].strip("| "): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert "failed" not in proc.stdout
    assert rows["fused, float32"].endswith("| 1.00 |") and "unfused, float32" in rows
