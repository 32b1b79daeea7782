"""Speedups, tables and files of the benchmark, from hand-made records (no processes)."""
import csv
import json

import pytest

from mxfp16.bench import report
from mxfp16.bench.runner import BenchSpec, not_run


def _record(precision, batch_size, ms, peak, lists=None, status="ok", image_size=64, cpu=None):
    return {"precision": precision, "amp_lists": lists, "batch_size": batch_size, "image_size": image_size,
            "model": "m", "mode": "train", "data": "synthetic", "ctx": "cpu", "status": status, "reason": None,
            "images_per_second": batch_size / (ms / 1000.0) if status == "ok" else None,
            "ms_per_step": ms if status == "ok" else None, "ms_per_step_spread": 1.0 if status == "ok" else None,
            "peak_memory_mb": peak if status == "ok" else None, "cpu_ms_per_step": cpu}


def test_speedup_is_float32_time_over_mixed_time_within_each_batch_size():
    records = [_record("float32", 16, 400.0, 1000.0, cpu=760.0),
               _record("amp-bfloat16", 16, 250.0, 800.0, "mxfp16", cpu=400.0),
               _record("amp-bfloat16", 16, 320.0, 820.0, "mxnet"),
               _record("float32", 32, 900.0, 1500.0), _record("amp-bfloat16", 32, 450.0, 1200.0, "mxfp16")]
    table = report.add_speedups(records)
    assert records[1]["speedup"] == pytest.approx(400.0 / 250.0)
    assert records[2]["speedup"] == pytest.approx(400.0 / 320.0)
    assert records[1]["cpu_speedup"] == pytest.approx(760.0 / 400.0)
    assert records[2]["cpu_speedup"] is None  # no CPU time measured for it
    assert records[4]["speedup"] == pytest.approx(900.0 / 450.0)
    assert records[4]["memory_ratio"] == pytest.approx(1200.0 / 1500.0)
    assert records[0]["speedup"] == pytest.approx(1.0)
    assert len(table) == 3
    assert sorted(v["speedup"] for v in table.values()) == pytest.approx(sorted([1.6, 1.25, 2.0]))


def test_no_speedup_without_a_successful_float32_run_of_the_same_group():
    records = [_record("float32", 16, 400.0, 1000.0, status="failed"), _record("amp-bfloat16", 16, 250.0, 800.0),
               _record("float32", 16, 400.0, 1000.0, image_size=32), _record("amp-bfloat16", 32, 250.0, 800.0)]
    table = report.add_speedups(records)
    assert table == {}
    assert records[1]["speedup"] is None and records[3]["speedup"] is None


def test_csv_and_json_hold_every_documented_field(tmp_path):
    records = [_record("float32", 8, 100.0, 500.0), _record("amp-bfloat16", 8, 80.0, 450.0, "mxfp16"),
               not_run(BenchSpec(precision="float16", batch_size=8), "skipped", "needs a GPU. Details.")]
    doc = report.bench_document({"cpu_model": "x"}, records)
    json_path, csv_path = report.write_outputs(str(tmp_path), doc)
    loaded = json.loads(open(json_path).read())
    assert set(loaded) >= {"machine", "results", "speedup"}
    for row in loaded["results"]:
        assert set(report.RESULT_FIELDS) <= set(row)
    rows = list(csv.DictReader(open(csv_path)))
    assert [r["precision"] for r in rows] == ["float32", "amp-bfloat16", "float16"]
    assert float(rows[1]["speedup"]) == pytest.approx(100.0 / 80.0, rel=1e-5)
    assert rows[2]["status"] == "skipped"
    text = report.format_table(records)
    assert "SKIPPED: needs a GPU" in text and "1.25x" in text


def test_spec_rejects_bad_values():
    with pytest.raises(ValueError, match="mode"):
        BenchSpec(mode="fly")
    with pytest.raises(ValueError, match="batch_size"):
        BenchSpec(batch_size=0)
    spec = BenchSpec(model="cifar_resnet20_v1", batch_size=4)
    assert BenchSpec.from_json(spec.to_json()) == spec
