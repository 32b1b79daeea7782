"""``mxfp16 info``'s CUDA sections: the CPU build here, and a CUDA build with GPUs it does and does not cover.

Also its report of the float16 environment variables the commands set.
"""
import argparse
import json
import os

from mxfp16.commands import info
from mxfp16.machine import hardware
from mxfp16.machine.gpu import coverage, libraries, wheel_kernels

import pytest


def _run(capsys, as_json=False):
    info.run(argparse.Namespace(json=as_json))
    out = capsys.readouterr().out
    return json.loads(out) if as_json else out


def test_cpu_build_needs_no_cuda_libraries(capsys):
    report = _run(capsys, as_json=True)
    cuda = report["cuda"]
    assert cuda["build"] == ("cuda" if libraries.is_cuda_build(libraries.needed_by_mxnet()) else "cpu")
    assert cuda["mxnet_library"] == libraries.mxnet_library()
    assert set(cuda) >= {"libraries", "driver", "kernels", "gpu_support"}
    if cuda["build"] == "cpu":
        assert cuda["libraries"] == [] and cuda["kernels"] is None and cuda["gpu_support"] == []
        text = _run(capsys)
        assert "CPU build: no CUDA libraries needed" in text
        assert f"GPUs: {hardware.gpu_count()}" in text


def test_info_reports_the_float16_environment_without_setting_it(capsys, monkeypatch):
    from mxfp16.machine.environment import FLOAT16_ENVIRONMENT

    monkeypatch.setenv("MXNET_CUDNN_AUTOTUNE_DEFAULT", "0")
    monkeypatch.delenv("MXNET_SAFE_ACCUMULATION", raising=False)
    report = _run(capsys, as_json=True)["environment"]
    assert set(report) == set(FLOAT16_ENVIRONMENT)
    assert report["MXNET_CUDNN_AUTOTUNE_DEFAULT"]["value"] == "0"          # the user's setting wins
    assert report["MXNET_CUDNN_AUTOTUNE_DEFAULT"]["source"] == "yours"
    assert report["MXNET_SAFE_ACCUMULATION"] == {"value": "1", "source": "mxfp16", "default": "1",
                                                 "why": FLOAT16_ENVIRONMENT["MXNET_SAFE_ACCUMULATION"][1]}
    assert "MXNET_SAFE_ACCUMULATION" not in os.environ                    # reported, not set
    text = _run(capsys)
    assert "MXNET_CUDNN_AUTOTUNE_DEFAULT=0 (set by you)" in text
    assert "MXNET_SAFE_ACCUMULATION=1 (mxfp16's default)" in text


@pytest.fixture
def cuda_machine(monkeypatch):
    """This machine as if it held mxnet-cu112 with cuDNN missing and two GPUs: an A100-class and an H100-class."""
    statuses = [libraries.LibraryStatus(lib,
                                        None if lib.soname == "libcudnn.so.8" else f"/site/nvidia/x/lib/{lib.soname}")
                for lib in libraries.LIBRARIES]
    rows = [dict(s.as_dict(), loaded_from=s.path) for s in statuses]
    monkeypatch.setattr(libraries, "report", lambda: {
        "build": "cuda", "mxnet_library": "/site/mxnet/libmxnet.so", "libraries": rows,
        "driver": {"soname": libraries.DRIVER, "loaded_from": "/usr/lib/libcuda.so.1", "fix": None}})
    machine = hardware.machine_summary()
    machine["gpus"] = [{"index": 0, "name": "A", "memory_mb": 40000.0, "compute_capability": "8.0",
                        "tensor_cores": True},
                       {"index": 1, "name": "H", "memory_mb": 80000.0, "compute_capability": "9.0",
                        "tensor_cores": True}]
    monkeypatch.setattr(hardware, "machine_summary", lambda: machine)
    monkeypatch.setattr(coverage, "table_applies", lambda: True)
    cudnn = next(lib for lib in libraries.LIBRARIES if lib.soname == "libcudnn.so.8")
    return cudnn


def test_cuda_build_lists_each_library_and_warns_on_an_uncovered_gpu(capsys, cuda_machine):
    text = _run(capsys)
    assert f"MISSING  fix: {cuda_machine.fix}" in text
    assert "libcudart.so.11.0" in text and "/site/nvidia/x/lib/libcudart.so.11.0" in text
    expected = {gpu: coverage.wheel_coverage(cap) for gpu, cap in ((0, "8.0"), (1, "9.0"))}
    for index, cov in expected.items():
        line = next(l for l in text.splitlines() if f"gpu:{index} ({cov.capability})" in l)
        assert ("WARNING" in line) == (cov.status != coverage.NATIVE)
        assert cov.detail in line
    report = _run(capsys, as_json=True)
    assert [g["status"] for g in report["cuda"]["gpu_support"]] == [c.status for c in expected.values()]
    assert report["cuda"]["kernels"]["sass"] == [f"sm_{a}" for a in wheel_kernels.SASS]
    assert report["cuda"]["kernels"]["source"]["sha256"] == wheel_kernels.SOURCE["sha256"]


def test_gpu_reachable_only_through_ptx_says_so(capsys, cuda_machine, monkeypatch):
    monkeypatch.setattr(wheel_kernels, "PTX", {86: 1})
    line = next(l for l in _run(capsys).splitlines() if "gpu:1 (9.0)" in l)
    assert "WARNING" in line and "PTX JIT" in line and "compute_86" in line
