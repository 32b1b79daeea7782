"""A set-up that cannot be half done: MixedPrecision, and the checks behind the pieces it replaces.

The "activate was never called" cases run here: this process never initialises
AMP (conftest runs AMP in children), and amp-float16 resolves on any CPU with
``allow_cpu_float16``. "activate came after the graph was built" needs AMP,
so it runs in a child.
"""
import json

import mxfp16
from mxfp16.precision import AMPStateError

import mxnet as mx
import numpy as np
import pytest
from conftest import requires_bfloat16, run_python
from mxnet import gluon

CPU = [mx.cpu()]


def _net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(4, activation="relu"), gluon.nn.Dense(2))
    net.initialize(ctx=CPU)
    return net


@pytest.fixture
def never_activated():
    from mxfp16._internals import amp_initialized

    assert not amp_initialized(), "AMP was initialised in the test process; run it in a child"
    return mxfp16.resolve_precision("amp-float16", CPU, allow_cpu_float16=True)


def test_cast_net_refuses_an_amp_precision_never_activated(never_activated):
    with pytest.raises(AMPStateError, match="mxfp16.activate\\(precision\\) was not called.*before the network"):
        mxfp16.cast_net(_net(), never_activated)


def test_make_trainer_refuses_an_amp_precision_never_activated(never_activated):
    with pytest.raises(AMPStateError, match="activate\\(precision\\) was not called"):
        mxfp16.make_trainer(_net().collect_params(), "sgd", {"learning_rate": 0.1}, never_activated)


def test_train_step_refuses_an_amp_precision_never_activated(never_activated):
    net = _net()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    scaler = mxfp16.make_loss_scaler(never_activated)
    with pytest.raises(AMPStateError, match="activate\\(precision\\) was not called"):
        mxfp16.train_step(net, gluon.loss.L2Loss(), trainer, [mx.nd.ones((2, 3))], [mx.nd.zeros((2, 2))], scaler)


def test_the_function_api_with_dtype_strings_refuses_an_amp_precision_never_activated(never_activated):
    """cast_net with the precision's param_dtype (a string), a plain Trainer and train_step without a scaler: the
    path that once trained float32 without a word. A float32 run on the same path is not bothered."""
    net = _net()
    assert never_activated.param_dtype == "float32" and never_activated.data_dtype == "float32"
    with pytest.raises(AMPStateError, match="activate\\(precision\\) was not called"):
        mxfp16.cast_net(net, never_activated.param_dtype)
    float32 = mxfp16.resolve_precision("float32", CPU)
    for dtype in (float32.param_dtype, "float32", np.float32):
        mxfp16.cast_net(net, dtype)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    data, label = mxfp16.cast_batch(mx.nd.ones((2, 3)), mx.nd.zeros((2, 2)), float32.data_dtype, CPU)
    assert mxfp16.train_step(net, gluon.loss.L2Loss(), trainer, data, label).loss_scale == 1.0


def test_make_loss_scaler_takes_the_precision_first():
    fp32 = mxfp16.resolve_precision("float32", CPU)
    with pytest.raises(TypeError, match="precision first.*swap the two"):
        mxfp16.make_loss_scaler(None, fp32)
    with pytest.raises(TypeError, match="precision first"):
        mxfp16.make_loss_scaler("dynamic")
    assert mxfp16.make_loss_scaler(fp32, "dynamic").precision is fp32


def test_mixed_precision_is_the_pieces_in_two_statements():
    """MixedPrecision + prepare + cast_batch + train_step equal the calls they stand for."""
    x, y = mx.nd.array(np.random.RandomState(0).normal(size=(8, 3))), mx.nd.array([0, 1] * 4)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    net, pieces = _net(), _net()
    net(x), pieces(x)
    for a, b in zip(pieces.collect_params().values(), net.collect_params().values()):
        a.set_data(b.data())

    mp = mxfp16.MixedPrecision("float32", "cpu", loss_scale=1024)
    trainer = mp.prepare(net, "sgd", {"learning_rate": 0.1})

    precision = mxfp16.resolve_precision("float32", CPU)
    mxfp16.activate(precision)
    mxfp16.cast_net(pieces, precision)
    scaler = mxfp16.make_loss_scaler(precision, 1024)
    p_trainer = mxfp16.make_trainer(pieces.collect_params(), "sgd", {"learning_rate": 0.1}, precision, scaler)
    for _ in range(2):
        result = mp.train_step(net, loss_fn, trainer, *mp.cast_batch(x, y))
        mxfp16.train_step(pieces, loss_fn, p_trainer, *mxfp16.cast_batch(x, y, precision.data_dtype, CPU), scaler)
    for a, b in zip(pieces.collect_params().values(), net.collect_params().values()):
        np.testing.assert_array_equal(a.data().asnumpy(), b.data().asnumpy())
    assert mp.scaler.scale == 1024.0 and mp.scaler.steps == 2 and result.loss_scale == 1024.0
    assert mp.ctx == CPU and mp.precision.name == "float32"


def test_mixed_precision_prepares_float16_with_master_weights_and_a_dynamic_scaler():
    from mxfp16.models import elementwise_mlp

    mp = mxfp16.MixedPrecision("float16", "cpu", allow_cpu_float16=True)
    net = elementwise_mlp(2, [4], 2)
    net.initialize(ctx=mp.ctx)
    trainer = mp.prepare(net, "sgd", {"learning_rate": 0.1})
    assert mp.scaler.dynamic and mp.scaler.enabled and trainer.optimizer.multi_precision
    dtypes = mxfp16.dtype_report(net)
    assert {d for n, d in dtypes.items() if "batchnorm" not in n} == {"float16"}
    assert {d for n, d in dtypes.items() if "batchnorm" in n} == {"float32"}
    result = mp.train_step(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer,
                           *mp.cast_batch(mx.nd.ones((4, 2)), mx.nd.zeros(4)))
    assert result.loss.dtype == np.float32 and np.isfinite(result.loss.item())


LATE_CHILD = """
import mxfp16, mxnet as mx
from mxnet import gluon, npx
from mxfp16.models import elementwise_mlp
from mxfp16.precision import AMPStateError
precision = mxfp16.resolve_precision("amp-float16", "cpu", allow_cpu_float16=True)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(4, activation="relu"), gluon.nn.Dense(2))
net.initialize()
net.hybridize()
net(mx.nd.ones((1, 3)))              # the graph is built, in float32
plain = gluon.nn.Sequential()        # not hybridized: Gluon builds a graph only to infer the deferred shapes
plain.add(gluon.nn.Dense(4), gluon.nn.Dense(2))
plain.initialize()
plain(mx.nd.ones((1, 3)))
mxfp16.activate(precision)          # too late for net's graph; plain runs imperatively, through AMP's wrappers
try:
    mxfp16.cast_net(net, precision)
except AMPStateError as err:
    print("refused:", err)
net.hybridize()                     # drops the graph: the next forward builds it under AMP
mxfp16.cast_net(net, precision)
mxfp16.cast_net(plain, precision)
print("after hybridize, and the unhybridized net: accepted")

small = elementwise_mlp(2, [4], 2, batchnorm=False)
small.initialize()
small.collect_params().setattr("grad_req", "add")
scaler = mxfp16.make_loss_scaler(precision)
trainer = mxfp16.make_trainer(small.collect_params(), "sgd", {"learning_rate": 0.1}, precision, scaler)
try:
    mxfp16.train_step(small, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, [mx.nd.ones((2, 2))], [mx.nd.zeros(2)],
                      scaler)
except ValueError as err:
    print("add refused:", err)

npx.set_np()
numpy_net = gluon.nn.HybridSequential()       # numpy mode, built after activate: its graph carries the casts too
numpy_net.add(gluon.nn.Dense(2))
numpy_net.initialize()
numpy_net.hybridize()
numpy_net(mx.np.ones((1, 3)))
mxfp16.cast_net(numpy_net, precision)
print("numpy mode: accepted")
"""


def test_activate_after_the_graph_was_built_and_grad_req_add_under_amp_are_refused():
    lines = run_python(LATE_CHILD, timeout=180).stdout.strip().splitlines()
    refused = next(line for line in lines if line.startswith("refused:"))
    assert "built before mxfp16.activate(precision)" in refused and "net.hybridize() again" in refused
    assert "after hybridize, and the unhybridized net: accepted" in lines and "numpy mode: accepted" in lines
    added = next(line for line in lines if line.startswith("add refused:"))
    assert "amp_cast ignores it" in added and "scaler.accumulate(trainer)" in added



# --------------------------------------------------------------------------
# One set-up path: the README's MixedPrecision and `mxfp16 train` build the same parts and environment.
# --------------------------------------------------------------------------
SAME_PARTS = """
import json, os, sys
import mxfp16
from mxfp16.models import build_model
from mxfp16.train import TrainConfig, prepare
from mxfp16._internals import amp_initialized

precision, data_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
allow = precision in ("float16", "amp-float16")


def describe(mp, net, trainer, environment):
    dtypes = list(mxfp16.dtype_report(net).values())
    return {"precision": mp.precision.name, "param_dtypes": dtypes, "amp": amp_initialized(),
            "optimizer": type(trainer.optimizer).__name__, "multi_precision": bool(trainer.optimizer.multi_precision),
            "update_on_kvstore": trainer._update_on_kvstore, "scaler": {k: mp.scaler.state_dict()[k]
            for k in ("enabled", "dynamic", "init_scale", "growth_interval")},
            "environment": {name: value for name, (value, _, _) in environment.items()},
            "process_environment": {name: os.environ.get(name) for name in environment}}


# 1. the README's path, with the trainer's model, and its optimizer settings
mp = mxfp16.MixedPrecision(precision, "cpu", allow_cpu_float16=allow, log=lambda line: None)
net = build_model("elementwise-mlp", 3, in_shape=(3, 16, 16), ctx=mp.ctx)
net.hybridize(static_alloc=True, static_shape=True)
trainer = mp.prepare(net, "sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}, update_on_kvstore=False)
readme = describe(mp, net, trainer, mp.environment)
for name in mp.environment:  # unset again: the trainer's path must set them itself
    os.environ.pop(name, None)
# 2. mxfp16 train's set-up, in the same process (AMP, where on, is already on for the same target)
run = prepare(TrainConfig(model="elementwise-mlp", precision=precision, allow_cpu_float16=allow, data_dir=data_dir,
                          image_size=16, batch_size=8, epochs=1, lr=0.05, out=out, progress=False),
              log=lambda line: None)
trained = describe(run.parts.mixed, run.parts.net, run.parts.trainer, run.parts.environment)
run.lock.release()
print(json.dumps({"readme": readme, "train": trained}))
"""


@pytest.mark.parametrize("precision", ["float32", "float16", "amp-float16",
                                       pytest.param("amp-bfloat16", marks=requires_bfloat16)])
def test_the_readme_set_up_and_mxfp16_train_build_the_same_parts_and_environment(precision, tmp_path):
    """Each precision in its own process (AMP is process-global); float16 on a CPU through the elementwise MLP."""
    from train_support import tiny_dataset

    data_dir = tiny_dataset(tmp_path)
    # The float16 variables start unset: each path must set them itself.
    code = "import os\nfor name in ('MXNET_SAFE_ACCUMULATION', 'MXNET_CUDNN_AUTOTUNE_DEFAULT'):\n" \
           "    os.environ.pop(name, None)\n" + SAME_PARTS
    proc = run_python(f"import sys; sys.argv = ['x', {precision!r}, {str(data_dir)!r}, {str(tmp_path / 'run')!r}]\n"
                      + code, timeout=300)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["readme"] == result["train"]
    readme = result["readme"]
    assert readme["precision"] == precision and readme["environment"]["MXNET_SAFE_ACCUMULATION"] == "1"
    assert readme["process_environment"] == readme["environment"]
    assert readme["amp"] == precision.startswith("amp-")
    assert readme["multi_precision"] == (precision == "float16")
