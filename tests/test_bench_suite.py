"""End to end: `mxfp16 bench` on a tiny model writes every documented file and field.

Every measurement runs in its own process, so these tests launch processes
(marked slow). The model is gluoncv's cifar_resnet20_v1 on 32 px images.
"""
import json
import os

from mxfp16.bench import report
from mxfp16.bench.runner import BenchSpec, not_run
from mxfp16.bench.suite import plan, run_suite
from mxfp16.cli import main
from mxfp16.machine import hardware

import pytest
from conftest import BFLOAT16, BFLOAT16_RUNS, requires_bfloat16

pytestmark = pytest.mark.slow
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--no-census", "--model", "cifar_resnet20_v1", "--image-size", "32", "--classes", "10",
        "--iters", "2", "--warmup", "1", "--repeats", "2"]


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    # auto is timed (cached per shape) to amp-bfloat16 or float32: naming both keeps three runs either way.
    status = main(["bench", *TINY, "--batch-sizes", "4", "--precisions", "auto,float32,amp-bfloat16,float16",
                   "--out", str(out)])
    assert status == 0
    return out, json.loads((out / "bench.json").read_text())


def test_writes_every_documented_file(bench_out):
    out, _ = bench_out
    for name in ("bench.json", "bench.csv"):
        assert (out / name).stat().st_size > 0
    for name in ("throughput.png", "memory.png", "speedup.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC


def test_results_have_every_field_and_the_cpu_float16_skip(bench_out):
    _, doc = bench_out
    assert set(doc) >= {"machine", "results", "speedup"}
    assert {"cpu_model", "cpu", "cpu_cores", "gpus", "mxnet_version", "cpu_bfloat16"} <= set(doc["machine"])
    assert doc["machine"]["cpu"] == hardware.cpu_identity()  # family and model too: a ratio depends on the CPU
    by_precision = {r["precision"]: r for r in doc["results"] if r["amp_lists"] in (None, "mxfp16")}
    assert set(by_precision) == {"float32", "amp-bfloat16", "float16"}  # auto resolved, reported by name
    verdict = doc["config"]["auto"]["4"]  # what auto was at batch 4, and why
    assert verdict["precision"] in ("float32", "amp-bfloat16") and verdict["reason"]
    # One run for auto and its name; a route under other lists (the 3-channel stem's) is a run of its own.
    (auto,) = [r for r in doc["results"] if r["requested_precision"] == "auto"]
    routed = verdict["precision"] == "amp-bfloat16" and verdict["amp_lists"] != "mxfp16"
    assert auto["precision"] == verdict["precision"] and (auto is by_precision[verdict["precision"]]) != routed
    assert auto["amp_lists"] == (verdict["amp_lists"] if auto["precision"] == "amp-bfloat16" else None)
    assert len(doc["results"]) == 3 + routed
    if not BFLOAT16.runs:  # refused before any process starts, naming what the CPU lacks
        row = by_precision["amp-bfloat16"]
        assert row["status"] == "skipped" and BFLOAT16.reason in row["reason"]
    for name in ("float32", "amp-bfloat16") if BFLOAT16_RUNS else ("float32",):
        row = by_precision[name]
        assert row["status"] == "ok"
        for field in report.RESULT_FIELDS:
            assert row[field] is not None, field
        assert ((row["model"], row["image_size"], row["batch_size"], row["mode"])
                == ("cifar_resnet20_v1", 32, 4, "train"))
        # ms/step and img/s are two views of one measurement; the spread comes from the repeats.
        assert row["images_per_second"] == pytest.approx(4 * 1000.0 / row["ms_per_step"])
        repeats = row["ms_per_step_repeats"]
        assert len(repeats) == 2 and min(repeats) <= row["ms_per_step"] <= max(repeats)
        assert row["ms_per_step_spread"] == pytest.approx((max(repeats) - min(repeats)) / 2)
        assert row["peak_memory_mb"] > 10
    skipped = by_precision["float16"]
    assert skipped["status"] == "skipped" and "CPU" in skipped["reason"]
    assert doc["tensor_cores"]["batch_sizes"] == {"4": False}
    assert any(layer["in"] == 3 for layer in doc["tensor_cores"]["misaligned"])


@requires_bfloat16
def test_speedup_comes_from_runs_of_this_invocation(bench_out):
    _, doc = bench_out
    results = doc["results"]
    assert len({r["invocation"] for r in results}) == 1
    f32 = next(r for r in results if r["precision"] == "float32")
    bf16 = next(r for r in results if r["precision"] == "amp-bfloat16")
    (entry,) = [e for e in doc["speedup"].values() if e["amp_lists"] == bf16["amp_lists"]]  # auto's route: a row too
    assert entry["speedup"] == pytest.approx(f32["ms_per_step"] / bf16["ms_per_step"])
    assert entry["memory_ratio"] == pytest.approx(bf16["peak_memory_mb"] / f32["peak_memory_mb"])
    assert entry["cpu_speedup"] == pytest.approx(f32["cpu_ms_per_step"] / bf16["cpu_ms_per_step"])


def test_a_crashing_run_is_reported_and_the_others_still_run():
    base = BenchSpec(image_size=32, iters=1, warmup=0, repeats=1)
    specs = [BenchSpec(model="no_such_model", image_size=32, iters=1, warmup=0, repeats=1),
             *plan(base, ["float16"], [4])]
    seen = []
    records = run_suite(specs, on_result=seen.append)
    assert [r["status"] for r in records] == ["failed", "skipped"] == [r["status"] for r in seen]
    assert "no_such_model" in records[0]["reason"]
    assert "float16" in records[1]["reason"]


def test_bad_flags_are_user_errors(tmp_path, capsys):
    assert main(["bench", "--precisions", "float32,float8", "--out", str(tmp_path)]) == 2
    assert "float8" in capsys.readouterr().err
    assert main(["bench", "--batch-sizes", "16,x", "--out", str(tmp_path)]) == 2
    assert main(["bench", "--model", "resnet9000", "--out", str(tmp_path)]) == 2
    assert main(["bench", "--rounds", "0", "--out", str(tmp_path)]) == 2
    assert "argument --rounds: 0: must be between 1 and 1000" in capsys.readouterr().err
    assert not os.listdir(tmp_path)


def test_rounds_run_the_whole_list_in_turn():
    base = BenchSpec(image_size=32, iters=1, warmup=0, repeats=1)
    specs = plan(base, ["float16"], [4, 8])  # float16 is skipped on a CPU: no process needed
    records = run_suite(specs, rounds=2)
    assert [(r["round"], r["batch_size"]) for r in records] == [(1, 4), (1, 8), (2, 4), (2, 8)]
    assert len({r["invocation"] for r in records}) == 1
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        run_suite(specs, rounds=0)


def test_a_run_that_failed_is_not_run_again_in_later_rounds(monkeypatch):
    from mxfp16.bench import suite

    calls = []

    def fake_run(spec, timeout=None):
        calls.append((spec.batch_size, timeout))
        if spec.batch_size == 4:  # fails in round 1, as a timeout does
            return dict(not_run(spec, "failed", "Traceback ...\ntimed out after 9 s"), images_per_second=None)
        return dict(not_run(spec, "ok", None), ms_per_step=10.0, images_per_second=100.0, peak_memory_mb=1.0)

    monkeypatch.setattr(suite, "run_in_subprocess", fake_run)
    specs = plan(BenchSpec(image_size=32, iters=1, warmup=0, repeats=1), ["float32"], [4, 8])
    records = run_suite(specs, rounds=3, timeout=9)
    assert calls == [(4, 9), (8, 9), (8, 9), (8, 9)]  # batch 4 ran once
    again = [r for r in records if r["batch_size"] == 4]
    assert [(r["round"], r["status"]) for r in again] == [(1, "failed"), (2, "skipped"), (3, "skipped")]
    assert again[1]["reason"] == "failed in round 1 (timed out after 9 s); not run again"
    merged = {r["batch_size"]: r for r in report.merge_rounds(records)}
    assert merged[4]["status"] == "failed" and [e["status"] for e in merged[4]["rounds"]] == \
        ["failed", "skipped", "skipped"]
    assert merged[8]["status"] == "ok" and len(merged[8]["rounds"]) == 3


@requires_bfloat16
def test_rounds_record_and_print_the_spread_of_each_ratio(tmp_path, capsys):
    assert main(["bench", *TINY, "--batch-sizes", "4", "--precisions", "float32,amp-bfloat16", "--rounds", "2",
                 "--no-plots", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "bench.json").read_text())
    (entry,) = doc["speedup"].values()
    assert len(entry["round_ratios"]) == 2
    assert entry["round_min"] == min(entry["round_ratios"]) and entry["round_max"] == max(entry["round_ratios"])
    expected = report.format_ratio(entry["speedup"], entry["round_min"], entry["round_max"])
    assert expected in capsys.readouterr().out and "(rounds " in expected
