"""mxfp16's AMP lists: the 7x7 stem convolution stays float32, the other convolutions run bfloat16.

AMP is process-global, so each setting runs in a fresh process. The
reference is a float64 numpy convolution.
"""

from mxfp16.amp.lists import LIST_SETS, operator_lists

import numpy as np
import pytest
from conftest import last_line_json, requires_bfloat16

CHILD = """
import mxfp16
import json, numpy as np, mxnet as mx
from mxnet import gluon
from mxfp16.amp.lists import operator_lists
precision = mxfp16.resolve_precision("amp-bfloat16", "cpu")
mxfp16.activate(precision, **({{}} if {which!r} == "mxfp16" else operator_lists("bfloat16", "mxnet")))
rng = np.random.RandomState(0)
x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
w7 = (0.1 * rng.standard_normal((8, 3, 7, 7))).astype(np.float32)
w3 = (0.1 * rng.standard_normal((8, 3, 3, 3))).astype(np.float32)
name_of = lambda dtype: "bfloat16" if "bfloat16" in str(dtype) else np.dtype(dtype).name
out = {{}}
for name, kernel, stride, weight in (("stem", 7, 2, w7), ("conv3", 3, 1, w3)):
    conv = gluon.nn.Conv2D(8, kernel, strides=stride, padding=kernel // 2, in_channels=3, use_bias=False)
    conv.initialize()
    conv.weight.set_data(mx.nd.array(weight))
    eager = conv(mx.nd.array(x))
    conv.hybridize(static_alloc=True, static_shape=True)
    graph = conv(mx.nd.array(x))
    out[name] = {{"eager_dtype": name_of(eager.dtype), "graph_dtype": name_of(graph.dtype),
                 "eager": eager.astype("float32").asnumpy().tolist(),
                 "graph": graph.astype("float32").asnumpy().tolist()}}
print(json.dumps(out))
"""


def _conv_reference(x, w, stride, pad):
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    k = w.shape[-1]
    size = (x.shape[-1] - k) // stride + 1
    out = np.zeros((x.shape[0], w.shape[0], size, size))
    for i in range(size):
        for j in range(size):
            patch = x[:, :, i * stride:i * stride + k, j * stride:j * stride + k]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w.astype(np.float64))
    return out


def _inputs():
    rng = np.random.RandomState(0)
    x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    w7 = (0.1 * rng.standard_normal((8, 3, 7, 7))).astype(np.float32)
    w3 = (0.1 * rng.standard_normal((8, 3, 3, 3))).astype(np.float32)
    return x, w7, w3


def _relative_error(got, want):
    return float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())


@requires_bfloat16
@pytest.mark.slow
@pytest.mark.parametrize("which", LIST_SETS)
def test_stem_convolution_precision(python_child, which):
    result = last_line_json(python_child(CHILD.format(which=which)).stdout)
    x, w7, w3 = _inputs()
    stem_ref, conv3_ref = _conv_reference(x, w7, 2, 3), _conv_reference(x, w3, 1, 1)
    for path in ("eager", "graph"):
        stem_error = _relative_error(result["stem"][path], stem_ref)
        conv3_error = _relative_error(result["conv3"][path], conv3_ref)
        # bfloat16 keeps 8 significant bits (relative rounding 2^-9 per value).
        assert 1e-4 < conv3_error < 5e-2, (path, conv3_error)
        if which == "mxfp16":
            assert stem_error < 1e-5, (path, stem_error)
            assert result["stem"]["graph_dtype"] == result["stem"]["eager_dtype"] == "float32"
        else:
            assert stem_error > 1e-4, (path, stem_error)
    assert result["conv3"]["graph_dtype"] == result["conv3"]["eager_dtype"] == "bfloat16"


def test_operator_lists_are_fresh_copies_and_validated():
    lists = operator_lists("bfloat16", "mxfp16")
    assert "Convolution" in lists["target_precision_ops"]
    lists["target_precision_ops"].append("Pooling")
    assert "Pooling" not in operator_lists("bfloat16", "mxfp16")["target_precision_ops"]
    with pytest.raises(ValueError, match="unknown AMP operator lists"):
        operator_lists("bfloat16", "fastest")
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        operator_lists("int8")


def test_stem_rule_dispatches_on_the_kernel_however_it_is_written():
    from mxfp16.amp.lists import stem_convolution
    from mxfp16.amp.wrappers import float32_where

    calls = []
    conv = float32_where(lambda *a, **k: calls.append("float32"), lambda *a, **k: calls.append("bfloat16"),
                         stem_convolution)
    conv(kernel=(7, 7))
    conv(kernel="(7, 7)")
    conv(kernel=(3, 3))
    conv(kernel=(7, 1))
    conv()
    assert calls == ["float32", "float32", "bfloat16", "bfloat16", "bfloat16"]
