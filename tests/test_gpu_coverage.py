"""Which GPUs a build's kernels cover: the CUDA compatibility rules, the shipped table and the docs page."""
import os

from mxfp16.machine.gpu import coverage, wheel_kernels
from mxfp16.machine.gpu.coverage import NATIVE, PTX_JIT, UNSUPPORTED, classify

import pytest
from conftest import REPO


@pytest.mark.parametrize("capability, sass, ptx, status, detail", [
    # SASS runs on the same major version with an equal or higher minor one...
    ("8.9", {80, 86}, {}, NATIVE, "sm_86"),
    ("8.6", {80, 86}, {}, NATIVE, "sm_86"),
    ("8.0", {80, 86}, {}, NATIVE, "sm_80"),
    ("7.5", {70}, {}, NATIVE, "sm_70"),
    # ...never on an older minor, nor across a major version...
    ("8.0", {86}, {}, UNSUPPORTED, "older than the oldest kernels (sm_86)"),
    ("8.0", {70, 86}, {}, UNSUPPORTED, "no sm_8x SASS"),
    ("9.0", {80, 86}, {}, UNSUPPORTED, "no PTX"),
    # ...where PTX as old as the GPU or older is compiled by the driver...
    ("9.0", {80, 86}, {80}, PTX_JIT, "compute_80"),
    ("12.0", {90}, {80, 90}, PTX_JIT, "compute_90"),
    # ...and PTX newer than the GPU is no help.
    ("7.0", {80}, {80}, UNSUPPORTED, "older than the oldest"),
    ("3.5", {50, 60}, {}, UNSUPPORTED, "older than the oldest kernels (sm_50)"),
    ("6.1", {50, 70}, {70}, UNSUPPORTED, "only newer PTX"),
])
def test_classify_follows_cuda_compatibility_rules(capability, sass, ptx, status, detail):
    result = classify(capability, sass, ptx)
    assert result.status == status and detail in result.detail
    assert result.capability == capability


def test_capabilities_and_architecture_numbers_parse_alike():
    assert coverage.parse_capability("8.6") == coverage.parse_capability(86) == (8, 6)
    assert coverage.parse_capability("12.0") == coverage.parse_capability(120) == (12, 0)
    with pytest.raises(ValueError, match="8.6"):
        coverage.parse_capability("ampere")


def test_wheel_table_records_where_it_came_from():
    source = wheel_kernels.SOURCE
    assert source["distribution"] == "mxnet-cu112" and source["library"].endswith("libmxnet.so")
    assert len(source["sha256"]) == 64 and int(source["sha256"], 16)
    assert wheel_kernels.SASS, "the GPU wheel has kernels"
    assert "cuobjdump" in wheel_kernels.CROSS_CHECK and "same entries" in wheel_kernels.CROSS_CHECK


def test_every_generation_is_classified_from_the_wheel_table():
    rows = coverage.generation_table()
    assert [cov.capability for _, cov in rows] == [c for _, caps in coverage.GENERATIONS for c in caps]
    for _, cov in rows:
        assert cov == classify(cov.capability, wheel_kernels.SASS, wheel_kernels.PTX)


def test_docs_page_shows_the_table_the_code_computes():
    with open(os.path.join(REPO, "docs", "gpu.md"), encoding="utf-8") as handle:
        page = handle.read()
    assert coverage.support_table_markdown() in page, "regenerate the table in docs/gpu.md"
    assert wheel_kernels.SOURCE["sha256"] in page


def test_gpu_support_rows_for_info():
    gpus = [{"index": 0, "compute_capability": "8.6"}, {"index": 1, "compute_capability": None}]
    rows = coverage.gpu_support(gpus)
    assert [r["index"] for r in rows] == [0, 1]
    assert rows[1]["status"] == "unknown"
    # This venv holds the CPU wheel, so the mxnet-cu112 table does not apply to it.
    assert rows[0]["status"] == ("unknown" if not coverage.table_applies() else NATIVE)
