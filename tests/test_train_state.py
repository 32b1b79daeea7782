"""Run state that used to go wrong quietly: clean-up at start-up, resume's pairs and its data, a lost config.json,
a first checkpoint that cannot be written, and --threads beyond the cores.

Each run here is a tiny float32 run in its own process (train_support).
"""
import json
import os
import shutil
import subprocess
import sys

from mxfp16.machine.environment import available_cores
from mxfp16.plumbing.fileio import sha256_file

import pytest
from train_support import QUICK, REPO, metrics, ok, refused, run_train, run_train_here, tiny_dataset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("state"))


@pytest.fixture(scope="module")
def two_epochs(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    ok(run_train("--data-dir", data, "--precision", "float32", "--out", out, "--epochs", 2, "--max-batches", 2,
                 *QUICK))
    return out


def _copy(run, tmp_path, name="run"):
    copy = tmp_path / name
    shutil.copytree(run, copy)
    return copy


def test_an_intact_checkpoint_whose_own_record_is_missing_is_kept_and_resumed(data, two_epochs, tmp_path):
    run = _copy(two_epochs, tmp_path)
    folder = run / "checkpoints"
    latest = json.loads((folder / "latest.json").read_text())
    assert latest["tag"] == "epoch-0002"
    (folder / "epoch-0002.json").unlink()  # the per-epoch record lost; latest.json still describes epoch 2
    digests = {name: sha256_file(folder / name) for name in latest["files"]}
    proc = ok(run_train("--data-dir", data, "--out", run, "--resume", "--epochs", 3, "--max-batches", 2, *QUICK))
    assert "removed" not in proc.stdout  # nothing taken for a leftover
    assert "resuming" in proc.stdout and "at epoch 3" in proc.stdout  # not rolled back to epoch 2
    assert [m["epoch"] for m in metrics(run)] == [1, 2, 3]
    # Its files were not deleted before the resume read them, and its record is back for the pruning.
    assert json.loads((folder / "epoch-0003.json").read_text())["tag"] == "epoch-0003"
    assert (folder / "epoch-0002.json").exists() and all(
        sha256_file(folder / name) == digest for name, digest in digests.items())


def test_files_no_record_describes_are_still_leftovers(data, two_epochs, tmp_path):
    run = _copy(two_epochs, tmp_path)
    folder = run / "checkpoints"
    (folder / "epoch-0009.params").write_bytes(b"half-written")
    proc = ok(run_train("--data-dir", data, "--out", run, "--resume", "--epochs", 3, "--max-batches", 2, *QUICK))
    assert "removed" in proc.stdout and "epoch-0009.params" in proc.stdout
    assert not (folder / "epoch-0009.params").exists()


def test_resume_with_overwrite_is_refused_and_changes_nothing(data, two_epochs, tmp_path):
    run = _copy(two_epochs, tmp_path)
    before = {p.name: sha256_file(p) for p in run.rglob("*") if p.is_file()}
    proc = run_train_here("--data-dir", data, "--out", run, "--resume", "--overwrite", "--epochs", 3, *QUICK)
    refused(proc, "resume and overwrite exclude each other")
    assert {p.name: sha256_file(p) for p in run.rglob("*") if p.is_file()} == before


def test_resume_on_changed_data_is_refused_naming_the_change_and_the_flag(data, two_epochs, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    run = _copy(two_epochs, tmp_path)
    config = json.loads((run / "config.json").read_text())
    config["data_dir"] = config["source"] = str(copy)
    (run / "config.json").write_text(json.dumps(config))
    assert config["data_fingerprint"]["files"] == sum(len(os.listdir(copy / s / c)) for s in ("train", "test")
                                                      for c in os.listdir(copy / s))
    victim = sorted((copy / "train" / "circle").iterdir())[0]
    victim.unlink()  # the same path, one image fewer
    proc = run_train_here("--data-dir", copy, "--out", run, "--resume", "--epochs", 3, "--max-batches", 2, *QUICK)
    refused(proc, "changed since the run started", "class circle: 24 train / 8 test then, 23 train / 8 test now",
            "--accept-changed-data")
    proc = ok(run_train("--data-dir", copy, "--out", run, "--resume", "--epochs", 3, "--max-batches", 2,
                        "--accept-changed-data", *QUICK))
    assert "continuing (--accept-changed-data)" in proc.stdout
    # The new fingerprint is recorded: a further resume on this data is quiet.
    proc = ok(run_train("--data-dir", copy, "--out", run, "--resume", "--epochs", 4, "--max-batches", 2, *QUICK))
    assert "changed since" not in proc.stdout


def test_a_run_without_its_config_json_resumes_with_its_flags_and_keeps_its_checkpoints(data, two_epochs, tmp_path):
    run = _copy(two_epochs, tmp_path)
    (run / "config.json").unlink()
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    # Starting anew is refused, with the way out that keeps the checkpoints.
    proc = run_train_here("--data-dir", data, "--out", run, "--epochs", 3, *QUICK)
    refused(proc, "its config.json is missing", "--resume with the flags the run was started with")
    # The flags of another run are refused by the checkpoint's fingerprint, and nothing is lost.
    proc = run_train_here("--data-dir", data, "--out", run, "--resume", "--epochs", 3, "--max-batches", 2,
                          "--model", "cifar_resnet20_v1", "--image-size", "24", "--batch-size", "8", "--no-progress")
    refused(proc, "image_size: checkpoint 16, this run 24")
    # ... before anything was built: auto (the default precision) timed no network for a run it refuses.
    assert "auto: timing" not in proc.stdout + proc.stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == checkpoints
    # Its own flags continue it, and config.json is back.
    proc = ok(run_train("--data-dir", data, "--out", run, "--resume", "--epochs", 3, "--max-batches", 2,
                        "--precision", "float32", *QUICK))
    assert "config.json is missing; continuing with the settings of this command line" in proc.stdout
    assert [m["epoch"] for m in metrics(run)] == [1, 2, 3]
    assert json.loads((run / "config.json").read_text())["model"] == "cifar_resnet20_v1"


#: ``python -m mxfp16.train`` with every array write failing as MXNet reports a full disk.
FULL_DISK = """
import runpy, sys
import mxfp16
import mxnet as mx
def full(*args, **kwargs):
    raise mx.base.MXNetError("FileStream.Write incomplete")
mx.nd.save = full
sys.argv[0] = "mxfp16.train"
runpy.run_module("mxfp16.train", run_name="__main__")
"""


def test_a_first_checkpoint_that_cannot_be_written_does_not_claim_a_previous_one(data, tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, "--data-dir", str(data), "--out", str(tmp_path / "run"),
                           "--epochs", "1", "--max-batches", "1", "--precision", "float32", *QUICK],
                          capture_output=True, text=True, env=env, timeout=240, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert "No checkpoint had been written yet, so there is none to resume from" in proc.stderr
    assert "previous checkpoint is kept" not in proc.stderr


def test_a_file_size_limit_is_named_instead_of_the_free_space(data, tmp_path):
    import resource

    code = ("import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))\n"
            "import runpy, sys; sys.argv[0] = 'mxfp16.train'; runpy.run_module('mxfp16.train', run_name='__main__')")
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", code, "--data-dir", str(data), "--out", str(tmp_path / "run"),
                           "--epochs", "1", "--max-batches", "1", "--precision", "float32", *QUICK],
                          capture_output=True, text=True, env=env, timeout=240, cwd=REPO)
    assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == resource.RLIM_INFINITY  # the limit was the child's
    assert proc.returncode == 2, proc.stderr
    assert "may not write files larger than 0.2 MB (ulimit -f)" in proc.stderr and "MB free" not in proc.stderr


def test_more_threads_than_cores_runs_on_every_core(data, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mxfp16", "train", "--threads", str(available_cores() + 1),
                           "--data-dir", str(data), "--out", str(tmp_path / "run"), "--epochs", "1",
                           "--max-batches", "1", "--precision", "float32", *QUICK],
                          capture_output=True, text=True, timeout=240, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr
    assert f"using {available_cores()}" in proc.stderr  # the warning says what happens ...
    assert "pass --threads on the command line" not in proc.stderr  # ... and nothing contradicts it
    assert (json.loads((tmp_path / "run" / "config.json").read_text())["resolved_threads"]["threads"]
            == available_cores())


@pytest.mark.parametrize("text,words", [("[" * 100000 + "]" * 100000, "nested too deeply"),
                                        ('{"model": ', "is not valid JSON"),
                                        ("[]", "holds a list where an object belongs")])
def test_a_damaged_config_json_refuses_resume_with_a_message(data, two_epochs, tmp_path, text, words):
    run = _copy(two_epochs, tmp_path)
    (run / "config.json").write_text(text)
    proc = run_train_here("--data-dir", data, "--out", run, "--resume", "--epochs", 3, *QUICK)
    refused(proc, "config.json", words)
