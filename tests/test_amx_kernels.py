"""oneDNN 2.4.4's AMX kernels against its AVX-512 bfloat16 ones (tools/amx_check.py).

On a CPU with AMX in use: Dense layers with output sizes that are not
multiples of 32 agree forward and backward, and the three reference models
train alike for a few steps. Elsewhere the same harness runs both sides on the
AVX-512 kernels, which must agree exactly: that keeps the check itself
working on machines without AMX.
"""
import importlib.util
import os

from mxfp16.machine import amx

import pytest
from conftest import REPO, requires_bfloat16

_spec = importlib.util.spec_from_file_location("amx_check", os.path.join(REPO, "tools", "amx_check.py"))
amx_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(amx_check)

AMX_IN_USE = amx.status().in_use
requires_amx = pytest.mark.skipif(not AMX_IN_USE, reason=f"needs AMX in use: {amx.status().describe()}")


@requires_amx
@pytest.mark.slow
def test_amx_kernels_agree_with_avx512_bfloat16():
    from mxfp16.machine import hardware

    cpu = hardware.bfloat16_support().describe()
    report = amx_check.check(list(amx_check.MODELS), steps=10)
    assert report["ok"], (cpu, {k: v for k, v in report.items() if k != "train"})
    # The AMX side really ran AMX kernels, the other side did not: every child's trace counts. The Dense check's
    # own trace may hold none (oneDNN 2.4.4's bfloat16 inner products run x64:gemm:jit, measured on an Emerald
    # Rapids); ResNet-50's convolutions run jit:/brgconv:avx512_core_amx_bf16 there.
    kernels = {side: set(report["kernels"][side]).union(*(row["kernels"][side] for row in report["train"].values()))
               for side in ("amx_on", "amx_off")}
    assert any("amx" in kernel for kernel in kernels["amx_on"]), (cpu, sorted(kernels["amx_on"]))
    assert not any("amx" in kernel for kernel in kernels["amx_off"]), (cpu, sorted(kernels["amx_off"]))


@requires_bfloat16
@pytest.mark.slow
def test_the_check_runs_where_there_is_no_amx():
    if AMX_IN_USE:
        pytest.skip("AMX is in use here: the test above compares the real kernels")
    report = amx_check.check(["lstm-classifier"], steps=3, sizes=(10, 33))
    # Both sides ran the same kernels: the differences are exactly zero, and the traces were read.
    assert report["ok"] and report["kernels"]["amx_on"] == report["kernels"]["amx_off"] != []
    assert all(value == 0.0 for row in report["dense"].values() for key, value in row.items() if key != "ok")
    assert report["train"]["lstm-classifier"]["losses"] == 0.0
