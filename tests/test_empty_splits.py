"""An empty test split is refused where it is made and where it is used; a metric that is not a number is null.

Issue 37's cases: ``data split --test-fraction 0.5`` of classes of one image
each exited 0 with "2000 train and 0 test images"; training on the result
ran epoch 1 and then failed writing its checkpoint record with ``ValueError: Out of
range float values are not JSON compliant: nan``, leaving ``.params`` and
``.optimizer`` without a record.
"""
import json

from mxfp16.cli import main
from mxfp16.data import synth_dataset
from mxfp16.train.epochs import epoch_line, missing_marked

import fault_injection
import pytest
from train_support import QUICK, ok, run_train, tiny_dataset


@pytest.fixture(scope="module")
def one_per_class(tmp_path_factory):
    """Class folders of one image each (the shapes set's training split of one image per class)."""
    root = synth_dataset(tmp_path_factory.mktemp("one") / "set", classes=4, per_class=1, test_per_class=0, size=24)
    return root / "train"


def test_a_split_with_an_empty_test_side_is_refused_naming_the_fraction_and_the_counts(one_per_class, tmp_path,
                                                                                      capsys):
    out = tmp_path / "split"
    assert main(["data", "split", "--src", str(one_per_class), "--out", str(out), "--test-fraction", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "--test-fraction 0.5 leaves the test split empty" in err and "4 classes of 1 usable image" in err
    assert "--allow-empty-test" in err and "Traceback" not in err and not out.exists()


def test_allow_empty_test_writes_it_and_train_then_refuses_it_before_writing_anything(one_per_class, tmp_path,
                                                                                     capsys):
    out = tmp_path / "split"
    assert main(["data", "split", "--src", str(one_per_class), "--out", str(out), "--test-fraction", "0.5",
                 "--allow-empty-test"]) == 0
    assert "4 train and 0 test images" in capsys.readouterr().out
    run = tmp_path / "run"
    assert main(["train", "--data-dir", str(out), "--out", str(run), "--precision", "float32", *QUICK]) == 2
    err = capsys.readouterr().err
    assert f"the test split of {out} holds no images" in err and "Traceback" not in err
    assert not run.exists()  # not even the folder the lock was taken in


def test_a_metric_that_is_not_a_number_is_written_as_null_and_the_checkpoint_kept(tmp_path):
    data = tiny_dataset(tmp_path)
    out = tmp_path / "run"
    # Every step overflows under a fixed loss scale: every step is skipped, so the epoch has no training loss.
    env = fault_injection.environment(overflow_step=fault_injection.EVERY)
    proc = ok(run_train("--data-dir", data, "--out", out, "--precision", "float32", "--loss-scale", "64",
                        "--epochs", "1", "--max-batches", "2", *QUICK, env=env))
    record = json.loads((out / "metrics.jsonl").read_text())
    assert record["train_loss"] is None and record["train_top1"] is None and record["skipped_steps"] == 2
    assert record["val_top1"] is not None  # evaluated as usual
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert latest["progress"]["metrics"] == [record] and latest["tag"] == "epoch-0001"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "epoch-0001.json", "epoch-0001.optimizer", "epoch-0001.params", "latest.json"]
    assert "train_loss n/a train_top1 n/a" in proc.stdout


def test_missing_marked_keeps_finite_numbers_and_the_line_prints_the_rest_as_n_a():
    record = {"epoch": 3, "train_loss": float("nan"), "train_top1": float("inf"), "val_top1": 0.5, "val_top5": 1.0,
              "images_per_second": 12.0, "loss_scale": 64.0, "skipped_steps": 4, "lr": 0.1, "seconds": 2.0}
    marked = missing_marked(record)
    assert marked == dict(record, train_loss=None, train_top1=None)
    json.dumps(marked, allow_nan=False)  # what write_json does
    assert epoch_line(marked, 5).startswith("epoch 3/5: train_loss n/a train_top1 n/a val_top1 0.500")


def test_compare_reads_an_epoch_without_a_training_loss():
    from mxfp16.train.compare import check_number

    assert check_number(None, "train_loss", "x") is None
    with pytest.raises(ValueError, match="not a finite number"):
        check_number(None, "val_top1", "x")
