"""`make measure` (tools/measure.py over mxfp16.bench.measure_plan): the plan per CPU class, the budget, the table.

A real measurement takes an hour and even a --quick one minutes (a `mxfp16 bench` per model), so the benchmarks
themselves are not run here: the plan is checked on this CPU and on an AVX2 one (the class monkeypatched), the
budget with steps that sleep or fail, the summary on recorded bench.json files, and the tool end to end with a
budget that lets only `mxfp16 info` run, so every benchmark step is recorded as skipped with its reason.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

from mxfp16.bench import measure_plan
from mxfp16.machine import hardware

import pytest
from conftest import REPO, child_env

RESULTS = os.path.join(REPO, "docs", "results")
BENCHES = [f"bench-{m.name}" for m in measure_plan.MODELS]


def _tool():
    spec = importlib.util.spec_from_file_location("measure_tool", os.path.join(REPO, "tools", "measure.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _precisions(step):
    return step.argv[step.argv.index("--precisions") + 1]


def test_the_plan_on_this_cpu_names_its_class_and_runs_the_table_in_order():
    facts = measure_plan.machine_facts()
    assert facts["cpu_class"] == hardware.cpu_class() and facts["slug"].startswith("measure-")
    steps, notes = measure_plan.plan_steps(facts, missing=lambda name: name == "torch")
    assert [s.name for s in steps] == ["info", "amx-check", *BENCHES]
    assert (steps[1].skip is None) == (facts["cpu_class"] == "AMX")
    assert any("torch not installed" in note for note in notes)
    assert all("--peer" not in s.argv and "--rounds" in s.argv for s in steps[2:])
    resnet = steps[2].argv
    assert resnet[resnet.index("--image-size") + 1] == "224" and resnet[resnet.index("--batch-sizes") + 1] == "16"
    if facts["bfloat16"]["runs"]:
        assert _precisions(steps[2]) == _precisions(steps[3]) == "float32,amp-bfloat16,auto"  # families time it too


def test_an_avx2_cpu_is_told_in_one_line_and_plans_float32_rows_only(monkeypatch, capsys):
    monkeypatch.setattr(hardware, "cpu_class", lambda flags=None: "AVX2")
    facts = measure_plan.machine_facts()
    assert not facts["bfloat16"]["runs"] and facts["slug"].startswith("measure-avx2")
    steps, notes = measure_plan.plan_steps(facts, quick=True, missing=lambda name: False)
    assert notes[0].startswith("bfloat16 does not run on this CPU (AVX2") and notes[0].endswith("float32 rows only")
    assert {_precisions(s) for s in steps if s.model} == {"float32"}
    assert all("--peer" in s.argv for s in steps if s.model)  # torch "there": the peer's float32 rows too
    assert _tool().main(["--plan", "--quick"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("CPU class AVX2") and sum("does not run on this CPU" in x for x in printed) == 1


def test_a_quick_plan_uses_the_bench_tests_tiny_sizes_and_one_round():
    steps, _ = measure_plan.plan_steps(measure_plan.machine_facts(), quick=True, missing=lambda name: False)
    lstm = next(s for s in steps if s.model == "word-lm-lstm").argv
    assert "hidden=8" in lstm and lstm[lstm.index("--rounds") + 1] == "1" and lstm[lstm.index("--iters") + 1] == "1"
    resnet = next(s for s in steps if s.model == "resnet50_v2").argv
    assert resnet[resnet.index("--image-size") + 1] == "32"
    weights = {s.model: s.weight for s in steps if s.model}  # tiny sizes: the time is auto's, in the classifiers
    assert weights["resnet50_v2"] == weights["mobilenetv2_1.0"] > weights["word-lm-lstm"] == weights["dcgan"]
    full, _ = measure_plan.plan_steps(measure_plan.machine_facts(), missing=lambda name: False)
    assert [s.weight for s in full if s.model] == [m.weight for m in measure_plan.MODELS]


def test_the_routes_for_what_the_amx_profiles_show_are_measured_beside_the_defaults():
    facts = measure_plan.machine_facts()
    steps, _ = measure_plan.plan_steps(facts, missing=lambda name: False)
    by_name = {s.model: s for s in steps if s.model}
    lstm, unfused = by_name["word-lm-lstm"].argv, by_name["word-lm-lstm-unfused"].argv
    assert "unfused_bf16=1" not in lstm and unfused[unfused.index("--model") + 1] == "word-lm-lstm"
    assert unfused[unfused.index("unfused_bf16=1") - 1] == "--model-option" and "--peer" in unfused
    assert _precisions(by_name["word-lm-lstm-unfused"]) == ("float32,amp-bfloat16" if facts["bfloat16"]["runs"]
                                                            else "float32")  # its ratio from one run; no auto
    dcgan, routed = by_name["dcgan"].argv, by_name["dcgan-bf16-deconv"].argv
    assert "bf16_deconv=1" not in dcgan and routed[routed.index("bf16_deconv=1") - 1] == "--model-option"
    assert _precisions(by_name["dcgan-bf16-deconv"]) == _precisions(by_name["word-lm-lstm-unfused"])
    mobilenet = by_name["mobilenetv2_1.0"].argv
    assert mobilenet[mobilenet.index("--amp-lists") + 1].split(",") == ["mxfp16", "mxfp16+batchnorm32",
                                                                         "mxfp16+unaligned32"]


def test_each_step_gets_its_share_and_is_skipped_with_a_reason_when_the_budget_is_spent(tmp_path):
    now = [0.0]
    ran = []

    def run(step, argv, allowance, folder):
        ran.append((step.name, argv, allowance))
        now[0] += {"a": 10.0, "b": 80.0}.get(step.name, 1.0)
        return "ok", None

    steps = [measure_plan.Step("a", ["x", measure_plan.ALLOWANCE], 1.0, 5.0),
             measure_plan.Step("b", ["y"], 1.0, 5.0), measure_plan.Step("c", ["z"], 2.0, 50.0),
             measure_plan.Step("d", ["w"], 1.0, 5.0, skip="not on this CPU")]
    records = measure_plan.run_steps(steps, 100.0, str(tmp_path), run=run, clock=lambda: now[0], log=lambda x: None)
    assert ran[0] == ("a", ["x", "25"], 25.0)  # 100 s x 1 / (1 + 1 + 2); the skipped step has no share
    assert ran[1][2] == pytest.approx(30.0)  # what a left: 90 x 1 / 3
    assert [r["status"] for r in records] == ["ok", "ok", "skipped", "skipped"]
    assert records[2]["reason"].startswith("budget spent: its share is 10 s of the 10 s left, under the 50 s")
    assert records[3]["reason"] == "not on this CPU" and records[0]["command"] == "x 25"


def test_a_step_over_its_share_is_stopped_and_a_failing_one_says_why(tmp_path):
    sleeper = measure_plan.Step("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], 1.0, 0.1)
    failing = measure_plan.Step("failing", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], 1.0, 0.1)
    assert measure_plan.run_child(sleeper, sleeper.argv, 1.0, str(tmp_path))[0] == "timed-out"
    status, reason = measure_plan.run_child(failing, failing.argv, 30.0, str(tmp_path))
    assert status == "failed" and reason.startswith("exit status 3") and "boom" in reason
    assert (tmp_path / "failing.log").read_text().strip() == "boom"


def _recorded(folder):
    with open(os.path.join(RESULTS, folder, "bench.json"), encoding="utf-8") as handle:
        return json.load(handle)


def test_the_summary_reads_the_ratios_of_a_recorded_benchmark():
    doc = _recorded("bench-r50-224-zen4")  # float32, amp-bfloat16, auto (timed) and the PyTorch peer
    row = measure_plan.summary_row(doc)
    bf16 = next(r for r in doc["results"] if r["precision"] == "amp-bfloat16")
    peer = next(iter(doc["peer"].values()))
    assert row["unit"] == "img/s" and row["batch_size"] == 16 and row["bfloat16"] == bf16["images_per_second"]
    assert row["bf16_over_fp32"] == bf16["speedup"] and row["auto"] == "amp-bfloat16"
    assert row["auto_over_fp32"] == bf16["speedup"]
    assert row["bf16_over_pytorch_bf16"] == peer["mixed_ratio"]
    assert row["fp32_over_pytorch_fp32"] == peer["float32_ratio"]
    assert row["pytorch_best_bf16_label"] == peer["peer_mixed"]["label"]

    avx2 = measure_plan.summary_row(_recorded("bench-families-zen3/word-lm-lstm"))  # bfloat16 refused there
    assert avx2["unit"] == "tokens/s" and avx2["bfloat16"] is None and avx2["bf16_over_pytorch_bf16"] is None
    assert avx2["bfloat16_status"].startswith("skipped") and avx2["fp32_over_pytorch_fp32"] is not None


def test_with_several_amp_lists_the_fastest_bfloat16_row_stands_and_is_named():
    doc = _recorded("bench-families-amx-emerald-rapids/bench-mbv2")  # mxfp16, measured, mxfp16+depthwise32 lists
    bf16 = [r for r in doc["results"] if r.get("framework", "mxfp16") == "mxfp16"
            and r["precision"] == "amp-bfloat16" and r["status"] == "ok"]
    fastest = sorted(bf16, key=lambda r: r["images_per_second"])[-1]
    assert len(bf16) == 3 and fastest["amp_lists"] != "mxfp16"  # not the first row: the choice is tested
    row = measure_plan.summary_row(doc)
    assert row["bfloat16"] == fastest["images_per_second"] and row["bf16_over_fp32"] == fastest["speedup"]
    assert row["bfloat16_lists"] == fastest["amp_lists"] and f"({fastest['amp_lists']} lists)" in \
        measure_plan.table_lines({"mobilenetv2_1.0": row})[2]
    assert measure_plan.summary_row(_recorded("bench-r50-224-zen4"))["bfloat16_lists"] is None  # one row: no name


def test_a_familys_auto_row_fills_the_auto_column():
    doc = _recorded("bench-families-amx-emerald-rapids/bench-lstm")  # float32 and amp-bfloat16, no auto
    rows = [r for r in doc["results"] if r.get("framework", "mxfp16") == "mxfp16"]
    assert measure_plan.summary_row(doc)["auto"] is None
    bf16 = next(r for r in rows if r["precision"] == "amp-bfloat16")
    doc["results"].append(dict(bf16, requested_precision="auto", auto_reason="timed on this CPU: ...", speedup=1.4))
    doc["config"]["precisions"] = "float32,amp-bfloat16,auto"
    row = measure_plan.summary_row(doc)
    assert row["auto"] == "amp-bfloat16" and row["auto_over_fp32"] == 1.4
    assert row["bfloat16"] == bf16["tokens_per_second"]  # the auto row is not a bfloat16 route of its own


def test_the_figures_are_registered_by_folder_and_quoted_from_measure_json(tmp_path):
    summary = {"resnet50_v2": measure_plan.summary_row(_recorded("bench-r50-224-zen4")),
               "word-lm-lstm": measure_plan.summary_row(_recorded("bench-families-zen3/word-lm-lstm"))}
    (tmp_path / "measure-x").mkdir()
    (tmp_path / "measure-x" / "measure.json").write_text(json.dumps({"summary": summary}))
    registry = tmp_path / "figures.json"
    registry.write_text(json.dumps({"other": {"file": "f", "path": "p", "format": "{}"},
                                    "measure.measure-x.gone.bf16_over_fp32": {}}, indent=1) + "\n")
    entries = measure_plan.figure_entries("measure-x", summary)
    written = measure_plan.update_registry(str(registry), "measure-x", entries)
    assert "other" in written and "measure.measure-x.gone.bf16_over_fp32" not in written  # the old run's are gone
    assert "measure.measure-x.word-lm-lstm.bf16_over_fp32" not in written  # no bfloat16 there: no figure
    spec = importlib.util.spec_from_file_location("figures", os.path.join(REPO, "docs", "hooks", "figures.py"))
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    key = "measure.measure-x.resnet50_v2.bf16_over_fp32"
    assert figures.value(key, written, tmp_path) == f"{summary['resnet50_v2']['bf16_over_fp32']:.2f}x"
    table = figures.table("measure.measure-x", written, tmp_path).splitlines()
    assert len(table) == 4 and table[-1].startswith("| word-lm-lstm 35tok, batch 32 |") and "—" in table[-1]


@pytest.mark.slow
def test_the_tool_writes_its_folder_with_every_step_recorded_within_a_tiny_budget(tmp_path):
    """18 s: `mxfp16 info` runs (a few seconds), every benchmark's share is then under its floor."""
    out = tmp_path / "m"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "measure.py"), "--quick", "--budget", "0.3",
                           "--out", str(out)], capture_output=True, text=True, env=child_env(), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((out / "measure.json").read_text())
    assert doc["cpu_class"] == hardware.cpu_class() and doc["quick"] and doc["budget_minutes"] == 0.3
    assert {"cpu", "bfloat16", "threads", "python", "numpy", "mxnet", "steps", "summary", "seconds"} <= set(doc)
    steps = {s["name"]: s for s in doc["steps"]}
    assert list(steps) == ["info", "amx-check", *BENCHES] and steps["info"]["status"] == "ok"
    assert doc["threads"] and doc["mxnet"] == "1.9.1"  # read from info.json
    for name in BENCHES:
        assert steps[name]["status"] == "skipped" and steps[name]["reason"], steps[name]
    assert any(steps[n]["reason"].startswith("budget spent") for n in BENCHES)
    assert doc["summary"] == {} and "| step | status |" in (out / "measure.md").read_text()
    assert (out / "info.json").is_file() and (out / "lscpu.txt").is_file() == bool(shutil.which("lscpu"))
    assert os.listdir(tmp_path) == ["m"]  # the temporary folder took the folder's place
    head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    assert doc["commit"].rstrip("+") == head.stdout.strip() if head.returncode == 0 else doc["commit"] is None
    assert f"CPU class {hardware.cpu_class()}" in proc.stdout.splitlines()[0]


def test_recording_says_in_one_line_when_a_page_quotes_a_figure_with_no_source(tmp_path, monkeypatch, capsys):
    # A copy of the figures hook in a tree of its own: its pages, its registry; the checkout's are not touched.
    (tmp_path / "docs" / "hooks").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "measure-x").mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "docs", "hooks", "figures.py"), tmp_path / "docs" / "hooks")
    (tmp_path / "docs" / "results" / "figures.json").write_text("{}\n")
    page = "a <!-- fig nowhere.to.be.found -->1.00x<!-- /fig --> figure\n"
    (tmp_path / "docs" / "page.md").write_text(page)
    (tmp_path / "README.md").write_text("readme\n")
    tool = _tool()
    monkeypatch.setattr(tool, "REPO", str(tmp_path))
    monkeypatch.setattr(tool, "RESULTS", str(tmp_path / "docs" / "results"))
    row = {"float32": 10.0, "bfloat16": 12.0, "bf16_over_fp32": 1.2, "unit": "img/s"}
    assert tool._record(str(tmp_path / "docs" / "results" / "measure-x"), {"dcgan": row}) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'nowhere.to.be.found'" in err[0] and "figures.py lists each one" in err[0]
    registry = json.loads((tmp_path / "docs" / "results" / "figures.json").read_text())
    assert "measure.measure-x.dcgan.bf16_over_fp32" in registry  # the measurement's own figures were recorded
    assert (tmp_path / "docs" / "page.md").read_text() == page


def test_without_gluoncv_resnet50_v2_comes_from_mxnets_zoo_layer_for_layer(monkeypatch):
    """A checkout beside MXNet's wheel alone has no gluoncv: the headline model is still built, the same network."""
    from mxfp16.models import zoo

    def shapes(net):
        return [(name.split("_", 1)[1], p.shape) for name, p in net.collect_params().items()]  # no instance prefix

    theirs = shapes(zoo.build_model("resnet50_v2", 10, in_shape=(3, 32, 32)))

    def absent():
        raise ImportError("No module named 'gluoncv'")

    monkeypatch.setattr(zoo, "import_gluoncv", absent)
    net = zoo.build_model("resnet50_v2", 10, in_shape=(3, 32, 32))
    assert type(net).__module__.startswith("mxnet.gluon.model_zoo") and shapes(net) == theirs
    with pytest.raises(zoo.ModelError, match="gluoncv's model zoo, which is not installed here"):
        zoo.build_model("mobilenetv2_1.0", 10, in_shape=(3, 32, 32))
