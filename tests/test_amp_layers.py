"""Every Gluon layer under mxfp16's AMP: it trains, it matches float32, and the table says what it runs in.

One child process per precision trains every entry of
``mxfp16.amp.table.LAYERS`` three SGD steps (``tests/amp_layer_child.py``);
the float32 run is the control. amp-bfloat16 runs twice: with mxfp16's lists,
and with the ``measured`` lists keeping every convolution and dense layer in
float32, as a measurement that found none gaining would. bfloat16 keeps 8 bits of mantissa, so the
16-bit gradients are compared with a tolerance of a few times its rounding
step (2^-8 = 0.4%), relative to the layer's largest gradient.
"""
import inspect
import json
import os
import subprocess
import sys

from mxfp16.amp import table as amp_table

import numpy as np
import pytest
from conftest import child_env, requires_bfloat16

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = os.path.join(REPO, "tests", "amp_layer_child.py")

#: Layers that train in genuine float16 on a CPU (``net.cast('float16')``): they are
#: elementwise, pooling or normalisation, with no GEMM (FullyConnected,
#: Convolution, RNN, batch_dot), which MXNet has only on GPUs in float16.
FLOAT16_ON_CPU = [
    "nn.Activation(relu)", "nn.Activation(sigmoid)", "nn.Activation(tanh)", "nn.Activation(softrelu)",
    "nn.LeakyReLU", "nn.PReLU", "nn.ELU", "nn.SELU", "nn.GELU", "nn.Swish", "nn.BatchNorm",
    "nn.LayerNorm", "nn.GroupNorm", "nn.Embedding", "nn.Flatten", "nn.MaxPool1D", "nn.MaxPool2D",
    "nn.MaxPool3D", "nn.AvgPool1D", "nn.AvgPool2D", "nn.AvgPool3D", "nn.GlobalMaxPool1D",
    "nn.GlobalMaxPool2D", "nn.GlobalMaxPool3D", "nn.GlobalAvgPool1D", "nn.GlobalAvgPool2D",
    "nn.GlobalAvgPool3D", "nn.ReflectionPad2D", "contrib.nn.PixelShuffle1D",
    "contrib.nn.PixelShuffle2D", "contrib.nn.PixelShuffle3D", "contrib.nn.Identity",
]
#: Dropout draws its mask per dtype, so a float16 run drops other units than
#: float32: these only have to train.
RANDOM = {"nn.Dropout", "rnn.DropoutCell"}


def _train(precision, tmp_path_factory, lists="mxfp16"):
    out = tmp_path_factory.mktemp("layers") / f"{precision}-{lists}.npz"
    env = child_env()
    proc = subprocess.run([sys.executable, CHILD, precision, str(out), lists], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    arrays = np.load(out)
    return json.loads(str(arrays["report"])), {k: arrays[k] for k in arrays.files if k != "report"}


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    return _train("float32", tmp_path_factory)


@pytest.fixture(scope="module", params=["mxfp16", "measured"])
def bfloat16(request, tmp_path_factory):
    """amp-bfloat16 with mxfp16's lists, and with every convolution and dense layer kept float32 by measurement."""
    return _train("amp-bfloat16", tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def float16(tmp_path_factory):
    return _train("float16", tmp_path_factory)


def _gradients(arrays, index):
    grads, j = [], 0
    while f"{index}_{j}" in arrays:
        grads.append(arrays[f"{index}_{j}"].astype(np.float64))
        j += 1
    return grads


def _worst_gradient_error(low, ref):
    """Largest ``|g - g_ref|`` over the layer's gradients, relative to its largest reference gradient."""
    scale = max(max(np.abs(g).max() for g in ref), 1e-12) if ref else 1.0
    return max((np.abs(g - r).max() / scale for g, r in zip(low, ref)), default=0.0)


def _compare(run, control, names, tolerance):
    report, arrays = run
    ref_report, ref_arrays = control
    problems = []
    for index, layer in enumerate(amp_table.LAYERS):
        if layer.name not in names:
            continue
        if "error" in report[layer.name]:
            problems.append(f"{layer.name}: {report[layer.name]['error']}")
            continue
        assert "error" not in ref_report[layer.name], ref_report[layer.name]
        if layer.name in RANDOM:
            continue
        low, ref = _gradients(arrays, index), _gradients(ref_arrays, index)
        assert len(low) == len(ref) > 0 or layer.tokens, layer.name
        err = _worst_gradient_error(low, ref)
        losses, ref_losses = report[layer.name]["losses"], ref_report[layer.name]["losses"]
        loss_err = max(abs(a - b) for a, b in zip(losses, ref_losses)) / max(abs(ref_losses[0]), 1e-6)
        if err > tolerance or loss_err > tolerance:
            problems.append(f"{layer.name}: gradient error {err:.4f}, loss error {loss_err:.4f} "
                            f"(tolerance {tolerance})")
    return problems


def test_every_gluon_layer_class_has_a_row_or_is_a_container():
    from mxnet import gluon
    from mxnet.gluon import nn, rnn
    from mxnet.gluon.contrib import nn as cnn

    rows = {layer.name.split("(")[0] for layer in amp_table.LAYERS}
    missing = []
    for prefix, module in (("nn", nn), ("rnn", rnn), ("contrib.nn", cnn)):
        for name, cls in vars(module).items():
            if inspect.isclass(cls) and issubclass(cls, gluon.Block):
                if f"{prefix}.{name}" not in rows and name not in amp_table.CONTAINERS[prefix]:
                    missing.append(f"{prefix}.{name}")
    assert not missing, f"Gluon layers with no row in mxfp16.amp.table.LAYERS: {missing}"


@requires_bfloat16
def test_every_layer_trains_under_amp_bfloat16_like_float32(bfloat16, control):
    names = {layer.name for layer in amp_table.LAYERS}
    problems = _compare(bfloat16, control, names, tolerance=0.03)
    assert not problems, "\n".join(problems)


def test_elementwise_layers_train_in_float16_on_cpu_like_float32(float16, control):
    problems = _compare(float16, control, set(FLOAT16_ON_CPU) | RANDOM, tolerance=0.01)
    assert not problems, "\n".join(problems)


def test_the_control_is_sensitive(control, tmp_path_factory):
    # The comparison must be able to fail: a run with another seed's weights is far off.
    report, arrays = control
    index = next(i for i, layer in enumerate(amp_table.LAYERS) if layer.name == "rnn.LSTM")
    shifted = [g + 0.05 * np.abs(g).max() for g in _gradients(arrays, index)]
    assert _worst_gradient_error(shifted, _gradients(arrays, index)) > 0.03


def test_amp_table_in_docs_is_the_generated_one():
    generated = amp_table.generate("bfloat16")
    with open(os.path.join(REPO, "docs", "amp-table.md"), encoding="utf-8") as f:
        doc = f.read()
    assert generated in doc, "docs/amp-table.md is out of date: regenerate it with `mxfp16 info --amp-table`"
    assert "FAILS" not in generated


def test_amp_table_float16_types_every_layer():
    assert "FAILS" not in amp_table.generate("float16")


def test_amp_table_reads_the_graph_not_a_list():
    rows = {row.split(" | ")[0].strip("| "): row for row in amp_table.generate("bfloat16").splitlines()}
    # The same operator, two dtypes, decided by what AMP did: relu follows its
    # input; the 7x7 stem convolution is mxfp16's float32 rule; batch_dot has no
    # bfloat16 kernel.
    assert rows["nn.Activation(relu)"].endswith("| Activation float32 | Activation bfloat16 |")
    assert "Convolution float32" in rows["nn.Conv2D(7x7 stem)"]
    assert "Convolution bfloat16" in rows["nn.Conv2D"]
    assert "batch_dot float32" in rows["self-attention (Dense, batch_dot, softmax, LayerNorm)"]


def test_cli_prints_the_table():
    proc = subprocess.run([sys.executable, "-m", "mxfp16", "info", "--amp-table"], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == amp_table.generate("bfloat16")


FALLBACK_CHILD = r"""
import warnings
import mxfp16
import mxnet as mx
from mxnet import gluon, nd, autograd
from mxfp16.float_formats import BFLOAT16
mxfp16.activate(mxfp16.resolve_precision("amp-bfloat16", "cpu"))
caught = []
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    a = nd.amp_cast(nd.ones((2, 3, 4)), dtype=BFLOAT16)
    for _ in range(3):
        out = nd.batch_dot(a, a, transpose_b=True)
    x = mx.sym.var("x")
    mx.sym.batch_dot(x, x)
    mx.sym.zeros((2, 3))  # no inputs: must not raise (it did inside AMP)
print(out.dtype.__name__, len([w for w in caught if "batch_dot" in str(w.message)]),
      [type(w.message).__name__ for w in caught][:1])
"""


@requires_bfloat16
def test_an_operator_without_a_bfloat16_kernel_runs_in_float32_and_warns_once():
    proc = subprocess.run([sys.executable, "-c", FALLBACK_CHILD], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dtype, count, kind = proc.stdout.split(None, 2)
    assert dtype == "float32" and count == "1" and "Float32Fallback" in kind, proc.stdout


def test_fallbacks_come_from_the_probe_and_exclude_what_bfloat16_runs():
    from mxfp16.amp.lists import float32_fallbacks, op_verdicts, operator_lists

    probe = op_verdicts()

    fallbacks = set(float32_fallbacks())
    assert {"dot", "batch_dot"} <= fallbacks
    assert not fallbacks & set(probe.BFLOAT16)
    fp32 = set(operator_lists("bfloat16")["fp32_ops"])
    # The lists name legacy operators; mxfp16.amp.numpy_mode applies the numpy-mode fallbacks (_np_dot ...).
    legacy = {name for name in fallbacks if not name.startswith(("_np_", "_npx_", "_npi_"))}
    assert legacy <= fp32 and legacy != fallbacks
    assert not fp32 & set(operator_lists("bfloat16")["target_precision_ops"])
    # MXNet's own lists stay MXNet's
    assert not fallbacks & set(operator_lists("bfloat16", "mxnet")["fp32_ops"]) - set(
        __import__("mxnet").contrib.amp.lists.symbol_bf16.FP32_FUNCS)


PROBE_SAMPLE = ["dot", "batch_dot", "broadcast_add", "where", "elemwise_mul", "cumsum",
                "_contrib_interleaved_matmul_selfatt_qk", "_contrib_ROIAlign", "_np_dot", "_npi_add", "_np_reshape"]


@requires_bfloat16
def test_probe_verdicts_hold_on_the_installed_wheel():
    sys.path.insert(0, os.path.join(REPO, "tools"))
    try:
        import amp_probe_ops
    finally:
        sys.path.pop(0)
    from mxfp16.amp.lists import op_verdicts

    probe = op_verdicts()

    results = amp_probe_ops.scan(PROBE_SAMPLE)
    for name in PROBE_SAMPLE:
        recorded = next(v for v in ("bfloat16", "float32", "unprobed") if name in getattr(probe, v.upper()))
        assert results[name][0] == recorded, (name, results[name], recorded)
    joins = amp_probe_ops.scan(["Concat", "_npi_add", "elemwise_add"], "join")
    assert joins["Concat"].keys() == probe.JOINS["Concat"].keys() == {"bfloat16", "float16"}
    assert joins["_npi_add"].keys() == probe.JOINS["_npi_add"].keys() == {"bfloat16"}  # numpy promotes float16
    # elemwise_add is a join too, but MXNet's WIDEST_TYPE_CASTS has it: the probe leaves it to AMP.
    assert joins["elemwise_add"] and "elemwise_add" not in probe.JOINS


CUSTOM_CHILD = r"""
import numpy as np
import mxfp16
import mxnet as mx
from mxnet import autograd, gluon, nd

mxfp16.activate(mxfp16.resolve_precision("amp-bfloat16", "cpu"))
seen = []

class Square(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        seen.append(in_data[0].dtype)
        x = in_data[0].asnumpy()                      # numpy has no bfloat16: float32 is required
        self.assign(out_data[0], req[0], nd.array(x * x))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        self.assign(in_grad[0], req[0], 2 * in_data[0] * out_grad[0])

@mx.operator.register("square_mxfp16_test")
class SquareProp(mx.operator.CustomOpProp):
    def __init__(self):
        super().__init__(need_top_grad=True)
    def list_arguments(self):
        return ["data"]
    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], []
    def create_operator(self, ctx, shapes, dtypes):
        return Square()

class Net(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4)
    def hybrid_forward(self, F, x):
        return F.Custom(self.dense(x), op_type="square_mxfp16_test")

for hybrid in (False, True):
    net = Net(); net.initialize()
    if hybrid:
        net.hybridize()
    x = nd.ones((2, 3))
    with autograd.record():
        y = net(x)
    y.backward()
    nd.waitall()
    assert y.dtype == np.float32, y.dtype
print(sorted({str(np.dtype(d)) for d in seen}))
"""


@requires_bfloat16
def test_a_custom_op_after_a_bfloat16_layer_receives_float32():
    proc = subprocess.run([sys.executable, "-c", CUSTOM_CHILD], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "['float32']", proc.stdout


DIRECT_CHILD = r"""
import mxfp16
import mxnet as mx
from mxnet import autograd, nd
from mxfp16.float_formats import BFLOAT16
from mxfp16.amp.table import LAYERS

mxfp16.activate(mxfp16.resolve_precision("amp-bfloat16", "cpu"))
failed = []
for layer in LAYERS:
    if layer.tokens or layer.numpy_mode or layer.states:
        continue
    try:
        block = layer.build()
        block.initialize()
        if layer.hybridize:
            block.hybridize()
        # What a hybridized layer inside a plain Block gets: the previous layer's bfloat16 output.
        # (MXNet cannot take a gradient with respect to a bfloat16 array, so only the parameters get one.)
        x = nd.amp_cast(nd.random.uniform(-1, 1, shape=layer.shape), dtype=BFLOAT16)
        trained = [p for p in block.collect_params().values() if p.grad_req != "null"]
        with autograd.record(train_mode=True):
            out = block(x)
            out = out[0] if isinstance(out, (list, tuple)) else out
            loss = nd.amp_cast(out, dtype="float32").sum()
        if trained:
            loss.backward()
        nd.waitall()
    except Exception as err:
        failed.append(f"{layer.name}: {str(err).splitlines()[-1][:200]}")
print("\n".join(failed) or "none failed")
"""


@requires_bfloat16
def test_every_hybridized_layer_takes_a_bfloat16_array_from_outside_its_graph():
    proc = subprocess.run([sys.executable, "-c", DIRECT_CHILD], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "none failed", proc.stdout
