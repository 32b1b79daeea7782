"""`mxfp16 compare` on two run directories written in the trainer's documented format."""
import json
import os

from mxfp16.cli import main
from mxfp16.plumbing.fileio import append_jsonl, write_json
from mxfp16.train.compare import RunDirError, comparison_table, load_runs

import numpy as np
import pytest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(path, precision, top1s, losses, seconds, ips, summary=True):
    os.makedirs(path, exist_ok=True)
    write_json(os.path.join(path, "config.json"), {"precision": precision, "model": "cifar_resnet20_v1",
                                                  "batch_size": 32, "epochs": len(top1s)})
    for epoch, (top1, loss, sec) in enumerate(zip(top1s, losses, seconds), start=1):
        append_jsonl(os.path.join(path, "metrics.jsonl"), {
            "epoch": epoch, "train_loss": loss, "train_top1": top1 - 0.02, "val_top1": top1,
            "val_top5": min(1.0, top1 + 0.2), "images_per_second": ips, "loss_scale": 1.0,
            "skipped_steps": 0, "lr": 0.1, "seconds": sec})
    if summary:
        write_json(os.path.join(path, "summary.json"), {
            "precision": precision, "model": "cifar_resnet20_v1", "epochs": len(top1s),
            "final_val_top1": top1s[-1], "best_val_top1": max(top1s), "images_per_second": ips,
            "peak_memory_mb": 900.0 if precision == "float32" else 700.0, "skipped_steps": 0,
            "final_loss_scale": 1.0, "params_digest": f"digest of {os.path.basename(path)}"})


@pytest.fixture
def two_runs(tmp_path):
    f32 = tmp_path / "runs" / "f32"
    bf16 = tmp_path / "runs" / "bf16"
    _write_run(f32, "float32", [0.41, 0.62, 0.70], [2.1, 1.4, 1.1], [30.0, 29.0, 31.0], 100.0)
    _write_run(bf16, "amp-bfloat16", [0.40, 0.60, 0.695], [2.1, 1.45, 1.12], [20.0, 21.0, 19.5], 150.0)
    return str(f32), str(bf16)


def test_table_speedup_and_accuracy_difference_against_float32(two_runs):
    rows = comparison_table(load_runs(list(two_runs)))
    assert [r["precision"] for r in rows] == ["float32", "amp-bfloat16"]
    assert rows[1]["speedup"] == pytest.approx(150.0 / 100.0)
    assert rows[1]["val_top1_delta"] == pytest.approx(0.695 - 0.70)
    assert rows[0]["train_seconds"] == pytest.approx(90.0)
    assert rows[1]["train_seconds"] == pytest.approx(60.5)


def test_command_writes_table_json_markdown_and_plot(two_runs, capsys):
    assert main(["compare", *two_runs]) == 0
    out_dir = os.path.join(os.path.dirname(two_runs[0]), "compare")
    printed = capsys.readouterr().out
    assert "1.50x" in printed and "amp-bfloat16" in printed
    with open(os.path.join(out_dir, "compare.png"), "rb") as handle:
        assert handle.read(8) == PNG_MAGIC
    doc = json.load(open(os.path.join(out_dir, "compare.json")))
    assert [r["run"] for r in doc["runs"]] == ["f32", "bf16"]
    assert len(doc["metrics"]["bf16"]) == 3
    markdown = open(os.path.join(out_dir, "compare.md")).read()
    assert markdown.count("\n") == 4 and "| bf16 | amp-bfloat16 | 3 | 0.6950 |" in markdown


def test_incomplete_or_missing_run_is_a_clear_error(tmp_path, two_runs, capsys):
    unfinished = tmp_path / "unfinished"
    _write_run(unfinished, "float32", [0.3], [2.0], [10.0], 90.0, summary=False)
    assert main(["compare", two_runs[0], str(unfinished), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "summary.json is missing" in err and "--resume" in err
    assert main(["compare", str(tmp_path / "nowhere")]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_epoch_record_without_a_documented_field_is_refused(tmp_path):
    run = tmp_path / "r"
    _write_run(run, "float32", [0.3, 0.4], [2.0, 1.8], [10.0, 10.0], 90.0)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    record = json.loads(lines[1])
    del record["seconds"]
    (run / "metrics.jsonl").write_text(lines[0] + "\n" + json.dumps(record) + "\n")
    with pytest.raises(RunDirError, match="epoch record 2 lacks seconds"):
        load_runs([str(run)])


def _seeds(root, precision, finals, speed):
    paths = []
    for seed, final in zip((1, 2, 3), finals):
        path = root / f"{precision}-s{seed}"
        _write_run(path, precision, [final - 0.1, final], [1.0, 0.5], [10.0, 10.0], speed)
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps(dict(config, seed=seed)))
        paths.append(str(path))
    return paths


def test_parity_statistics_match_a_hand_computed_case(tmp_path):
    """The issue's numbers: float32 0.928/0.935/0.930 against amp-bfloat16 0.907/0.920/0.917, seeds 1-3."""
    from mxfp16.train.parity import parity

    a = _seeds(tmp_path, "float32", [0.928, 0.935, 0.930], 100.0)
    b = _seeds(tmp_path, "amp-bfloat16", [0.907, 0.920, 0.917], 190.0)
    report, _, _ = parity(a, b)
    assert report["a"]["mean"] == pytest.approx(93.1) and report["b"]["mean"] == pytest.approx(91.4667, abs=1e-4)
    assert report["gap"] == pytest.approx(-1.6333, abs=1e-4)
    assert report["a"]["sd"] == pytest.approx(0.3606, abs=1e-4) and report["b"]["sd"] == pytest.approx(0.6807, abs=1e-4)
    welch = report["welch"]  # by hand: se 0.4447, df 3.040, t(0.975, 3.04) = 3.166
    assert welch["se"] == pytest.approx(0.4447, abs=1e-4) and welch["df"] == pytest.approx(3.040, abs=2e-3)
    assert (welch["low"], welch["high"]) == (pytest.approx(-3.041, abs=5e-3), pytest.approx(-0.226, abs=5e-3))
    paired = report["paired"]  # differences -2.1, -1.5, -1.3: sd 0.4163, se 0.2404, t(0.975, 2) = 4.303
    assert paired["differences"] == pytest.approx([-2.1, -1.5, -1.3], abs=1e-9)
    assert (paired["low"], paired["high"]) == (pytest.approx(-2.668, abs=2e-3), pytest.approx(-0.599, abs=2e-3))
    assert report["exceeds_noise"] is True and report["speedup"] == pytest.approx(1.9)


def test_parity_within_the_noise_and_the_command(tmp_path, capsys):
    a = _seeds(tmp_path, "float32", [0.930, 0.935, 0.925], 100.0)
    b = _seeds(tmp_path, "amp-bfloat16", [0.932, 0.928, 0.931], 190.0)
    assert main(["compare", "--a", str(tmp_path / "float32-s*"), "--b", *b, "--out", str(tmp_path / "p")]) == 0
    printed = capsys.readouterr().out
    assert "within the noise" in printed and "paired by seed" in printed and "1.90x" in printed
    doc = json.loads((tmp_path / "p" / "parity.json").read_text())
    assert doc["exceeds_noise"] is False and doc["a"]["seeds"] == [1, 2, 3]
    assert (tmp_path / "p" / "parity.png").read_bytes()[:8] == PNG_MAGIC
    assert main(["compare", "--a", *a]) == 2 and "--a and --b go together" in capsys.readouterr().err
    assert main(["compare", "--a", str(tmp_path / "nothing-*"), "--b", *b]) == 2
    assert "matches no run folder" in capsys.readouterr().err


def test_one_run_per_side_reports_no_interval(tmp_path):
    from mxfp16.train.parity import format_parity, parity

    a = _seeds(tmp_path, "float32", [0.93], 100.0)
    b = _seeds(tmp_path, "amp-bfloat16", [0.92], 150.0)
    report, _, _ = parity(a, b)
    assert report["welch"] is None and report["paired"] is None and report["exceeds_noise"] is None
    assert "no spread" in format_parity(report)


def test_seeds_needed_solves_the_t_interval_for_n():
    """Checked against scipy's t quantiles directly: n is the first count whose half-width is within reach."""
    from mxfp16.train.parity import seeds_needed

    from scipy import stats

    def paired_half(n, sd):
        return stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n)

    n = seeds_needed(0.87, 0.3)
    assert paired_half(n, 0.87) <= 0.3 < paired_half(n - 1, 0.87)
    # Unpaired: both sides' variances, Welch's df for equal spreads (2n - 2).
    m = seeds_needed(0.87, 0.3, paired=False)
    half = stats.t.ppf(0.975, 2 * m - 2) * 0.87 * np.sqrt(2.0 / m)
    before = stats.t.ppf(0.975, 2 * m - 4) * 0.87 * np.sqrt(2.0 / (m - 1))
    assert half <= 0.3 < before and m > n
    assert seeds_needed(0.0, 0.3) == 2
    assert seeds_needed(5.0, 0.01, limit=50) is None
    with pytest.raises(ValueError, match="resolve must be positive"):
        seeds_needed(1.0, 0.0)


def test_compare_says_how_many_seeds_would_resolve_the_gap(tmp_path, capsys):
    from mxfp16.train.parity import seeds_needed

    a = _seeds(tmp_path, "float32", [0.958, 0.951, 0.951], 100.0)
    b = _seeds(tmp_path, "amp-bfloat16", [0.956, 0.954, 0.940], 120.0)
    assert main(["compare", "--a", *a, "--b", *b, "--out", str(tmp_path / "p"), "--resolve", "0.5"]) == 0
    printed = capsys.readouterr().out
    doc = json.loads((tmp_path / "p" / "parity.json").read_text())
    res = doc["resolution"]
    differences = np.array([-0.2, 0.3, -1.1])  # b - a per seed, in points
    assert res["basis"] == "paired" and res["sd"] == pytest.approx(differences.std(ddof=1))
    assert res["seeds_per_side"] == seeds_needed(differences.std(ddof=1), 0.5) and res["seeds_per_side"] > 3
    assert res["half_width"] == pytest.approx((doc["paired"]["high"] - doc["paired"]["low"]) / 2)
    assert f"to resolve +-0.50 points (95%) at this spread: about {res['seeds_per_side']} seeds per side" in printed
    assert main(["compare", "--a", *a, "--b", *b, "--resolve", "0"]) == 2  # argparse refuses it, naming the range
    assert "argument --resolve: 0: must be between 1e-06 and 100" in capsys.readouterr().err


# ---- statistics that defend themselves (issue: no wrong verdict) ------------------------------------------------
def test_the_same_folder_three_times_is_refused_not_counted_as_three_seeds(tmp_path, capsys):
    a = _seeds(tmp_path, "float32", [0.93, 0.935, 0.925], 100.0)
    b = _seeds(tmp_path, "amp-bfloat16", [0.90, 0.91, 0.905], 150.0)
    assert main(["compare", "--a", a[0], a[0], a[0], "--b", *b, "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "given twice" in err and "pass each run folder once" in err
    # Also through another spelling of the same folder, and across the sides.
    assert main(["compare", "--a", a[0], a[1], a[2], "--b", b[0], b[1], a[0] + "/.", "--out", str(tmp_path / "p")]) == 2
    assert "given twice" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_copies_of_one_run_are_refused(tmp_path, capsys):
    import shutil

    a = _seeds(tmp_path, "float32", [0.93, 0.935, 0.925], 100.0)
    b = _seeds(tmp_path, "amp-bfloat16", [0.90, 0.91, 0.905], 150.0)
    shutil.copytree(a[0], tmp_path / "copy-of-s1")
    assert main(["compare", "--a", a[0], str(tmp_path / "copy-of-s1"), "--b", *b[:2]]) == 2
    err = capsys.readouterr().err
    assert "ran the same seed (1) with the same settings" in err


def test_runs_that_differ_in_more_than_the_seed_are_refused_naming_the_difference(tmp_path, capsys):
    a = _seeds(tmp_path, "float32", [0.93, 0.935, 0.925], 100.0)
    b = _seeds(tmp_path, "amp-bfloat16", [0.90, 0.91, 0.905], 150.0)
    config = json.loads((tmp_path / "float32-s2" / "config.json").read_text())
    (tmp_path / "float32-s2" / "config.json").write_text(json.dumps(dict(config, lr=0.5)))
    assert main(["compare", "--a", *a, "--b", *b, "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "--a lr: " in err and "float32-s2" in err and "--allow-differences" in err
    # Said so, they are pooled, and the report lists what differs.
    assert main(["compare", "--a", *a, "--b", *b, "--out", str(tmp_path / "p"), "--allow-differences"]) == 0
    assert "warning: pooled although their settings differ" in capsys.readouterr().out
    assert any("lr" in d for d in json.loads((tmp_path / "p" / "parity.json").read_text())["differences"])


def test_the_precision_may_differ_between_the_sides_but_nothing_else(tmp_path, capsys):
    a = _seeds(tmp_path, "float32", [0.93, 0.935], 100.0)
    b = _seeds(tmp_path, "amp-bfloat16", [0.90, 0.91], 150.0)
    from mxfp16.train.compare import load_runs as load
    from mxfp16.train.parity import check_groups

    assert check_groups(load(a), load(b)) == []  # precision differs between sides: fine
    for path in b:
        config = json.loads((tmp_path / os.path.basename(path) / "config.json").read_text())
        (tmp_path / os.path.basename(path) / "config.json").write_text(json.dumps(dict(config, batch_size=64)))
    with pytest.raises(RunDirError, match="between --a and --b: batch_size: 32"):
        check_groups(load(a), load(b))


def test_runs_of_different_lengths_are_not_pooled_as_seeds(tmp_path, capsys):
    a = _seeds(tmp_path, "float32", [0.93, 0.935, 0.925], 100.0)
    b = _seeds(tmp_path, "amp-bfloat16", [0.90, 0.91, 0.905], 150.0)
    short = tmp_path / "float32-s3"
    lines = (short / "metrics.jsonl").read_text().splitlines()
    (short / "metrics.jsonl").write_text(lines[0] + "\n")  # stopped after 1 of 2 epochs
    assert main(["compare", "--a", *a, "--b", *b]) == 2
    assert "--a epochs finished: 2 (float32-s1, float32-s2); 1 (float32-s3)" in capsys.readouterr().err


@pytest.mark.parametrize("field,value,message", [
    ("final_val_top1", float("nan"), "not valid JSON (NaN"),
    ("images_per_second", 1e308, "images_per_second 1e+308 is outside"),
    ("images_per_second", "1e400", "overflows a 64-bit float"),
    ("final_val_top1", 1.7, "final_val_top1 1.7 is outside 0..1"),
    ("final_val_top1", "fast", "not a finite number"),
    ("final_val_top1", True, "not a finite number"),
])
def test_impossible_numbers_in_summary_json_are_refused_naming_the_file(tmp_path, capsys, field, value, message):
    a = _seeds(tmp_path, "float32", [0.93, 0.935], 100.0)
    b = _seeds(tmp_path, "amp-bfloat16", [0.90, 0.91], 150.0)
    path = tmp_path / "amp-bfloat16-s2" / "summary.json"
    summary = json.loads(path.read_text())
    text = json.dumps(dict(summary, **{field: value}))
    if value == "1e400":  # a number JSON can hold but a float cannot
        text = text.replace('"1e400"', "1e400")
    path.write_text(text)
    for argv in (["compare", "--a", *a, "--b", *b], ["compare", a[0], b[1]]):
        assert main(argv + ["--out", str(tmp_path / "p")]) == 2
        err = capsys.readouterr().err
        assert str(path) in err and message in err, err
    assert not (tmp_path / "p").exists()


def test_a_nan_accuracy_in_metrics_jsonl_is_refused(tmp_path, capsys):
    a = _seeds(tmp_path, "float32", [0.93, 0.935], 100.0)
    b = _seeds(tmp_path, "amp-bfloat16", [0.90, 0.91], 150.0)
    path = tmp_path / "amp-bfloat16-s1" / "metrics.jsonl"
    path.write_text(path.read_text().replace('"val_top1": 0.8', '"val_top1": NaN', 1))
    assert main(["compare", "--a", *a, "--b", *b]) == 2
    err = capsys.readouterr().err
    assert f"{path} line 1 is not valid JSON" in err and "NaN" in err


def test_compare_out_that_is_a_file_or_a_run_is_refused(tmp_path, capsys):
    a = _seeds(tmp_path, "float32", [0.93, 0.935], 100.0)
    b = _seeds(tmp_path, "amp-bfloat16", [0.90, 0.91], 150.0)
    (tmp_path / "a-file").write_text("keep me")
    assert main(["compare", *a, "--out", str(tmp_path / "a-file")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert (tmp_path / "a-file").read_text() == "keep me"
    for out in (a[0], tmp_path, tmp_path / "float32-s1" / "compare"):
        assert main(["compare", "--a", *a, "--b", *b, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "the run folder" in err and any(w in err for w in (" is ", " contains ", " sits inside "))
    assert sorted(os.listdir(a[0])) == ["config.json", "metrics.jsonl", "summary.json"]
