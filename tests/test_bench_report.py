"""Speedups, tables and files of the benchmark, from hand-made records (no processes)."""
import csv
import json
import shutil
from pathlib import Path

from mxfp16.bench import census, report
from mxfp16.bench.runner import BenchSpec, not_run

import pytest


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
    shares = {**dict.fromkeys(census.CLASSES, 0.0), "avx512_bf16": 60.0, "reference": 25.5, "reorder": 14.5}
    records[1]["census"] = {"status": "ok", "percent": shares}
    records[0]["census"] = {"status": "failed", "reason": "no oneDNN lines", "percent": {"amx": 99.0}}
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
    # The census's shares, one column per class; empty where none was taken or it failed.
    assert {name: float(rows[1][f"census_{name}_percent"]) for name in census.CLASSES} == shares
    assert all(rows[i][f"census_{name}_percent"] == "" for i in (0, 2) for name in census.CLASSES)
    text = report.format_table(records)
    assert "SKIPPED: needs a GPU" in text and "1.25x" in text


def test_spec_rejects_bad_values():
    with pytest.raises(ValueError, match="mode"):
        BenchSpec(mode="fly")
    with pytest.raises(ValueError, match="batch_size"):
        BenchSpec(batch_size=0)
    for name in ("warmup", "workers", "iters"):  # None is no count: refused here, not deep in the child
        with pytest.raises(ValueError, match=f"{name} must be .*got None"):
            BenchSpec(**{name: None})
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


def _rounds_of(row, ms_per_round, failed=()):
    """``row`` measured once per round: ``ms_per_round[i]`` in round i + 1, or failed in the rounds named."""
    out = []
    for i, ms in enumerate(ms_per_round, start=1):
        if i in failed:
            out.append(dict(row, round=i, status="failed", ms_per_step=None, images_per_second=None, reason="boom"))
        else:
            out.append(_round(row, i, ms))
    return out


def _hand_built_invocation():
    """Three rounds of mxfp16 float32 and amp-bfloat16 and of two peer rows; the peer's bfloat16 fails in round 2."""
    def peer_row(precision, layout):
        return dict(_record(precision, 16, 1.0, 900.0), framework="pytorch", layout=layout)

    ms = {"float32": [1200.0, 1300.0, 1190.0], "amp-bfloat16": [700.0, 725.0, 720.0],
          "pytorch-float32": [2000.0, 2060.0, 2040.0], "pytorch-bfloat16": [860.0, 780.0, 805.0]}
    rows = {"float32": _record("float32", 16, 1.0, 2000.0),
            "amp-bfloat16": _record("amp-bfloat16", 16, 1.0, 1600.0, "mxfp16"),
            "pytorch-float32": peer_row("pytorch-float32", "channels_last"),
            "pytorch-bfloat16": peer_row("pytorch-bfloat16", "channels_last")}
    failed = {"pytorch-bfloat16": (2,)}
    per_round = {name: _rounds_of(rows[name], ms[name], failed.get(name, ())) for name in rows}
    records = [per_round[name][i] for i in range(3) for name in rows]  # in turn, as run_suite runs them
    return records, ms, failed


def test_each_ratio_records_its_rounds_and_their_range():
    """Checked against ratios computed here by hand from the same per-round times."""
    records, ms, failed = _hand_built_invocation()
    doc = report.bench_document({}, records)

    speedup = [f / b for f, b in zip(ms["float32"], ms["amp-bfloat16"])]
    (entry,) = [e for e in doc["speedup"].values() if e["precision"] == "amp-bfloat16"]
    assert entry["round_ratios"] == pytest.approx(speedup)
    assert (entry["round_min"], entry["round_max"]) == pytest.approx((min(speedup), max(speedup)))
    assert entry["speedup"] == pytest.approx(sorted(speedup)[1])

    # img/s over img/s at one batch size is the inverse ratio of ms/step; round 2 of the peer's bfloat16 failed
    mixed = [p / m for i, (m, p) in enumerate(zip(ms["amp-bfloat16"], ms["pytorch-bfloat16"]), start=1)
             if i not in failed["pytorch-bfloat16"]]
    float32 = [p / m for m, p in zip(ms["float32"], ms["pytorch-float32"])]
    (peer,) = doc["peer"].values()
    assert peer["mixed_round_ratios"] == pytest.approx(mixed) and len(mixed) == 2
    assert (peer["mixed_round_min"], peer["mixed_round_max"]) == pytest.approx((min(mixed), max(mixed)))
    assert peer["mixed_ratio"] == pytest.approx(sum(mixed) / 2)  # the median of two
    assert peer["float32_round_ratios"] == pytest.approx(float32)
    assert (peer["float32_round_min"], peer["float32_round_max"]) == pytest.approx((min(float32), max(float32)))

    (bf16_row,) = [r for r in doc["results"] if r["precision"] == "amp-bfloat16"]
    (f32_row,) = [r for r in doc["results"] if r["precision"] == "float32"]
    assert report.round_spread(f32_row, bf16_row, "ms_per_step")["round_ratios"] == pytest.approx(speedup)


def test_one_round_records_no_spread():
    records = [_record("float32", 16, 400.0, 1000.0), _record("amp-bfloat16", 16, 250.0, 800.0, "mxfp16")]
    doc = report.bench_document({}, records)
    (entry,) = doc["speedup"].values()
    assert not {"round_ratios", "round_min", "round_max"} & set(entry)
    assert report.round_spread(records[0], records[1], "ms_per_step") is None
    assert report.format_speedups(doc["speedup"]).endswith(": 1.60x")


def test_the_printed_summary_shows_the_spread():
    records, _, _ = _hand_built_invocation()
    doc = report.bench_document({}, records)
    assert report.format_ratio(1.7119, 1.6473, 1.79) == "1.71x (rounds 1.65x-1.79x)"
    entry = next(e for e in doc["speedup"].values() if e["precision"] == "amp-bfloat16")
    line = next(l for l in report.format_speedups(doc["speedup"]).splitlines() if l.startswith("amp-bfloat16"))
    assert line.endswith(report.format_ratio(entry["speedup"], entry["round_min"], entry["round_max"]))
    text = report.format_peer_comparison(doc["peer"])
    assert text.count("(rounds ") == 2


RECORDED = Path(__file__).resolve().parents[1] / "docs" / "results" / "bench-r50-224-peer"


def test_the_committed_round_ratios_regenerate_from_the_recorded_rounds(tmp_path, capsys):
    """``python -m mxfp16.bench.report --round-ratios .../bench.json`` writes the committed file byte for byte."""
    shutil.copy(RECORDED / "bench.json", tmp_path / "bench.json")
    assert report.main(["--round-ratios", str(tmp_path / "bench.json")]) == 0
    assert (tmp_path / "round_ratios.json").read_bytes() == (RECORDED / "round_ratios.json").read_bytes()
    # the medians come out as recorded: the pairing is the one the recorded run used
    recorded = json.loads((RECORDED / "bench.json").read_text())
    derived = json.loads((RECORDED / "round_ratios.json").read_text())
    for key, entry in derived["speedup"].items():
        assert entry["speedup"] == pytest.approx(recorded["speedup"][key]["speedup"])
    for key, entry in derived["peer"].items():
        for kind in ("mixed", "float32"):
            assert entry[f"{kind}_ratio"] == pytest.approx(recorded["peer"][key][f"{kind}_ratio"])


def test_round_ratios_refuses_a_file_without_rounds(tmp_path, capsys):
    doc = report.bench_document({}, [_record("float32", 8, 100.0, 500.0), _record("amp-bfloat16", 8, 80.0, 450.0)])
    (tmp_path / "bench.json").write_text(json.dumps(doc))
    with pytest.raises(SystemExit):
        report.main(["--round-ratios", str(tmp_path / "bench.json")])
    assert "--rounds 1" in capsys.readouterr().err
    assert not (tmp_path / "round_ratios.json").exists()


def test_bar_labels_read_as_numbers_not_exponents():
    from mxfp16.bench.plots import _bar_text

    assert [_bar_text(h, "tokens_per_second") for h in (1196.08, 34.378, 2.5004, 0.01234)] == \
        ["1196", "34.4", "2.5", "0.0123"]
    assert _bar_text(1.0, "speedup") == "1.00" and _bar_text(float("nan"), "images_per_second") == ""
