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


def _round(record, round_, ms, cpu=None, peak=None):
    return dict(record, round=round_, ms_per_step=ms, images_per_second=record["batch_size"] / (ms / 1000.0),
                cpu_ms_per_step=cpu, peak_memory_mb=peak or record["peak_memory_mb"])


def test_rounds_merge_to_medians_and_speedups_pair_each_round():
    """Each round's ratio first, then the median: a drifting machine moves both runs of a round together."""
    f32, bf16 = _record("float32", 16, 1.0, 1000.0), _record("amp-bfloat16", 16, 1.0, 800.0, "mxfp16")
    f32_ms, bf16_ms = [400.0, 600.0, 800.0], [200.0, 380.0, 330.0]
    records = []
    for i in range(3):
        records += [_round(f32, i + 1, f32_ms[i], cpu=2 * f32_ms[i], peak=1000.0 + i),
                    _round(bf16, i + 1, bf16_ms[i], cpu=2 * bf16_ms[i])]
    doc = report.bench_document({}, records)
    merged = doc["results"]
    assert [r["precision"] for r in merged] == ["float32", "amp-bfloat16"]
    assert merged[0]["ms_per_step"] == 600.0 and merged[1]["ms_per_step"] == 330.0
    assert merged[1]["images_per_second"] == pytest.approx(16 / 0.330)
    assert merged[0]["ms_per_step_spread"] == 200.0 and merged[0]["peak_memory_mb"] == 1002.0
    assert [e["ms_per_step"] for e in merged[1]["rounds"]] == bf16_ms and "round" not in merged[1]
    ratios = sorted(a / b for a, b in zip(f32_ms, bf16_ms))  # 2.0, 1.58, 2.42: median 2.0
    assert merged[1]["speedup"] == pytest.approx(ratios[1]) and merged[1]["cpu_speedup"] == pytest.approx(ratios[1])
    assert ratios[1] != pytest.approx(600.0 / 330.0)  # not the ratio of the medians
    (entry,) = doc["speedup"].values()
    assert entry["speedup"] == pytest.approx(ratios[1])


def test_a_round_that_failed_is_left_out_of_the_pairs():
    f32, bf16 = _record("float32", 8, 1.0, 500.0), _record("amp-bfloat16", 8, 1.0, 400.0, "mxfp16")
    failed = dict(bf16, round=2, status="failed", ms_per_step=None, images_per_second=None, reason="boom")
    records = [_round(f32, 1, 100.0), _round(bf16, 1, 50.0), _round(f32, 2, 300.0), failed,
               _round(f32, 3, 120.0), _round(bf16, 3, 80.0)]
    merged = report.merge_rounds(records)
    assert merged[1]["status"] == "ok" and merged[1]["ms_per_step"] == pytest.approx(65.0)
    assert [e["status"] for e in merged[1]["rounds"]] == ["ok", "failed", "ok"]
    report.add_speedups(merged)
    assert merged[1]["speedup"] == pytest.approx((2.0 + 1.5) / 2)  # rounds 1 and 3 only
    one = [_record("float32", 8, 100.0, 500.0)]
    assert report.merge_rounds(one) is one  # a single round is left as it is
