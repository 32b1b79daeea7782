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
