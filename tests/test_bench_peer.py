"""The PyTorch peer in the benchmark: its rows, its absence, its failure, and the comparison arithmetic.

CI has no torch, so the end-to-end test shows the skip; a stand-in torch
that cannot train shows a crashing peer row next to mxfp16 rows that still
run. The real comparison is recorded in docs/benchmarks.md.
"""
import json

import pytest

from mxfp16.bench import peer, report
from mxfp16.cli import main

SMALL = ["--model", "resnet50_v2", "--image-size", "32", "--batch-sizes", "2", "--precisions", "float32",
         "--iters", "1", "--warmup", "0", "--repeats", "1", "--no-plots", "--peer", "pytorch"]


def _rows(out):
    return json.loads((out / "bench.json").read_text())


@pytest.mark.slow
def test_without_torch_the_peer_rows_are_skipped_and_mxfp16_rows_run(tmp_path, monkeypatch):
    monkeypatch.setattr(peer.importlib.util, "find_spec", lambda name: None if name == "torch" else object())
    assert main(["bench", *SMALL, "--out", str(tmp_path)]) == 0
    doc = _rows(tmp_path)
    mine = [r for r in doc["results"] if r["framework"] == "mxfp16"]
    peers = [r for r in doc["results"] if r["framework"] == "pytorch"]
    assert [r["status"] for r in mine] == ["ok"]
    assert [(r["precision"], r["layout"]) for r in peers] == [(f"pytorch-{d}", l) for d, l in peer.VARIANTS]
    assert all(r["status"] == "skipped" and "PyTorch is not installed" in r["reason"] and "mxfp16[peer]" in r["reason"]
               for r in peers)
    assert doc["config"]["peer"] == "pytorch" and "peer" not in doc  # nothing to compare with


@pytest.mark.slow
def test_a_peer_that_crashes_is_reported(tmp_path, monkeypatch):
    stand_in = tmp_path / "fake"
    (stand_in / "torch").mkdir(parents=True)
    (stand_in / "torch" / "__init__.py").write_text("__version__ = '2.0.0'\n")  # no nn, no autocast
    monkeypatch.setenv("PYTHONPATH", str(stand_in))  # the child imports it
    monkeypatch.syspath_prepend(str(stand_in))  # and this process sees that torch is "installed"
    spec = peer.plan_peer(type("Base", (), dict(model="resnet50_v2", image_size=32, classes=4, iters=1, warmup=0,
                                                repeats=1, seed=0)), [2], threads=1)[0]
    record = peer.run_in_subprocess(spec, timeout=120)
    assert record["status"] == "failed" and "torch" in record["reason"]
    assert record["framework"] == "pytorch" and record["images_per_second"] is None


def test_bad_peer_combinations_are_refused(tmp_path, capsys):
    assert main(["bench", *SMALL[:-2], "--peer", "pytorch", "--model", "cifar_resnet20_v1", "--out", str(tmp_path)]) == 2
    assert "ResNet-50" in capsys.readouterr().err
    assert main(["bench", *SMALL, "--mode", "inference", "--out", str(tmp_path)]) == 2
    assert "--mode train" in capsys.readouterr().err


def _row(framework, precision, ips, layout=None, ms=None):
    return {"framework": framework, "precision": precision, "layout": layout, "amp_lists": None, "status": "ok",
            "model": "resnet50_v2", "image_size": 224, "batch_size": 16, "mode": "train", "data": "synthetic",
            "ctx": "cpu", "images_per_second": ips, "ms_per_step": ms or 16000 / ips, "cpu_ms_per_step": None,
            "peak_memory_mb": 100.0}


def test_comparison_picks_the_fastest_rows_and_keeps_mxfp16_float32_as_the_baseline():
    records = [_row("mxfp16", "float32", 6.0), _row("mxfp16", "amp-bfloat16", 13.8),
               _row("pytorch", "pytorch-float32", 4.0, "NCHW"), _row("pytorch", "pytorch-float32", 5.0, "channels_last"),
               _row("pytorch", "pytorch-bfloat16", 9.0, "NCHW"), _row("pytorch", "pytorch-bfloat16", 12.0, "channels_last")]
    doc = report.bench_document({}, records)
    (entry,) = doc["peer"].values()
    assert entry["peer_mixed"] == {"label": "pytorch-bfloat16 (channels_last)", "images_per_second": 12.0}
    assert entry["mixed_ratio"] == pytest.approx(13.8 / 12.0) and entry["float32_ratio"] == pytest.approx(6.0 / 5.0)
    # every speedup, the peer's included, is against mxfp16's float32 row
    assert [r["speedup"] for r in records] == pytest.approx([1.0, 13.8 / 6.0, 4 / 6.0, 5 / 6.0, 9 / 6.0, 2.0])
    assert "13.80 img/s against pytorch-bfloat16 (channels_last) 12.00 img/s: 1.15x" in \
        report.format_peer_comparison(doc["peer"])


def test_with_rounds_the_peer_ratio_pairs_each_round():
    mine = [(6.0, 13.0), (4.0, 10.0), (5.0, 9.0)]  # (float32, amp-bfloat16) img/s per round
    peer = [(5.0, 12.0), (3.0, 8.0), (5.0, 12.0)]  # (float32, bfloat16) channels_last
    records = []
    for i, ((f, b), (pf, pb)) in enumerate(zip(mine, peer)):
        records += [dict(r, round=i + 1) for r in (
            _row("mxfp16", "float32", f), _row("mxfp16", "amp-bfloat16", b),
            _row("pytorch", "pytorch-float32", pf, "channels_last"),
            _row("pytorch", "pytorch-bfloat16", pb, "channels_last"))]
    doc = report.bench_document({}, records)
    assert len(doc["results"]) == 4 and all(len(r["rounds"]) == 3 for r in doc["results"])
    (entry,) = doc["peer"].values()
    mixed = sorted(b / pb for (_, b), (_, pb) in zip(mine, peer))  # 1.083, 1.25, 0.75
    assert entry["mixed_ratio"] == pytest.approx(mixed[1])
    assert entry["float32_ratio"] == pytest.approx(sorted(f / pf for (f, _), (pf, _) in zip(mine, peer))[1])
    assert entry["peer_mixed"] == {"label": "pytorch-bfloat16 (channels_last)", "images_per_second": 12.0}
