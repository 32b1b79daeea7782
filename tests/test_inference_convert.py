"""Conversion for inference: which layers run in which dtype, what the graph takes and gives, and the lists."""
from mxfp16.amp.lists import float32_layers
from mxfp16.float_formats import BFLOAT16
from mxfp16.inference.agreement import AgreementError, check_margin, compare
from mxfp16.inference.convert import _placeable, deployable, load_block, traced
from mxfp16.precision import resolve_precision
from mxfp16.train.parts import PartsSpec, build_network

import mxnet as mx
import numpy as np
import pytest
from conftest import requires_bfloat16


def _network(model="resnet18_v1", dtype="float32", size=32):
    return build_network(PartsSpec(model=model, classes=5, image_size=size, seed=0), [mx.cpu()], dtype)


def _output_dtypes(symbol):
    """``{internal output name: dtype}`` when ``data`` is float32."""
    internals = symbol.get_internals()
    _, out_types, _ = internals.infer_type(data=np.float32)
    return dict(zip(internals.list_outputs(), out_types))


# The conversion is a graph pass: nothing runs, so it is checked on every CPU, one without bfloat16 arithmetic
# included, where resolving amp-bfloat16 for the CPU is refused (resolving for a GPU touches no device).
AMP_BFLOAT16 = resolve_precision("amp-bfloat16", "gpu:0")


@pytest.mark.parametrize("lists, stem", [("mxfp16", np.float32), ("mxnet", BFLOAT16)])
def test_amp_conversion_runs_convolutions_in_bfloat16_and_the_stem_as_the_lists_say(lists, stem):
    net = _network()
    model = deployable(net, AMP_BFLOAT16, lists)
    types = _output_dtypes(model.symbol)
    convs = {name: t for name, t in types.items() if name.endswith("_fwd_output") and "conv" in name}
    stem_name = float32_layers(traced(net)[0], "bfloat16", "mxfp16")[0] + "_output"
    assert convs.pop(stem_name) == stem
    assert convs and set(convs.values()) == {BFLOAT16}
    assert types[model.symbol.list_outputs()[0]] == np.float32  # float32 logits out
    assert model.notes["float32_layers"] == ([stem_name[:-len("_output")]] if lists == "mxfp16" else [])


def test_float16_conversion_casts_in_and_out_and_keeps_batchnorm_float32():
    model = deployable(_network(dtype="float16"), resolve_precision("float16", "cpu", allow_cpu_float16=True))
    types = _output_dtypes(model.symbol)
    assert types[model.symbol.list_outputs()[0]] == np.float32
    kinds = {k: v.dtype for k, v in model.params.items()}
    assert {t for k, t in kinds.items() if "batchnorm" in k} == {np.float32}
    assert {t for k, t in kinds.items() if "batchnorm" not in k} == {np.float16}


def test_a_network_in_the_wrong_dtype_is_refused():
    with pytest.raises(ValueError, match="needs a network with float16 parameters"):
        deployable(_network(), resolve_precision("float16", "cpu", allow_cpu_float16=True))
    with pytest.raises(ValueError, match="needs a network with float32 parameters"):
        deployable(_network(dtype="float16"), AMP_BFLOAT16)
    routed = _network()  # a layer given bfloat16 weights (mxfp16.amp.bfloat16_deconvolution) names its dtype
    next(iter(routed.collect_params().values())).cast(BFLOAT16)
    with pytest.raises(ValueError, match=r"this one has bfloat16, float32 .*cast_net\(net, 'float32'\)"):
        deployable(routed, resolve_precision("float32", "cpu"))


def test_the_loaded_block_computes_what_the_network_computes():
    net = _network(size=24)
    x = mx.nd.random.uniform(shape=(3, 3, 24, 24))
    exported = deployable(net, resolve_precision("float32", "cpu"))
    assert np.array_equal(load_block(exported.symbol, exported.params, mx.cpu())(x).asnumpy(), net(x).asnumpy())


@requires_bfloat16
def test_the_loaded_bfloat16_block_computes_close_to_the_network():
    net = _network(size=24)
    x = mx.nd.random.uniform(shape=(3, 3, 24, 24))
    converted = deployable(net, resolve_precision("amp-bfloat16", "cpu"))
    out = load_block(converted.symbol, converted.params, mx.cpu())(x)
    assert out.dtype == np.float32
    reference = net(x).asnumpy()
    # bfloat16 keeps 8 significant bits: close, not equal.
    assert 0 < np.abs(out.asnumpy() - reference).max() < 0.1 * np.abs(reference).max() + 0.1


def test_list_entries_the_graph_pass_cannot_place_are_cut_and_named():
    lists = {"target_precision_ops": ["Convolution", "FullyConnected"], "fp32_ops": ["softmax", "elemwise_add"],
             "conditional_fp32_ops": [("Activation", "act_type", ["softrelu"])]}
    kept, dropped = _placeable(lists, "bfloat16")
    assert dropped == ["elemwise_add"]  # only AMP's widest-type rule knows it
    assert kept["fp32_ops"] == ["softmax"] and kept["target_dtype_ops"] == ["Convolution", "FullyConnected"]
    assert kept["conditional_fp32_ops"] == [("Activation", "act_type", ["softrelu"])]


def _block(logits):
    """A stand-in model that answers each batch with the next rows of ``logits``."""
    rows = iter(np.asarray(logits, dtype=np.float32))
    return lambda x: mx.nd.array(np.stack([next(rows) for _ in range(x.shape[0])]))


def test_compare_counts_accuracy_changed_predictions_and_the_largest_probability_gap():
    labels = np.array([0, 1, 1, 0], dtype=np.float32)
    reference = [[3, 0], [0, 3], [3, 0], [3, 0]]       # right, right, wrong, right
    candidate = [[3, 0], [0, 3], [0, 3], [0.1, 0]]     # right, right, right (changed), right
    batches = [(mx.nd.zeros((2, 1)), mx.nd.array(labels[:2])), (mx.nd.zeros((2, 1)), mx.nd.array(labels[2:]))]
    result = compare(_block(reference), _block(candidate), batches, mx.cpu())
    assert result["images"] == 4 and result["changed_images"] == 1 and result["changed_share"] == 0.25
    assert result["top1_float32"] == 0.75 and result["top1_export"] == 1.0
    assert result["top1_drop_points"] == pytest.approx(-25.0)
    p3 = np.exp(3) / (np.exp(3) + 1)
    assert result["max_probability_difference"] == pytest.approx(2 * p3 - 1)  # the changed image: p3 -> 1 - p3
    check_margin(result, 0.0, "amp-bfloat16")  # better than float32 is never refused
    with pytest.raises(AgreementError, match="25.00 points lower"):
        check_margin(dict(result, top1_float32=1.0, top1_export=0.75, top1_drop_points=25.0), 24.9, "float16")
