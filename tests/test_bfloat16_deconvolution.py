"""Transposed convolutions with bfloat16 weights (``mxfp16.amp.bfloat16_deconvolution``), against float32.

Under AMP MXNet 1.9.1 runs ``Deconvolution`` in float32: its backward crashes on a computed weight, and AMP's cast
is one (docs/results/deconv-bf16-zen5). A layer whose weight is a bfloat16 leaf runs in bfloat16; its float32
master lives in the optimizer (tests/test_bfloat16_masters.py). The dispatch is checked here on any CPU; the
layers' values and training against the float32 control where the CPU has bfloat16 arithmetic, in a child (AMP is
process-global).
"""
import json

from mxfp16.amp.deconvolution import bfloat16_weight_call, is_bfloat16_leaf
from mxfp16.float_formats import BFLOAT16

import mxnet as mx
import numpy as np
import pytest
from conftest import requires_bfloat16, run_python


def bf16(array):
    return mx.nd.amp_cast(array, dtype=BFLOAT16)


def test_a_leaf_is_bfloat16_when_its_array_or_its_declared_dtype_is():
    assert is_bfloat16_leaf(bf16(mx.nd.ones(2))) and not is_bfloat16_leaf(mx.nd.ones(2))
    assert is_bfloat16_leaf(mx.sym.var("w", dtype=BFLOAT16))
    assert not is_bfloat16_leaf(mx.sym.var("w", dtype="float32")) and not is_bfloat16_leaf(mx.sym.var("w"))
    assert not is_bfloat16_leaf(mx.sym.amp_cast(mx.sym.var("w"), dtype=BFLOAT16))  # computed: crashes the backward


def _recording():
    calls = []

    def as_amp(*args, **kwargs):
        calls.append(("amp", args, kwargs))
        return "amp"

    def mxnet_own(*args, **kwargs):
        calls.append(("own", args, kwargs))
        return "own"

    return calls, bfloat16_weight_call(as_amp, mxnet_own)


@pytest.mark.parametrize("as_keywords", [False, True])
def test_a_call_with_a_bfloat16_weight_runs_mxnets_operator_on_bfloat16_data(as_keywords):
    calls, deconvolution = _recording()
    data, weight = mx.nd.ones((1, 2, 3, 3)), bf16(mx.nd.ones((2, 4, 2, 2)))
    options = dict(kernel=(2, 2), num_filter=4, no_bias=True)
    result = (deconvolution(data=data, weight=weight, **options) if as_keywords
              else deconvolution(data, weight, **options))
    (which, args, kwargs), = calls
    assert result == "own" and kwargs == options and args[1] is weight
    assert args[0].dtype == BFLOAT16 and np.array_equal(args[0].astype("float32").asnumpy(), data.asnumpy())


def test_every_other_call_goes_as_amp_runs_it():
    calls, deconvolution = _recording()
    data = mx.nd.ones((1, 2, 3, 3))
    assert deconvolution(data, mx.nd.ones((2, 4, 2, 2)), kernel=(2, 2), num_filter=4) == "amp"
    assert deconvolution(data, kernel=(2, 2), num_filter=4, name="declares_its_weight") == "amp"
    assert [c[0] for c in calls] == ["amp", "amp"] and calls[0][1][0] is data


def test_a_bfloat16_weight_beside_a_float32_bias_is_refused_with_the_fix():
    calls, deconvolution = _recording()
    with pytest.raises(TypeError, match="bfloat16 weight and a bias of another dtype.*bfloat16_deconvolution"):
        deconvolution(mx.nd.ones((1, 2, 3, 3)), bf16(mx.nd.ones((2, 4, 2, 2))), mx.nd.ones(4), kernel=(2, 2),
                      num_filter=4)
    assert not calls


#: A small generator (DCGAN's layers: transposed convolutions, BatchNorm, ReLU, tanh) trained five Adam steps in
#: amp-bfloat16 with the route and, in the same process, the same network with float32 transposed convolutions
#: (AMP runs those in float32: the control). Prints one JSON line.
PARITY = r"""
import json
import mxnet as mx
import numpy as np
from mxnet import gluon
import mxfp16
from mxfp16.amp import bfloat16_deconvolution
from mxfp16.casting import cast_net
from mxfp16.float_formats import BFLOAT16

mixed = mxfp16.MixedPrecision("amp-bfloat16", ctx=mx.cpu())

def generator():
    net = gluon.nn.HybridSequential(prefix="g_")
    with net.name_scope():
        for width, stride, pad in ((32, 1, 0), (16, 2, 1)):
            net.add(gluon.nn.Conv2DTranspose(width, 4, stride, pad, use_bias=False), gluon.nn.BatchNorm(),
                    gluon.nn.Activation("relu"))
        net.add(gluon.nn.Conv2DTranspose(3, 4, 2, 1), gluon.nn.Activation("tanh"))
    net.initialize(mx.init.Normal(0.05), ctx=mx.cpu())
    net(mx.nd.zeros((1, 8, 1, 1)))
    return net

out = {}
deferred = gluon.nn.Conv2DTranspose(4, 2)  # in_channels unknown until a batch runs through it
deferred.initialize(ctx=mx.cpu())
try:
    bfloat16_deconvolution(deferred)
except RuntimeError as exc:
    out["deferred"] = str(exc)
control, routed = generator(), generator()
for name, param in routed.collect_params().items():
    param.set_data(control.collect_params()[name].data())
out["routed"] = bfloat16_deconvolution(routed)
out["dtypes"] = {k: "bfloat16" if np.dtype(p.dtype) == BFLOAT16 else np.dtype(p.dtype).name
                 for k, p in routed.collect_params().items()}
start = routed[0].weight.data().astype("float32").asnumpy()
bits = control[0].weight.data().asnumpy().view(np.uint32).astype(np.uint64)  # float32 -> bfloat16, to nearest even
nearest = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
out["rounded_at_cast"] = bool(np.array_equal(start, nearest))
noise = mx.nd.random.normal(shape=(8, 8, 1, 1))
out["layer_output"] = "bfloat16" if np.dtype(routed[0](noise).dtype) == BFLOAT16 else str(routed[0](noise).dtype)
out["control_layer_output"] = str(np.dtype(control[0](noise).dtype))

target = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (8, 3, 16, 16)))
loss = gluon.loss.L2Loss()
losses = {}
for name, net in (("control", control), ("routed", routed)):
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = mixed.prepare(net, "adam", {"learning_rate": 0.01})
    data, label = mixed.cast_batch(noise, target)
    losses[name] = [float(mixed.train_step(net, loss, trainer, data, label).loss.asnumpy().mean()) for _ in range(5)]
w = routed[0].weight
master = trainer._updaters[0].states[trainer._param2idx[w.name]][0].asnumpy()
rounded = mx.nd.amp_cast(mx.nd.array(master), dtype=BFLOAT16).astype("float32").asnumpy()
out["weight_is_master_rounded"] = bool(np.array_equal(rounded, w.data().astype("float32").asnumpy()))
out["weight_dtype_after"] = "bfloat16" if np.dtype(w.dtype) == BFLOAT16 else str(w.dtype)
out["moved"] = float(np.abs(master - start).max())
routed.save_parameters("routed.params")
again = generator()
bfloat16_deconvolution(again)
again.load_parameters("routed.params")
out["saved_exactly"] = bool(np.array_equal(again[0].weight.data().astype("float32").asnumpy(),
                                           w.data().astype("float32").asnumpy()))
cast_net(routed, mixed.precision)
out["kept_by_cast_net"] = bool(np.dtype(w.dtype) == BFLOAT16)
cast_net(routed, "float32")
out["float32_cast"] = str(np.dtype(w.dtype))
late = generator()  # the route after prepare(): its trainer's optimizer keeps no masters
late_trainer = mixed.prepare(late, "adam", {"learning_rate": 0.01})
bfloat16_deconvolution(late)
try:
    mixed.train_step(late, loss, late_trainer, data, label)
except mxfp16.optim.OptimizerError as exc:
    out["late"] = str(exc)
out["losses"] = losses
print(json.dumps(out))
"""


@requires_bfloat16
def test_routed_layers_train_in_bfloat16_beside_their_float32_control(tmp_path):
    out = json.loads(run_python(PARITY, cwd=str(tmp_path)).stdout.strip().splitlines()[-1])
    assert out["routed"] == ["g_conv0_weight", "g_conv1_weight", "g_conv2_weight", "g_conv2_bias"]
    assert {k for k, v in out["dtypes"].items() if v == "bfloat16"} == set(out["routed"])  # BatchNorm float32
    assert out["layer_output"] == "bfloat16" and out["control_layer_output"] == "float32"
    control, routed = np.array(out["losses"]["control"]), np.array(out["losses"]["routed"])
    assert control[-1] < control[0] and routed[-1] < routed[0]
    np.testing.assert_allclose(routed, control, rtol=0.05)
    assert out["weight_is_master_rounded"] and out["weight_dtype_after"] == "bfloat16"
    assert out["rounded_at_cast"]  # to nearest, as AMP's casts: NDArray.astype would truncate
    assert out["moved"] > 0.01  # five Adam steps of 0.01 moved the master
    assert out["saved_exactly"] and out["kept_by_cast_net"] and out["float32_cast"] == "float32"
    assert "no values yet" in out["deferred"]
    assert "made before they were" in out["late"] and "before mixed.prepare" in out["late"]
