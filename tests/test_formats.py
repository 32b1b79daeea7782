"""The float16 / bfloat16 / float32 facts, against numpy's finfo and MXNet's bfloat16 cast."""
from mxfp16.float_formats import BF16, BFLOAT16, FLOAT16, FLOAT32

import mxnet as mx
import numpy as np
import pytest


@pytest.mark.parametrize("fmt, dtype", [(FLOAT16, np.float16), (FLOAT32, np.float32)])
def test_ieee_formats_match_numpy(fmt, dtype):
    info = np.finfo(dtype)
    assert fmt.max == float(info.max)
    assert fmt.smallest_normal == float(info.tiny)
    assert fmt.smallest_subnormal == float(info.smallest_subnormal)
    assert fmt.epsilon == float(info.eps)
    assert fmt.mantissa_bits == info.nmant
    assert fmt.bits == info.bits


def test_float16_edges_behave_as_stated():
    assert np.isinf(np.float16(FLOAT16.max) * np.float16(2))
    assert np.float16(FLOAT16.smallest_subnormal) > 0
    assert np.float16(FLOAT16.smallest_subnormal / 2) == 0
    # Spacing 32 in [32768, 65536): 32768 + 16 rounds back (ties to even).
    assert FLOAT16.spacing_at(40000) == 32
    assert np.float16(32768 + 16) == np.float16(32768)


def _bf16_roundtrip(values):
    x = mx.nd.array(values, dtype="float32")
    return mx.nd.amp_cast(mx.nd.amp_cast(x, dtype=BFLOAT16), dtype="float32").asnumpy()


def test_bfloat16_facts_match_mxnet_cast():
    out = _bf16_roundtrip([BF16.max, 1 + BF16.epsilon, 1 + BF16.epsilon / 2, BF16.smallest_normal, 3.4e38])
    assert out[0] == np.float32(BF16.max)            # the largest value survives
    assert out[1] == np.float32(1 + BF16.epsilon)    # 1 + eps is representable
    assert out[2] == 1.0                             # half of it ties to even: back to 1
    assert out[3] == np.float32(BF16.smallest_normal)
    assert np.isinf(out[4])                          # past max rounds to inf
    assert BF16.max == pytest.approx(3.3895313892515355e38)
    assert BF16.smallest_normal == FLOAT32.smallest_normal


def test_mxnet_cpu_bfloat16_cast_flushes_subnormals():
    # The format has subnormals down to 2**-133, but MXNet's CPU cast flushes them:
    # worth knowing when reading gradient-range plots for bfloat16.
    assert BF16.smallest_subnormal == 2.0 ** -133
    assert _bf16_roundtrip([BF16.smallest_subnormal])[0] == 0.0


def test_loss_scales_print_exactly_not_rounded_by_g():
    from mxfp16.float_formats import format_scale
    # Every power of two a loss scaler can hold prints as a number that reads back exactly.
    for k in range(-40, 60):
        text = format_scale(2.0 ** k)
        value = 2.0 ** int(text[2:]) if text.startswith("2^") else float(text)
        assert value == 2.0 ** k, (k, text)
        assert "e+" not in text and "e-" not in text
    assert format_scale(2.0 ** 24) == "16777216" and format_scale(0.25) == "2^-2" and format_scale(1.5) == "1.5"


def test_scaler_and_diagnostics_show_two_to_the_24_in_full():
    import mxfp16
    scaler = mxfp16.LossScaler(init_scale=2.0 ** 24)
    assert "scale=16777216," in repr(scaler)


def test_the_trainers_epoch_line_shows_two_to_the_24_in_full():
    from mxfp16.train.epochs import epoch_line
    record = {"epoch": 3, "train_loss": 0.5, "train_top1": 0.8, "val_top1": 0.75, "val_top5": 0.99,
              "images_per_second": 123.4, "loss_scale": 2.0 ** 24, "skipped_steps": 2, "lr": 0.01, "seconds": 9.5}
    line = epoch_line(record, 16)
    assert line.startswith("epoch 3/16: train_loss 0.5000 ")
    assert "loss scale 16777216, skipped 2," in line and "e+07" not in line
