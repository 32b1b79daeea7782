"""numpy-mode networks under mxfp16's AMP: the mx.np / mx.npx functions get the lists, and train like float32.

The layer tests' method: one child process per precision trains the same two
networks three SGD steps (``tests/amp_numpy_child.py``: d2l's residual block,
a join and a Dense head, once as an imperative ``nn.Block``, once
hybridized); the float32 run is the control. bfloat16 keeps 8 bits of
mantissa, so gradients are compared with a tolerance of a few times its
rounding step, relative to the network's largest gradient.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, child_env, last_line_json, requires_bfloat16, run_python

CHILD = os.path.join(REPO, "tests", "amp_numpy_child.py")
TOLERANCE = 0.03


def _train(precision, tmp_path_factory):
    out = tmp_path_factory.mktemp("numpy") / f"{precision}.npz"
    env = child_env()
    proc = subprocess.run([sys.executable, CHILD, precision, str(out)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    arrays = np.load(out)
    return json.loads(str(arrays["report"])), {k: arrays[k] for k in arrays.files if k != "report"}


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    return _train("float32", tmp_path_factory)


@pytest.fixture(scope="module")
def bfloat16(tmp_path_factory):
    return _train("amp-bfloat16", tmp_path_factory)


def _grads(arrays, kind):
    return [arrays[f"{kind}_{j}"].astype(np.float64) for j in range(len(arrays)) if f"{kind}_{j}" in arrays]


def _worst_error(low, ref):
    """Largest ``|g - g_ref|`` over the network's gradients, relative to its largest reference gradient."""
    scale = max(np.abs(g).max() for g in ref)
    return max(np.abs(a - b).max() for a, b in zip(low, ref)) / scale


@requires_bfloat16
@pytest.mark.parametrize("kind", ["imperative", "hybridized"])
def test_a_numpy_mode_network_trains_in_bfloat16_like_float32(kind, bfloat16, control):
    report, arrays = bfloat16
    ref_report, ref_arrays = control
    assert report[kind]["output_dtype"] == "bfloat16", report[kind]
    assert ref_report[kind]["output_dtype"] == "float32"
    low, ref = _grads(arrays, kind), _grads(ref_arrays, kind)
    assert len(low) == len(ref) == 14
    assert _worst_error(low, ref) < TOLERANCE
    losses, ref_losses = report[kind]["losses"], ref_report[kind]["losses"]
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) / ref_losses[0] < TOLERANCE
    assert losses != ref_losses  # it did compute in bfloat16


@requires_bfloat16
def test_the_hybridized_graph_runs_its_layers_in_bfloat16(bfloat16, control):
    dtypes = bfloat16[0]["hybridized"]["graph_dtypes"]
    assert dtypes.get("bfloat16", 0) >= 8, dtypes
    assert control[0]["hybridized"]["graph_dtypes"].get("bfloat16", 0) == 0
    assert bfloat16[0]["ran_in_target_dtype"] and not control[0]["ran_in_target_dtype"]


@requires_bfloat16
def test_the_comparison_can_fail(control):
    _, arrays = control
    ref = _grads(arrays, "imperative")
    shifted = [g + 0.05 * max(np.abs(r).max() for r in ref) for g in ref]
    assert _worst_error(shifted, ref) > TOLERANCE


def test_numpy_functions_take_their_legacy_operators_rule():
    from mxfp16.amp.lists import join_operators, operator_lists
    from mxfp16.amp.numpy_mode import numpy_operators, numpy_rules

    operators = numpy_operators()
    assert operators["_npx_fully_connected"] == ["FullyConnected", "_sparse_FullyConnected"]
    assert operators["_npi_concatenate"] == []
    lists = operator_lists("bfloat16")
    rules = numpy_rules(lists, "bfloat16", set(), set(join_operators("bfloat16")), {"batch_dot", "_np_dot"})
    assert rules["_npx_fully_connected"] == ("target", None)
    assert rules["_npx_convolution"] == ("target", None)
    assert rules["_npx_softmax"] == ("float32", None)  # MXNet's float32 list, as softmax
    assert rules["_npx_batch_dot"] == ("float32", "batch_dot")  # a fallback: warns as batch_dot
    assert rules["_np_dot"] == ("float32", "_np_dot")
    assert rules["_npx_leaky_relu"][0] == "conditional"  # PReLU and ELU in float32, as LeakyReLU
    assert rules["_npi_concatenate"] == ("widest", None)  # a join
    assert "_npx_relu" not in rules and "_npx_batch_norm" not in rules  # they follow their input


def test_numpy_mode_layers_and_joins_type_as_16_bit_on_any_cpu():
    # Type inference only, so it runs on any CPU: the amp-float16 lists (which have no stem rule) reach the
    # numpy-mode Convolution Gluon calls, and numpy's concatenate of two float16 branches stays float16.
    code = """
        import json, warnings
        warnings.simplefilter("ignore")
        import mxfp16, mxnet as mx
        from mxnet import gluon, npx
        from mxfp16.amp.table import Layer, layer_dtypes, StemJoin
        mxfp16.activate(mxfp16.resolve_precision("amp-float16", "cpu", allow_cpu_float16=True))
        rows = layer_dtypes(Layer("x", lambda: StemJoin(), (2, 3, 8, 8), numpy_mode=True))
        print(json.dumps(rows))
        assert mx.numpy_extension.fully_connected is mx.numpy_extension._op.fully_connected
        assert mx.numpy_extension.fully_connected.__name__ == "fully_connected"
        assert mx.nd.numpy_extension.convolution is mx.nd.numpy_extension._op.convolution
        assert mx.nd.numpy._internal.concatenate.__name__ == "concatenate"
    """
    rows = last_line_json(run_python(code).stdout)
    assert rows == [["Convolution", "float16"], ["Convolution", "float16"], ["_npi_concatenate", "float16"]], rows


def test_float32_fallbacks_name_numpy_operators_but_the_lists_do_not():
    from mxfp16.amp.lists import float32_fallbacks, operator_lists

    fallbacks = set(float32_fallbacks())
    assert "_np_dot" in fallbacks and "batch_dot" in fallbacks
    assert not any(n.startswith(("_np_", "_npx_", "_npi_")) for n in operator_lists("bfloat16")["fp32_ops"])


WARN_CHILD = r"""
import warnings
import mxfp16
import mxnet as mx
from mxnet import gluon, npx

warnings.simplefilter("always")
precision = mxfp16.resolve_precision("amp-bfloat16", "cpu")
mxfp16.activate(precision)
npx.set_np()


class Pair(gluon.HybridBlock):
    # A numpy-mode network returning a tuple; with dense=False it has no layer AMP casts to bfloat16.
    def __init__(self, dense, **kwargs):
        super().__init__(**kwargs)
        self._dense = dense
        self.scale = self.params.get("scale", shape=(3,), init=mx.init.One())
        self.out = gluon.nn.Dense(2) if dense else None

    def hybrid_forward(self, F, x, scale):
        h = F.np.tanh(x * scale)
        return (self.out(h) if self._dense else h[:, :2]), h


def run(dense):
    net = Pair(dense)
    net.initialize()
    net.hybridize()
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, precision,
                                  mxfp16.make_loss_scaler(precision))
    loss = gluon.loss.L2Loss()
    lossfn = lambda out, y: loss(out[0], y)
    with warnings.catch_warnings(record=True) as caught:
        for _ in range(3):
            x, y = mx.np.ones((2, 3)), mx.np.zeros((2, 2))
            mxfp16.train_step(net, lossfn, trainer, [x], [y], mxfp16.make_loss_scaler(precision))
    return sum("numpy-mode network" in str(w.message) and type(w.message).__name__ == "Float32Fallback"
               for w in caught)


print(run(dense=DENSE))
"""


@requires_bfloat16
@pytest.mark.parametrize("dense, warnings", [(False, "1"), (True, "0")])
def test_a_numpy_mode_network_warns_once_only_when_nothing_ran_in_bfloat16(dense, warnings):
    # The network returns a tuple; with a Dense layer it runs that in bfloat16 and is not warned about.
    proc = run_python(WARN_CHILD.replace("DENSE", str(dense)))
    assert proc.stdout.split()[-1:] == [warnings], proc.stdout + proc.stderr[-1500:]


def test_the_only_numpy_function_that_bypasses_the_operator_functions_is_wrapped():
    # A Python function in mxnet.ndarray.numpy that calls _api_internal reaches its operator without the
    # generated function mxfp16 wraps; FFI_FUNCTIONS must name every such function that takes tensors.
    import re

    from mxfp16.amp.numpy_mode import FFI_FUNCTIONS

    import mxnet

    with open(os.path.join(os.path.dirname(mxnet.__file__), "ndarray", "numpy", "_op.py"), encoding="utf-8") as f:
        source = f.read()
    called = set(re.findall(r"_api_internal\.(\w+)\(", source))
    wrapped = {function for homes in FFI_FUNCTIONS.values() for _, function in homes}
    assert called - wrapped == {"zeros"}, called  # zeros takes a shape, no tensor


def test_what_numpy_mode_cannot_do_in_bfloat16_in_mxnet_1_9_1():
    # MXNet 1.9.1's numpy-mode arrays cannot be created in bfloat16: mx.np.empty (which astype and a slice
    # assignment of float32 values into a bfloat16 array call) looks the dtype up by its numpy type, and
    # numpy has no bfloat16 (MXNet's is a structured dtype, numpy.void). The legacy mx.nd.empty can.
    # docs/amp-table.md ("numpy mode") says so; when this starts to pass, say it no longer.
    from mxfp16.amp.wrappers import dtype_name
    from mxfp16.float_formats import BFLOAT16

    import mxnet as mx

    assert dtype_name(mx.nd.empty((1,), dtype=BFLOAT16).dtype) == "bfloat16"
    with pytest.raises(KeyError):
        mx.np.empty((1,), dtype=BFLOAT16)
    y = mx.nd.zeros((2, 3)).astype(BFLOAT16).as_np_ndarray()  # what a bfloat16 layer hands on
    with pytest.raises(KeyError):
        y[:] = mx.np.ones((2, 3))
