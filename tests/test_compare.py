"""`mxfp16 compare` on two run directories written in the trainer's documented format."""
import json
import os

import pytest

from mxfp16.train.compare import RunDirError, comparison_table, load_runs
from mxfp16.cli import main
from mxfp16.fileio import append_jsonl, write_json

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
            "final_loss_scale": 1.0, "params_digest": "abc"})


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
