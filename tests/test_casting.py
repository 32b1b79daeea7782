"""Casting networks and batches."""
from mxfp16 import cast_batch, cast_net, dtype_report, import_gluoncv, to_float32
from mxfp16._internals import block_children
from mxfp16.models import elementwise_mlp

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

get_model = import_gluoncv().model_zoo.get_model


def test_cast_resnet_keeps_batchnorm_float32():
    net = get_model("resnet18_v2", classes=10)
    net.initialize()
    assert cast_net(net, "float16") is net
    report = dtype_report(net)
    kinds = {}
    for _, block in _leaf_blocks(net):
        for pname in block.params:
            kinds.setdefault(type(block).__name__, set()).add(report[pname])
    assert kinds["BatchNorm"] == {"float32"}
    assert kinds["Conv2D"] == {"float16"}
    assert kinds["Dense"] == {"float16"}
    assert list(report) == list(net.collect_params())


def _leaf_blocks(net):
    found = []
    net.apply(lambda b: found.append((b.name, b)) if not block_children(b) else None)
    return found


def test_cast_back_to_float32():
    net = elementwise_mlp(2, [4], 2)
    net.initialize()
    cast_net(net, "float16")
    cast_net(net, "float32")
    assert set(dtype_report(net).values()) == {"float32"}


def test_bfloat16_parameters_refused_with_pointer_to_amp():
    net = elementwise_mlp(2, [4], 2)
    with pytest.raises(TypeError, match="amp-bfloat16"):
        cast_net(net, "bfloat16")


def test_cast_batch_splits_and_keeps_labels_exact():
    data = mx.nd.array(np.arange(30).reshape(5, 6))
    label = mx.nd.array([0, 1, 2049, 3, 4])  # 2049 has no float16 representation
    ctxs = [mx.cpu(0), mx.cpu(1)]
    xs, ys = cast_batch(data, label, "float16", ctxs)
    assert [x.shape[0] for x in xs] == [3, 2]
    assert [x.context for x in xs] == ctxs
    assert all(x.dtype == np.float16 for x in xs)
    assert all(y.dtype == np.float32 for y in ys)
    assert np.concatenate([y.asnumpy() for y in ys]).tolist() == [0, 1, 2049, 3, 4]
    assert float(np.float16(2049)) == 2048.0  # why labels are not cast


def test_cast_batch_casts_floating_data_only_and_keeps_integer_labels():
    tokens = mx.nd.array([[2049, 3001, 40000], [7, 4093, 65000]], dtype="int32")  # none exact in float16
    lengths = mx.nd.array([3, 2], dtype="int64")
    mask = mx.nd.array([[1, 1, 0], [1, 0, 0]], dtype="uint8")
    weights = mx.nd.array([[0.5], [1.5]], dtype="float64")
    labels = (mx.nd.array([2049, 65001], dtype="int32"), mx.nd.array([0.25, 2049.0], dtype="float16"))
    xs, ys = cast_batch((tokens, lengths, mask, weights), labels, "float16", [mx.cpu(0), mx.cpu(1)])
    assert len(xs) == len(ys) == 2 and all(isinstance(x, tuple) and len(x) == 4 for x in xs)
    assert [np.dtype(a.dtype).name for a in xs[0]] == ["int32", "int64", "uint8", "float16"]
    assert np.concatenate([x[0].asnumpy() for x in xs]).tolist() == tokens.asnumpy().tolist()
    assert np.concatenate([x[1].asnumpy() for x in xs]).tolist() == [3, 2]
    assert [np.dtype(y.dtype).name for y in ys[1]] == ["int32", "float32"]  # float labels become float32
    assert [y[0].asscalar() for y in ys] == [2049, 65001]
    assert float(np.float16(65001)) == 64992.0  # what a float16 cast would have made of it


def test_to_float32_only_casts_when_needed():
    half = mx.nd.ones((2, 3), dtype="float16")
    full = mx.nd.ones((2, 3))
    assert to_float32(half).dtype == np.float32
    assert to_float32(full) is full
    assert [o.dtype for o in to_float32((half, full))] == [np.float32, np.float32]
    assert to_float32((half, None))[1] is None  # a head the network did not compute


def test_float16_loss_needs_float32_logits():
    # Softmax cross-entropy on float16 logits rounds the probabilities;
    # on float32 logits it matches a float64 reference.
    logits = np.array([[12.0, 0.0, -3.0, 5.5]], dtype=np.float64)
    label = np.array([3.0])
    shifted = logits - logits.max()
    reference = -(shifted[0, 3] - np.log(np.exp(shifted).sum()))
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    from_float32 = loss(to_float32(mx.nd.array(logits, dtype="float16")), mx.nd.array(label)).asscalar()
    assert from_float32 == pytest.approx(reference, rel=1e-4)


# ---- issue 42, case 5: no silent change of a value -------------------------------------------------
IDS = [[2049, 30521, 70001], [7, 2048, 65504]]  # none of the first row is a float16 value
TWO = [mx.cpu(0), mx.cpu(1)]


@pytest.mark.parametrize("make", [
    lambda: np.array(IDS, dtype=np.int64),
    lambda: np.array(IDS, dtype=np.uint32),  # a dtype MXNet lacks: widened to int64, not to float32
    lambda: mx.nd.array(IDS, dtype="int32"),
    lambda: mx.nd.array(IDS, dtype="int64"),
    lambda: IDS,  # a Python list of lists is one array, as numpy reads it
], ids=["numpy-int64", "numpy-uint32", "mxnet-int32", "mxnet-int64", "list"])
def test_integer_ids_of_every_library_are_never_cast(make):
    xs, ys = cast_batch(make(), [3, 4], "float16", TWO)
    assert all(np.issubdtype(np.dtype(x.dtype), np.integer) for x in xs + ys)
    assert np.concatenate([x.asnumpy() for x in xs]).tolist() == IDS
    assert [float(np.float16(v)) for v in IDS[0]] == [2048.0, 30528.0, float("inf")]  # what a cast would give


@pytest.mark.parametrize("value", [2049, 30521, 70001])
@pytest.mark.parametrize("make", [
    lambda v: mx.nd.array([[v, 5], [6, 7]]),  # mx.nd.array's default dtype is float32
    lambda v: np.array([[v, 5], [6, 7]], dtype=np.float32),
    lambda v: [[float(v), 5.0], [6.0, 7.0]],
], ids=["mxnet-float32", "numpy-float32", "list-of-floats"])
def test_float_ids_that_float16_would_change_are_refused_naming_input_value_and_fix(make, value):
    images = mx.nd.array(np.random.RandomState(0).normal(size=(2, 3)))
    with pytest.raises(ValueError) as refused:
        cast_batch((images, make(value)), None, "float16", TWO)
    message = str(refused.value)
    becomes = float(np.float16(value))  # numpy's rounding, independent of the check
    shown = "inf" if np.isinf(becomes) else str(int(becomes))
    assert f"data[1]: {value} -> {shown}" in message
    assert "keep=(1,)" in message and "astype('int32')" in message


def test_keep_passes_float_ids_as_they_are_and_casts_the_rest():
    images = mx.nd.array(np.random.RandomState(0).normal(size=(2, 3)))
    xs, _ = cast_batch((images, mx.nd.array(IDS)), None, "float16", TWO, keep=(1,))
    assert [np.dtype(a.dtype).name for a in xs[0]] == ["float16", "float32"]
    assert np.concatenate([x[1].asnumpy() for x in xs]).tolist() == IDS
    np.testing.assert_array_equal(np.concatenate([x[0].asnumpy() for x in xs]),
                                  images.asnumpy().astype(np.float16))
    with pytest.raises(ValueError, match="keep=.*names no input; the batch has 2 input"):
        cast_batch((images, images), None, "float16", TWO, keep=2)


def test_real_values_are_rounded_as_float16_does_and_only_overflow_is_refused():
    rng = np.random.RandomState(1)
    features = rng.normal(scale=3000.0, size=(4, 50))  # real values beyond 2048: rounding them is float16's job
    xs, _ = cast_batch(mx.nd.array(features), None, "float16", TWO)
    np.testing.assert_array_equal(np.concatenate([x.asnumpy() for x in xs]),
                                  features.astype(np.float32).astype(np.float16))
    pixels = rng.randint(0, 256, size=(4, 3, 8, 8)).astype(np.float32)  # whole numbers within 2048: exact
    xs, _ = cast_batch(pixels, None, "float16", TWO)
    assert np.concatenate([x.asnumpy() for x in xs]).tolist() == pixels.tolist()
    features[2, 7] = 1e5
    with pytest.raises(ValueError, match=r"data: 100000 -> inf"):
        cast_batch(mx.nd.array(features), None, "float16", TWO)


def test_float64_labels_that_float32_would_change_are_refused():
    data = mx.nd.ones((2, 3))
    exact = 2 ** 24  # float32's last exact integer
    _, ys = cast_batch(data, mx.nd.array([exact, 3], dtype="float64"), "float16", TWO)
    assert [y.dtype for y in ys] == [np.float32, np.float32] and ys[0].asscalar() == exact
    with pytest.raises(ValueError, match=f"label: {exact + 1} -> {exact}.*as integers"):
        cast_batch(data, mx.nd.array([exact + 1, 3], dtype="float64"), "float16", TWO)


def test_mixed_precision_cast_batch_passes_keep_through():
    from mxfp16 import MixedPrecision

    mp = MixedPrecision("float16", "cpu", allow_cpu_float16=True)
    with pytest.raises(ValueError, match="data: 30521 -> 30528"):
        mp.cast_batch(mx.nd.array([[30521.0]]))
    (x,), _ = mp.cast_batch(mx.nd.array([[30521.0]]), keep=0)
    assert x.dtype == np.float32 and x.asscalar() == 30521


def test_numpy_arrays_become_arrays_of_the_mode_in_use_with_their_dtype():
    from mxnet import npx

    npx.set_np()
    try:
        xs, ys = cast_batch(np.array(IDS, dtype=np.int64), [3, 4], "float16", TWO)
        assert all(isinstance(a, mx.np.ndarray) and a.dtype == np.int64 for a in xs + ys)
        assert np.concatenate([x.asnumpy() for x in xs]).tolist() == IDS
    finally:
        npx.reset_np()


# ---- issue 42, case 16: fewer samples than devices ----------------------------------------------
@pytest.mark.parametrize("samples, devices", [(1, 2), (3, 4)])
def test_a_batch_smaller_than_the_devices_is_explained(samples, devices):
    ctx = [mx.cpu(i) for i in range(devices)]
    with pytest.raises(ValueError) as refused:
        cast_batch(mx.nd.ones((samples, 3)), mx.nd.zeros(samples), "float32", ctx)
    message = str(refused.value)
    assert f"a batch of {samples} sample(s) cannot be split over {devices} devices" in message
    assert f"at least {devices} samples" in message and "last_batch='discard'" in message
    xs, _ = cast_batch(mx.nd.ones((devices, 3)), mx.nd.zeros(devices), "float32", ctx)  # one each is enough
    assert [x.shape[0] for x in xs] == [1] * devices
