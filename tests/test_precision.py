"""Resolving a precision name, and the AMP process-state guard."""
import mxnet as mx
import pytest

from mxfp16.machine import hardware
from mxfp16.precision import PRECISIONS, PrecisionError, resolve_precision


@pytest.mark.parametrize("name, compute, params, amp, scaling, master", [
    ("float32", "float32", "float32", False, False, False),
    ("float16", "float16", "float16", False, True, True),
    ("amp-float16", "float16", "float32", True, True, False),
    ("amp-bfloat16", "bfloat16", "float32", True, False, False),
])
def test_table(name, compute, params, amp, scaling, master):
    p = resolve_precision(name, mx.cpu(), allow_cpu_float16=True)
    assert (p.name, p.compute_dtype, p.param_dtype, p.amp, p.loss_scaling, p.master_weights) == \
        (name, compute, params, amp, scaling, master)
    # Batches follow the parameters; AMP casts inside the operators.
    assert p.data_dtype == params


def test_precision_is_immutable():
    p = resolve_precision("float32", mx.cpu())
    with pytest.raises(Exception):
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


def test_auto_on_cpu_follows_the_cpu_flags(monkeypatch):
    monkeypatch.delenv("MXFP16_CPU_BFLOAT16", raising=False)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    assert resolve_precision("auto", mx.cpu()).name == "amp-bfloat16"
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx2"})
    p = resolve_precision("auto", mx.cpu())
    assert p.name == "float32" and p.requested == "auto"


def test_the_bfloat16_probe_can_be_overridden(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    monkeypatch.setenv("MXFP16_CPU_BFLOAT16", "0")
    assert resolve_precision("auto", mx.cpu()).name == "float32"
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx2"})
    monkeypatch.setenv("MXFP16_CPU_BFLOAT16", "1")
    assert resolve_precision("auto", mx.cpu()).name == "amp-bfloat16"
    monkeypatch.setenv("MXFP16_CPU_BFLOAT16", "maybe")  # anything else: the probe decides
    assert resolve_precision("auto", mx.cpu()).name == "float32"


def test_auto_on_gpu_is_float16():
    # Resolving does not touch the device, so a GPU context can be described anywhere.
    assert resolve_precision("auto", [mx.gpu(0), mx.gpu(1)]).name == "float16"
    assert resolve_precision("float16", "gpu:0").name == "float16"


def test_amp_is_process_global(python_child):
    proc = python_child("""
        from mxfp16.precision import AMPStateError, activate, resolve_precision
        import mxnet as mx
        bf16 = resolve_precision("amp-bfloat16", mx.cpu())
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
