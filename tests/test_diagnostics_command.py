"""``mxfp16 diagnose`` end to end on the demo data (tiny images, one batch)."""
import json
import math

from mxfp16.cli import main

import pytest
from conftest import REPO


@pytest.fixture
def in_repo(monkeypatch):
    # The demo set lives in <repo>/data/demo and is generated once, then reused.
    monkeypatch.chdir(REPO)


def test_diagnose_writes_a_png_a_table_and_json_on_the_demo_data(in_repo, tmp_path, capsys):
    out = tmp_path / "diag"
    code = main(["diagnose", "--model", "cifar_resnet20_v1", "--image-size", "16", "--batch-size", "8",
                 "--batches", "1", "--loss-scale", "1024", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    png = (out / "gradient_histogram.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    table = (out / "diagnose.txt").read_text()
    for text in (printed, table):
        assert "underflow" in text and "recommended loss scale" in text
    document = json.loads((out / "diagnose.json").read_text())
    rec = document["recommendation"]
    assert rec["scale"] == 2.0 ** rec["log2_scale"]
    assert rec["max_abs"] * rec["scale"] * rec["margin"] <= document["float16"]["max"]
    layers = document["layers"]
    assert {layer["kind"] for layer in layers} == {"parameter", "activation"}
    # One table row per layer, worst underflow at --loss-scale first.
    for layer in layers:
        assert layer["name"] in table
    worst = [layer["at_scale"]["1024"]["underflow"] for layer in layers]
    assert worst == sorted(worst, reverse=True)
    assert "Conv2D" in document["forward_check"]["skipped"]


def test_diagnose_runs_the_float16_forward_check_for_an_elementwise_net(in_repo, tmp_path, capsys):
    code = main(["diagnose", "--model", "elementwise-mlp", "--image-size", "8", "--batch-size", "4",
                 "--batches", "1", "--no-activations", "--json", "--out", str(tmp_path)])
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    forward = document["forward_check"]
    assert forward["dtype"] == "float16" and forward["layers"]
    assert {layer["kind"] for layer in document["layers"]} == {"parameter"}
    assert math.log2(document["loss_scale"]).is_integer()


@pytest.mark.parametrize("flags,words", [
    (["--loss-scale", "1000"], "power of two"),
    (["--margin", "0.5"], "--margin"),
    (["--data-dir", "/nonexistent"], "train/"),
])
def test_bad_flags_fail_with_the_fix_before_any_work(tmp_path, capsys, flags, words):
    assert main(["diagnose", "--out", str(tmp_path)] + flags) == 2
    assert words in capsys.readouterr().err
