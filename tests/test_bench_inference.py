"""`mxfp16 bench --mode inference`: latency percentiles and throughput of the exported network, own processes."""
import json

import pytest

from conftest import CPU_MIXED
from mxfp16.bench import report
from mxfp16.bench.runner import latency_fields
from mxfp16.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--model", "cifar_resnet20_v1", "--image-size", "32", "--classes", "10", "--iters", "4", "--warmup", "1",
        "--repeats", "2"]


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
