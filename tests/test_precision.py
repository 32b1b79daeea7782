"""Resolving a precision name, and the AMP process-state guard."""
import dataclasses

from mxfp16.machine import hardware
from mxfp16.precision import PRECISIONS, PrecisionError, resolve_precision

import mxnet as mx
import pytest


@pytest.mark.parametrize("name, compute, params, amp, scaling, master", [
    ("float32", "float32", "float32", False, False, False),
    ("float16", "float16", "float16", False, True, True),
    ("amp-float16", "float16", "float32", True, True, False),
    ("amp-bfloat16", "bfloat16", "float32", True, False, False),
])
def test_table(name, compute, params, amp, scaling, master):
    # The table is the same for any device (resolving for a GPU touches none): checked on every CPU.
    p = resolve_precision(name, mx.gpu(0))
    assert (p.name, p.compute_dtype, p.param_dtype, p.amp, p.loss_scaling, p.master_weights) == \
        (name, compute, params, amp, scaling, master)
    # Batches follow the parameters; AMP casts inside the operators.
    assert p.data_dtype == params


def test_precision_is_immutable():
    p = resolve_precision("float32", mx.cpu())
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "float16"


def test_unknown_name_lists_choices():
    with pytest.raises(PrecisionError) as err:
        resolve_precision("fp8", mx.cpu())
    for choice in PRECISIONS:
        assert choice in str(err.value)


@pytest.mark.parametrize("name", ["float16", "amp-float16"])
def test_float16_on_cpu_refused_with_explanation(name):
    with pytest.raises(PrecisionError) as err:
        resolve_precision(name, mx.cpu())
    text = str(err.value)
    assert "CPU" in text and "amp-bfloat16" in text and "allow_cpu_float16" in text


ZEN4 = {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}
CASCADE_LAKE = {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
SAPPHIRE_RAPIDS = ZEN4 | {"amx_bf16", "amx_tile"}


def _cpu(monkeypatch, flags, amx_state=None):
    """Make resolve_precision see a CPU with ``flags`` (and AMX in ``amx_state``) in an empty environment."""
    support = hardware.bfloat16_support(flags, {}, amx_state)
    monkeypatch.setattr(hardware, "bfloat16_support", lambda: support)


@pytest.mark.parametrize("flags, amx_state, kind, auto", [
    (ZEN4, None, "native", "amp-bfloat16"),                 # recorded 1.7x-1.8x float32
    (CASCADE_LAKE, None, "emulated", "float32"),            # no bfloat16 instructions
    ({"avx2", "fma"}, None, "none", "float32"),             # cannot run bfloat16 at all
    (SAPPHIRE_RAPIDS, "refused", "native", "float32"),      # AMX off: recorded 0.81x float32
    (SAPPHIRE_RAPIDS, "in-use", "amx", "float32"),          # AMX on: faster on some families, slower on others
])
def test_auto_on_cpu_follows_the_recorded_rule_per_cpu_class(monkeypatch, flags, amx_state, kind, auto):
    _cpu(monkeypatch, flags, amx_state)
    assert hardware.bfloat16_support().kind == kind
    p = resolve_precision("auto", mx.cpu())
    assert p.name == auto and p.requested == "auto" and p.reason
    assert resolve_precision("float32", mx.cpu()).reason == "asked for"


def test_amp_bfloat16_is_refused_where_bfloat16_cannot_run(monkeypatch):
    _cpu(monkeypatch, {"avx2", "fma", "avx512f"})
    with pytest.raises(PrecisionError) as err:
        resolve_precision("amp-bfloat16", mx.cpu())
    text = str(err.value)
    # Names the missing instructions and the fix.
    assert "avx512bw" in text and "avx512vl" in text and "float32" in text
    # A GPU run is not a CPU's business.
    assert resolve_precision("amp-bfloat16", mx.gpu(0)).name == "amp-bfloat16"


@pytest.mark.parametrize("environ, words", [
    ({"DNNL_MAX_CPU_ISA": "AVX2"}, "DNNL_MAX_CPU_ISA=AVX2"),
    ({"MXNET_MKLDNN_ENABLED": "0"}, "MXNET_MKLDNN_ENABLED=0"),
])
def test_settings_that_take_bfloat16_away_on_an_avx512_cpu(environ, words):
    support = hardware.bfloat16_support(ZEN4, environ, None)
    assert support.kind == "none" and words in support.reason and not support.runs


def test_an_isa_cap_between_avx512_and_bfloat16_means_emulated():
    support = hardware.bfloat16_support(ZEN4, {"DNNL_MAX_CPU_ISA": "AVX512_CORE_VNNI"}, None)
    assert support.kind == "emulated" and support.runs and not support.native


def test_a_bfloat16_dense_runs_exactly_where_the_flags_say_it_does():
    """The live probe (what decides for a CPU whose flags cannot be read) agrees with the flags where they can."""
    support = hardware.bfloat16_support()
    if support.kind == "unknown":
        pytest.skip(f"no flags to compare with: {support.reason}")
    runs, what = hardware.probe_bfloat16_arithmetic()
    assert runs == support.runs, (support.describe(), what)


def test_auto_on_gpu_is_float16():
    # Resolving does not touch the device, so a GPU context can be described anywhere.
    assert resolve_precision("auto", [mx.gpu(0), mx.gpu(1)]).name == "float16"
    assert resolve_precision("float16", "gpu:0").name == "float16"


def test_amp_is_process_global(python_child):
    proc = python_child("""
        from mxfp16.precision import AMPStateError, activate, resolve_precision
        import mxnet as mx
        bf16 = resolve_precision("amp-bfloat16", mx.gpu(0))  # amp.init runs nothing: any CPU can take it
        activate(bf16)
        activate(bf16)  # idempotent for the same target
        for other in ("float32", "amp-float16"):
            try:
                activate(resolve_precision(other, mx.cpu(), allow_cpu_float16=True))
            except AMPStateError as err:
                print("refused", other, "own process" in str(err))
    """)
    assert "refused float32 True" in proc.stdout
    assert "refused amp-float16 True" in proc.stdout
