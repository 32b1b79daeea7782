"""The float16 / bfloat16 / float32 facts, against numpy's finfo and MXNet's bfloat16 casts.

MXNet has two float32 -> bfloat16 casts. ``amp_cast`` (what AMP inserts) is a
oneDNN reorder: it rounds to nearest even on every CPU, and what it does with
bfloat16's subnormals depends on the CPU's instructions, so that is measured
(:func:`mxfp16.float_formats.measure_bfloat16_cast`), never assumed.
``astype``/``Cast`` is mshadow's software conversion: it truncates and keeps
subnormals on every CPU.
"""
from mxfp16.float_formats import (
    BF16,
    BFLOAT16,
    CAST_PATHS,
    FLOAT16,
    FLOAT32,
    SUBNORMAL_PROBES,
    bfloat16_roundtrip,
    classify_bfloat16_cast,
)
from mxfp16.machine import hardware

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


def test_bfloat16_facts_match_mxnet_cast():
    out = bfloat16_roundtrip([BF16.max, 1 + BF16.epsilon, 1 + BF16.epsilon / 2, BF16.smallest_normal, 3.4e38])
    assert out[0] == np.float32(BF16.max)            # the largest value survives
    assert out[1] == np.float32(1 + BF16.epsilon)    # 1 + eps is representable
    assert out[2] == 1.0                             # half of it ties to even: back to 1
    assert out[3] == np.float32(BF16.smallest_normal)
    assert np.isinf(out[4])                          # past max rounds to inf
    assert BF16.max == pytest.approx(3.3895313892515355e38)
    assert BF16.smallest_normal == FLOAT32.smallest_normal


def test_amp_cast_flushes_all_of_bfloat16s_subnormals_or_keeps_them_all_and_says_which():
    # The format has subnormals down to 2**-133. Whether amp_cast keeps them depends on the CPU (flushed with
    # avx512_bf16 and without AVX-512, kept by oneDNN's AVX-512 emulation): only all-or-nothing holds everywhere.
    assert BF16.smallest_subnormal == 2.0 ** -133 == SUBNORMAL_PROBES[-1]
    assert all(0 < v < BF16.smallest_normal for v in SUBNORMAL_PROBES)
    out = bfloat16_roundtrip(SUBNORMAL_PROBES)  # in this process, as AMP's casts run
    flushed, kept = (out == 0).all(), out.tolist() == list(SUBNORMAL_PROBES)
    assert flushed or kept, out
    cast = classify_bfloat16_cast(SUBNORMAL_PROBES, out)
    assert cast.subnormals == ("flushed" if flushed else "kept") and cast.flushes == flushed
    assert cast.sentence().startswith("MXNet's float32 -> bfloat16 cast")
    assert ("flushes bfloat16's subnormals" if flushed else "keeps bfloat16's subnormals") in cast.sentence()


def test_the_measured_cast_is_the_one_this_cpus_instructions_decide(bfloat16_cast):
    """The child process's measurement names the instruction that decides it, and that instruction agrees."""
    assert bfloat16_cast.subnormals in ("flushed", "kept"), bfloat16_cast.sentence()
    if bfloat16_cast.expected is None:
        pytest.skip(f"this CPU's flags cannot be read: {bfloat16_cast.sentence()}")
    assert bfloat16_cast.subnormals == bfloat16_cast.expected, bfloat16_cast.sentence()
    assert CAST_PATHS[bfloat16_cast.path][1] in bfloat16_cast.sentence()


@pytest.mark.parametrize("path, flags, outputs, subnormals", [
    ("avx512_bf16", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}, [0.0] * 4, "flushed"),
    ("avx512-emulation", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}, list(SUBNORMAL_PROBES), "kept"),
    ("reference", {"avx2", "fma"}, [0.0] * 4, "flushed"),
])
def test_each_cpu_class_names_its_conversion_and_what_it_does(path, flags, outputs, subnormals):
    support = hardware.bfloat16_support(flags, environ={})  # this CPU's class, whatever DNNL_MAX_CPU_ISA says here
    cast = classify_bfloat16_cast(SUBNORMAL_PROBES, outputs, flags=flags, support=support)
    assert (cast.path, cast.subnormals, cast.expected) == (path, subnormals, subnormals)
    assert cast.decided_by in cast.sentence()
    assert ("VCVTNEPS2BF16" in cast.sentence()) == (path != "reference")
    assert ("bfloat16 arithmetic does not" in cast.sentence()) == (path == "reference")


def test_a_cast_that_disagrees_with_its_cpu_or_fails_says_so():
    native = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}
    surprise = classify_bfloat16_cast(SUBNORMAL_PROBES, SUBNORMAL_PROBES, flags=native)
    assert surprise.subnormals == "kept" and "something else decides it here" in surprise.sentence()
    mixed = classify_bfloat16_cast(SUBNORMAL_PROBES, [0.0, *SUBNORMAL_PROBES[1:]], flags=native)
    assert mixed.subnormals == "mixed" and "flushes some" in mixed.sentence()
    failed = classify_bfloat16_cast(SUBNORMAL_PROBES, None, "MXNetError: no", flags=native)
    assert failed.subnormals == "unmeasured"
    assert "could not be measured on this CPU: MXNetError: no" in failed.sentence()


def test_astype_truncates_and_keeps_subnormals_on_every_cpu():
    # NDArray.astype / Cast is mshadow's software conversion (the upper 16 bits): no rounding, no flush, no
    # overflow to inf. mxfp16 export's weights (amp.convert_model) are cast this way.
    values = [2.0 ** -133, -2.0 ** -133, 1 + 2.0 ** -8 + 2.0 ** -20, 1 + 3 * 2.0 ** -8, 3.4e38]
    x = mx.nd.array(values, dtype="float32")
    out = x.astype(BFLOAT16).astype("float32").asnumpy().astype(np.float64)
    assert out[0] == 2.0 ** -133 and out[1] == -2.0 ** -133           # subnormals kept
    assert out[2] == 1.0 and out[3] == 1 + 2.0 ** -7                  # truncated, where amp_cast rounds up
    assert out[4] == BF16.max                                          # past max: truncated to max, not inf


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
