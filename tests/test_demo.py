"""``mxfp16 demo`` (what ``make demo`` runs): its first line says what auto is here, and no run is compared with
itself."""
from mxfp16.cli import main
from mxfp16.commands import demo

import pytest


@pytest.fixture
def commands(monkeypatch):
    ran = []
    monkeypatch.setattr(demo, "_mxfp16", lambda *args: ran.append(list(args)) or True)
    return ran


def test_where_auto_is_float32_the_demo_trains_float32_once_and_says_why(commands, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(demo, "resolve_auto", lambda: ("float32", "bfloat16 does not run here: this CPU lacks avx512f"))
    assert main(["demo", "--out", str(tmp_path / "d")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "demo: auto trains in float32 here: bfloat16 does not run here: this CPU lacks avx512f"
    assert [c[:3] for c in commands] == [["train", "--precision", "float32"]]
    assert "not a speedup" in lines[-1]


def test_where_auto_is_mixed_precision_both_train_and_are_compared(commands, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(demo, "resolve_auto", lambda: ("amp-bfloat16", "measured 1.20x"))
    out = tmp_path / "d"
    assert main(["demo", "--out", str(out), "--epochs", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "demo: auto trains in amp-bfloat16 here: measured 1.20x"
    train_f32, train_mixed, compare = commands
    assert train_f32 == ["train", "--precision", "float32", "--out", str(out / "float32"), "--epochs", "2"]
    assert train_mixed[:4] == ["train", "--precision", "amp-bfloat16", "--out"]
    assert compare == ["compare", str(out / "float32"), str(out / "amp-bfloat16"), "--out", str(out / "compare")]


def test_a_failed_run_stops_the_demo(monkeypatch, tmp_path):
    monkeypatch.setattr(demo, "resolve_auto", lambda: ("amp-bfloat16", "measured 1.20x"))
    monkeypatch.setattr(demo, "_mxfp16", lambda *args: False)
    assert main(["demo", "--out", str(tmp_path / "d")]) == 1


def test_auto_for_the_demo_is_the_trainers_verdict_for_the_demo_model(monkeypatch):
    from mxfp16.data.synth import DEMO_SETTINGS
    from mxfp16.measure import auto
    from mxfp16.train import parts
    from mxfp16.train.config import PROFILES

    asked = []
    monkeypatch.setattr(parts, "auto_verdict", lambda spec, ctx, log: asked.append(spec) or auto.AutoVerdict(
        "amp-bfloat16", "timed on this CPU: 1.30x", True))
    assert demo.resolve_auto(log=lambda line: None) == ("amp-bfloat16", "timed on this CPU: 1.30x")
    (spec,) = asked  # the shape the demo's own auto run trains: the same cached verdict
    profile = PROFILES["demo"]
    assert (spec.model, spec.image_size, spec.batch_size, spec.classes) == (
        profile["model"], profile["image_size"], profile["batch_size"], DEMO_SETTINGS["classes"])
