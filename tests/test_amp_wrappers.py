"""The cast-first wrappers AMP's lists are applied with, on legacy and numpy-mode arrays and symbols.

float16 is the 16-bit dtype here: casting to it and adding in it run on any
CPU (no bfloat16 arithmetic), and the wrappers treat both 16-bit dtypes alike.
"""
import json

from mxfp16.amp import wrappers as w
from mxfp16.float_formats import BFLOAT16

import mxnet as mx
import numpy as np
import pytest


def _seen(calls):
    def record(*args, **kwargs):
        calls.append(([np.dtype(a.dtype).name for a in args if hasattr(a, "dtype")],
                      {k: np.dtype(v.dtype).name for k, v in kwargs.items() if hasattr(v, "dtype")}))
        return args[0]
    return record


@pytest.mark.parametrize("numpy_mode", [False, True])
def test_widest_casts_the_16_bit_inputs_up_only_when_a_float32_one_is_there(numpy_mode):
    def array(dtype):
        x = mx.nd.ones((2, 3), dtype=dtype)
        return x.as_np_ndarray() if numpy_mode else x

    calls = []
    join = w.widest_call(_seen(calls), "join", "float16")
    join(array("float32"), array("float16"))
    join(array("float16"), array("float16"))
    assert calls[0][0] == ["float32", "float32"]
    assert calls[1][0] == ["float16", "float16"]
    listed = []  # numpy's concatenate takes a list
    w.widest_call(lambda seq: listed.extend(np.dtype(a.dtype).name for a in seq), "join", "float16")(
        [array("float16"), array("float32")])
    assert listed == ["float32", "float32"]


def test_widest_joins_graph_nodes_through_one_multicast():
    a, b = mx.sym.var("a"), mx.sym.var("b")
    out = w.widest_call(mx.sym.Concat, "Concat", "float16")(a, w.cast(b, "float16"), dim=1)
    ops = [n["op"] for n in json.loads(out.tojson(remove_amp_cast=False))["nodes"]]
    assert ops.count("amp_multicast") == 1
    _, types, _ = out.infer_type_partial(a="float32", b="float32")
    assert np.dtype(types[0]) == np.float32  # without the multicast, Concat's type inference fails


def test_float32_leaves_out_alone_and_casts_16_bit_inputs():
    calls = []
    f32 = w.float32_call(_seen(calls), "op")
    half = mx.nd.ones((2,), dtype="float16")
    target = mx.nd.zeros((2,), dtype="float16")
    f32(half, mx.nd.ones((2,), dtype="int32"), out=target)
    assert calls == [(["float32", "int32"], {"out": "float16"})]


def test_target_casts_float32_arrays_and_every_symbol():
    calls = []
    f16 = w.target_call(_seen(calls), "op", "float16")
    f16(mx.nd.ones((2,)), mx.nd.ones((2,), dtype="int32"))
    assert calls == [(["float16", "int32"], {})]
    sym = w.target_call(lambda x: x, "op", "float16")(mx.sym.var("x").as_np_ndarray())
    assert type(sym).__name__ == "_Symbol"  # numpy-mode stays numpy-mode
    assert "amp_cast" in sym.as_nd_ndarray().tojson()


def test_dtype_names():
    assert w.dtype_name(BFLOAT16) == "bfloat16" and w.dtype_name("float16") == "float16"
    assert w.is_low_precision(BFLOAT16) and w.is_low_precision(np.float16) and not w.is_low_precision("float32")


def test_an_in_place_update_keeps_the_dtype_of_the_array_it_writes_to():
    # numpy's y += x is add(y, x, out=y): into a 16-bit y the sum is computed in y's dtype, as numpy's own
    # in-place operators keep the left operand's dtype (a float32 result cannot be written into y).
    y = mx.nd.ones((2, 3), dtype="float16").as_np_ndarray()
    add = w.widest_call(mx.nd.numpy._internal.add, "_npi_add", "float16")
    add(y, mx.np.ones((2, 3)), out=y)
    assert y.dtype == np.float16 and float(y.asnumpy()[0, 0]) == 2.0
    assert add(y, mx.np.ones((2, 3))).dtype == np.float32  # not in place: the widest
