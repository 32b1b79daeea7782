"""`mxfp16 bench --mode inference`: latency percentiles and throughput of the exported network, own processes."""
import json

from mxfp16.bench import report
from mxfp16.bench.runner import latency_fields
from mxfp16.cli import main

import pytest
from conftest import CPU_MIXED

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--model", "cifar_resnet20_v1", "--image-size", "32", "--classes", "10", "--iters", "4", "--warmup", "1",
        "--repeats", "2", "--no-census"]


@pytest.mark.slow
def test_inference_mode_reports_latency_percentiles_and_throughput(tmp_path, capsys):
    # amp-bfloat16 where this CPU runs it; elsewhere float32 alone, which still checks every field.
    assert main(["bench", "--mode", "inference", *TINY, "--precisions", f"float32,{CPU_MIXED}", "--out",
                 str(tmp_path)]) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "bench.json").read_text())
    rows = doc["results"]
    # The inference defaults: batch 1 (latency) and batch 32 (throughput), float32 first in each.
    assert [(r["batch_size"], r["precision"]) for r in rows] == [
        (size, name) for size in (1, 32) for name in dict.fromkeys(("float32", CPU_MIXED))]
    for r in rows:
        assert r["status"] == "ok" and r["mode"] == "inference" and r["latency_samples"] == 8
        assert 0 < r["latency_ms_median"] <= r["latency_ms_p90"] <= r["latency_ms_p99"]
        assert r["images_per_second"] == pytest.approx(r["batch_size"] * 1000.0 / r["ms_per_step"])
    assert doc["config"]["batch_sizes"] == "1,32" and doc["config"]["iters"] == 4
    assert "p99 ms" in out and "latency median" in out
    assert (tmp_path / "latency.png").read_bytes()[:8] == PNG_MAGIC
    header = (tmp_path / "bench.csv").read_text().splitlines()[0].split(",")
    assert set(report.LATENCY_FIELDS) <= set(header)


def test_latency_fields_are_percentiles_of_the_calls_in_milliseconds():
    seconds = [i / 1000.0 for i in range(1, 101)]  # 1 .. 100 ms
    fields = latency_fields(seconds)
    assert fields["latency_samples"] == 100
    assert fields["latency_ms_median"] == pytest.approx(50.5)
    assert fields["latency_ms_p90"] == pytest.approx(90.1)
    assert fields["latency_ms_p99"] == pytest.approx(99.01)


@pytest.mark.slow
def test_onnxruntime_rows_run_the_onnx_export_beside_mxnet_and_say_why_float16_is_not_timed_on_a_cpu(
        tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    assert main(["bench", "--mode", "inference", *TINY, "--batch-sizes", "2", "--precisions", "float32",
                 "--onnxruntime", "--ctx", "cpu", "--no-plots", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "bench.json").read_text())
    rows = doc["results"]
    assert [(r.get("framework"), r["precision"], r["status"]) for r in rows] == [
        ("mxfp16", "float32", "ok"), ("onnxruntime", "float32", "ok"), ("onnxruntime", "float16", "skipped")]
    mxnet, ort, f16 = rows
    assert ort["execution_provider"] == "CPUExecutionProvider" and ort["latency_samples"] == 8
    assert ort["threads"] == mxnet["threads"] or ort["threads"] is None
    assert ort["speedup"] == pytest.approx(mxnet["ms_per_step"] / ort["ms_per_step"])  # against MXNet float32
    assert "GPU execution providers" in f16["reason"] and "slower than float32" in f16["reason"]
    assert "peer" not in doc and doc["config"]["onnxruntime"] is True
    assert "onnxruntime float32" in out and "onnxruntime float16" in out and "SKIPPED" in out


def test_onnxruntime_rows_are_neither_the_baseline_nor_a_peer_and_need_inference_mode(capsys):
    rows = [{"framework": "mxfp16", "precision": "float32", "status": "ok", "ms_per_step": 10.0,
             "cpu_ms_per_step": 10.0, "peak_memory_mb": 100.0, "batch_size": 1, "model": "m", "image_size": 8,
             "mode": "inference", "data": "synthetic", "ctx": "cpu", "amp_lists": None, "images_per_second": 100.0},
            {"framework": "onnxruntime", "precision": "float32", "status": "ok", "ms_per_step": 5.0,
             "cpu_ms_per_step": 4.0, "peak_memory_mb": 120.0, "batch_size": 1, "model": "m", "image_size": 8,
             "mode": "inference", "data": "synthetic", "ctx": "cpu", "amp_lists": None, "images_per_second": 200.0}]
    doc = report.bench_document({}, rows)
    assert [r["speedup"] for r in doc["results"]] == [1.0, 2.0] and "peer" not in doc
    assert report.label(rows[1]) == "onnxruntime float32"
    assert main(["bench", "--mode", "train", "--onnxruntime", "--out", "/nonexistent/never"]) == 2
    assert "use it with --mode inference" in capsys.readouterr().err
