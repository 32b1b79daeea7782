"""What the trainer does under faults and hostile input: nothing lost, nothing run that should not run.

Each test reproduces a fault from the reliability issue: --overwrite with a
bad flag, a crafted optimizer-state pickle, damaged or half-written
checkpoints, flags given with --resume, SIGTERM, and values that used to end
in tracebacks.
"""
import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO
from train_support import QUICK, metrics, ok, position, refused, run_train, run_train_here, summary, tiny_dataset

pytestmark = pytest.mark.slow
SHORT = ["--precision", "float32", "--max-batches", "2", *QUICK]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("faults"))


@pytest.fixture(scope="module")
def finished(data, tmp_path_factory):
    """A finished 3-epoch run (kept read-only by the tests: each copies it)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    ok(run_train("--data-dir", data, "--out", out, "--epochs", 3, *SHORT))
    return out


@pytest.fixture
def run_copy(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- 1. validate everything, then delete -------------------------------------------------------
@pytest.mark.parametrize("bad, phrase", [(["--data-dir", "/no/such/folder"], "/no/such/folder"),
                                         (["--model", "resnet9000"], "resnet9000"),
                                         (["--optimizer", "adamm"], "adamm")])
def test_overwrite_with_a_bad_flag_leaves_the_old_run_intact(run_copy, data, bad, phrase):
    before = _snapshot(run_copy)
    args = ["--data-dir", data, "--out", run_copy, "--overwrite", "--epochs", 1, *SHORT]
    i = args.index(bad[0]) if bad[0] in args else None
    if i is not None:
        args[i + 1] = bad[1]
    else:
        args += bad
    refused(run_train_here(*args), phrase)
    assert _snapshot(run_copy) == before


def test_overwrite_removes_only_what_the_run_wrote(run_copy, data):
    (run_copy / "checkpoints" / "my-notes.txt").write_text("keep me")
    (run_copy / "analysis.ipynb").write_text("{}")
    ok(run_train("--data-dir", data, "--out", run_copy, "--overwrite", "--epochs", 1, *SHORT))
    assert (run_copy / "checkpoints" / "my-notes.txt").read_text() == "keep me"
    assert (run_copy / "analysis.ipynb").exists()
    assert [r["epoch"] for r in metrics(run_copy)] == [1]


# ---- 2. a checkpoint format that loads no code ----------------------------------------------------
class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # unpickling this creates the marker file


def test_a_crafted_pickle_runs_nothing(run_copy, data, tmp_path):
    marker = tmp_path / "owned"
    folder = run_copy / "checkpoints"
    record = json.loads((folder / "latest.json").read_text())
    payload = pickle.dumps(_Exploit(str(marker)))
    # Both places a pickle could hide: the optimizer file of the current format, with its sha256 updated ...
    (folder / f"{record['tag']}.optimizer").write_bytes(payload)
    record["files"][f"{record['tag']}.optimizer"] = hashlib.sha256(payload).hexdigest()
    for name in ("latest.json", f"{record['tag']}.json"):
        (folder / name).write_text(json.dumps(record))
    proc = ok(run_train("--data-dir", data, "--out", run_copy, "--resume", "--epochs", 4, *SHORT))
    assert not marker.exists(), "the pickle was loaded"
    # ... is refused as arrays, and the run falls back to the previous intact checkpoint.
    assert ("epoch-0003: cannot be restored" in proc.stdout
            and "resuming from the newest intact one, epoch-0002" in proc.stdout)
    assert [r["epoch"] for r in metrics(run_copy)] == [1, 2, 3, 4]


def test_a_checkpoint_of_the_old_pickle_format_is_refused_unread(run_copy, data, tmp_path):
    marker = tmp_path / "owned"
    folder = run_copy / "checkpoints"
    for path in folder.iterdir():
        path.unlink()
    (folder / "epoch-0003.states").write_bytes(pickle.dumps(_Exploit(str(marker))))
    (folder / "epoch-0003.params").write_bytes(b"")
    (folder / "latest.json").write_text(json.dumps({"version": 2, "tag": "epoch-0003",
                                                    "params_file": "epoch-0003.params",
                                                    "states_file": "epoch-0003.states"}))
    refused(run_train_here("--data-dir", data, "--out", run_copy, "--resume", "--epochs", 4, *SHORT),
            "pickle", "does not load it")
    assert not marker.exists()


# ---- 3. checkpoints that survive damage ---------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncate", "empty", "flip"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(run_copy, data, damage):
    folder = run_copy / "checkpoints"
    tags = sorted(p.stem for p in folder.glob("epoch-*.json"))
    assert tags == ["epoch-0002", "epoch-0003"]  # the last two are kept
    params = folder / "epoch-0003.params"
    raw = params.read_bytes()
    params.write_bytes({"truncate": raw[:len(raw) // 2], "empty": b"",
                        "flip": raw[:-9] + bytes([raw[-9] ^ 0x40]) + raw[-8:]}[damage])
    proc = ok(run_train("--data-dir", data, "--out", run_copy, "--resume", "--epochs", 3, *SHORT))
    assert "epoch-0003.params does not match its sha256" in proc.stdout and "epoch-0002" in proc.stdout
    assert [r["epoch"] for r in metrics(run_copy)] == [1, 2, 3]  # epoch 3 trained again from epoch 2's checkpoint
    assert position(json.loads((folder / "latest.json").read_text()))["epoch"] == 3


@pytest.mark.parametrize("damage", ["cut", "emptied", "not-a-record"])
def test_a_damaged_latest_json_does_not_block_resume(run_copy, data, damage):
    """Issue 42, case 14: latest.json is a copy of the newest record; the records themselves are the checkpoints."""
    folder = run_copy / "checkpoints"
    latest = folder / "latest.json"
    raw = latest.read_bytes()
    latest.write_bytes({"cut": raw[:len(raw) // 2], "emptied": b"", "not-a-record": b"{}"}[damage])
    if damage == "emptied":  # and the newest checkpoint damaged too: the one before it serves
        (folder / "epoch-0003.params").write_bytes(b"garbage")
    newest = "epoch-0002" if damage == "emptied" else "epoch-0003"
    proc = ok(run_train("--data-dir", data, "--out", run_copy, "--resume", "--epochs", 4, *SHORT))
    assert "latest.json" in proc.stdout and f"resuming from the newest intact one, {newest}" in proc.stdout
    assert [r["epoch"] for r in metrics(run_copy)] == [1, 2, 3, 4]
    assert position(json.loads(latest.read_text()))["epoch"] == 4  # written anew by the next checkpoint


def test_a_damaged_latest_json_leaves_the_checkpoints_readable(run_copy):
    from mxfp16.train.checkpoint import CheckpointError, params_file

    latest = run_copy / "checkpoints" / "latest.json"
    latest.write_text('{"version": 4, "tag": ')
    with pytest.warns(UserWarning, match="latest.json is not valid JSON.*newest checkpoint record, epoch-0003"):
        path, record = params_file(run_copy)
    assert path.name == "epoch-0003.params" and record["tag"] == "epoch-0003"
    for record in (run_copy / "checkpoints").glob("epoch-*.json"):
        record.unlink()
    with pytest.raises(CheckpointError, match="no other checkpoint record"):
        params_file(run_copy)


def test_no_intact_checkpoint_is_a_clear_error(run_copy, data):
    for path in (run_copy / "checkpoints").glob("*.params"):
        path.write_bytes(b"garbage")
    refused(run_train_here("--data-dir", data, "--out", run_copy, "--resume", "--epochs", 3, *SHORT),
            "no intact checkpoint", "sha256")


def test_a_first_checkpoint_killed_before_its_record_is_recoverable(data, tmp_path):
    out = tmp_path / "run"
    folder = out / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "epoch-0001.params").write_bytes(b"half")  # what a kill during the first checkpoint leaves
    (folder / ".epoch-0001.optimizer.x1y2.tmp").write_bytes(b"tmp")
    (out / ".metrics.jsonl.abcd.tmp").write_bytes(b"tmp")
    refused(run_train_here("--data-dir", data, "--out", out, "--resume", "--epochs", 1, *SHORT),
            "no run", "without --resume")
    proc = ok(run_train("--data-dir", data, "--out", out, "--epochs", 1, *SHORT))  # a plain run starts
    assert "removed" in proc.stdout
    assert not list(out.rglob("*.tmp")) and [r["epoch"] for r in metrics(out)] == [1]


# ---- 4. resume semantics a user can predict --------------------------------------------------------
def test_more_epochs_on_resume_extend_the_schedule(run_copy, data):
    proc = ok(run_train("--data-dir", data, "--out", run_copy, "--resume", "--epochs", 5, "--no-progress"))
    records = metrics(run_copy)
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5]
    assert records[3]["lr"] > 0  # the 3-epoch cosine ended at 0; the 5-epoch one has not
    assert "epochs 3 -> 5" in proc.stdout and "learning-rate schedule" in proc.stdout
    config = json.loads((run_copy / "config.json").read_text())
    assert config["epochs"] == 5 and config["resumed"][-1]["changed"] == {"epochs": [3, 5]}
    assert config["model"] == "cifar_resnet20_v1"  # everything not given comes from the run itself


def test_a_new_learning_rate_on_resume_takes_effect(run_copy, data):
    ok(run_train("--data-dir", data, "--out", run_copy, "--resume", "--epochs", 6, "--lr", 0.5, "--lr-schedule",
                 "step", "--step-epochs", "5", "--no-progress"))
    lrs = [r["lr"] for r in metrics(run_copy)]
    assert lrs[3] == pytest.approx(0.5) and lrs[5] == pytest.approx(0.05)  # the new peak, divided after epoch 5
    assert json.loads((run_copy / "config.json").read_text())["lr"] == 0.5


def test_what_cannot_change_on_resume_is_refused_by_name(run_copy, data):
    before = _snapshot(run_copy)
    message = refused(run_train_here("--data-dir", data, "--out", run_copy, "--resume", "--optimizer", "adam",
                                "--batch-size", 4, "--epochs", 4, *QUICK[:4]),
                      "cannot change", "optimizer 'sgd' -> 'adam'", "batch_size 8 -> 4")
    assert "epochs" not in message.split("cannot change:")[1].split(".")[0]  # epochs may change
    assert _snapshot(run_copy) == before


def test_fewer_epochs_than_finished_is_refused(run_copy, data):
    refused(run_train_here("--data-dir", data, "--out", run_copy, "--resume", "--epochs", 2, "--warmup-epochs", 1,
                      "--no-progress"),
            "already finished 3 epochs", "--epochs 3")


# ---- 5. SIGTERM behaves like Ctrl-C ----------------------------------------------------------------
def test_sigterm_writes_a_checkpoint_and_exits_143(data, tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "mxfp16.train", "--data-dir", str(data), "--out", str(out),
                             "--epochs", "50", "--precision", "float32", *QUICK], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    for line in proc.stdout:  # the log's first lines come once the signal handler is installed
        if line.startswith("epoch 1/50") or time.time() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "SIGTERM: stopping after this step" in stdout and "--resume" in stderr
    record = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert position(record)["global_step"] >= 1
    ok(run_train("--data-dir", data, "--out", out, "--resume", "--epochs", position(record)["epoch"] + 1,
                 "--warmup-epochs", 0, "--max-batches", 2, "--no-progress"))
    assert summary(out)["epochs"] == position(record)["epoch"] + 1


# ---- 6. values that used to end in tracebacks ------------------------------------------------------
@pytest.mark.parametrize("flag, value, phrase", [("--lr", "inf", "lr=inf"), ("--lr", "1e300", "lr=1e+300"),
                                                 ("--seed", "-5", "seed=-5"), ("--seed", str(2 ** 32), "2**32-1"),
                                                 ("--threads", "0", "whole number >= 1")])
def test_bad_numbers_are_refused_without_a_traceback(data, tmp_path, flag, value, phrase):
    refused(run_train_here("--data-dir", data, "--out", tmp_path / "x", flag, value, *SHORT), phrase)
    assert not (tmp_path / "x").exists()


def test_an_out_that_is_a_file_is_refused(data, tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("a file")
    refused(run_train_here("--data-dir", data, "--out", taken, *SHORT), "is a file")
    refused(run_train_here("--data-dir", data, "--out", taken / "run", *SHORT), "is a file")
    assert taken.read_text() == "a file"
