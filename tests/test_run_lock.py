"""One writer per run folder and per pack prefix: a lock the kernel releases, refusals that name the holder.

Issue 37's cases: two ``train --out runs/c1`` half a second apart both exited 0
with one run's files over the other's; ``--overwrite`` while the first run
trained mixed both; ``export`` while the run pruned its checkpoints
(``--keep-checkpoints 1``) died with ``FileNotFoundError``; two ``data pack``
into one prefix wrote a damaged ``.rec`` and reported success.

A test that needs "another process training" holds the folder's lock
itself (``flock`` locks conflict between two open files of one process
too), so the command under test runs in-process; one test runs two real
trainers at once, and one kills a holder with SIGKILL.
"""
import json
import os
import signal
import subprocess
import sys
import threading

from mxfp16.cli import main
from mxfp16.data.pack import pack_recordio
from mxfp16.data.records import damaged_records
from mxfp16.data.validate import DataError
from mxfp16.inference.export import export_run
from mxfp16.plumbing.locking import LOCK_FILE, FolderBusyError, FolderLock
from mxfp16.train import checkpoint as ckpt

import pytest
from conftest import REPO
from train_support import QUICK, tiny_dataset

pytestmark = pytest.mark.slow
FLAGS = ["--precision", "float32", "--epochs", "2", "--max-batches", "2", "--keep-checkpoints", "1", *QUICK]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("lock-data"))


@pytest.fixture(scope="module")
def race(data, tmp_path_factory):
    """Two trainers on one --out, the second started half a second after the first, as in the issue."""
    out = tmp_path_factory.mktemp("lock-run") / "c1"
    env = dict(os.environ, PYTHONPATH=REPO)
    procs = []
    for seed in (1, 2):
        procs.append(subprocess.Popen([sys.executable, "-m", "mxfp16.train", "--data-dir", str(data), "--out",
                                       str(out), "--seed", str(seed), *FLAGS], cwd=REPO, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        if seed == 1:
            threading.Event().wait(0.5)
    return out, [(p.pid, p.wait(timeout=240), *p.communicate()) for p in procs]


@pytest.fixture(scope="module")
def run(race):
    """The run the race left: the winner's, finished."""
    return race[0]


@pytest.fixture
def copy(run, tmp_path):
    import shutil

    return shutil.copytree(run, tmp_path / "run")


def _snapshot(folder):
    """Every file of a run folder and its bytes (the lock's own file, which its holder rewrites, left out)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


@pytest.mark.parametrize("mode", [[], ["--overwrite"], ["--resume"]], ids=["start", "overwrite", "resume"])
def test_a_train_on_a_folder_another_process_trains_in_is_refused_and_changes_nothing(data, copy, capsys, mode):
    before = _snapshot(copy)
    with FolderLock(copy, "training"):  # as the first trainer holds it
        code = main(["train", "--data-dir", str(data), "--out", str(copy), *FLAGS, *mode])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"is in use by process {os.getpid()} (training since" in err and "Wait until that command ends" in err
    assert _snapshot(copy) == before  # nothing written, nothing deleted


def test_two_trainers_started_together_one_runs_the_other_is_refused(race):
    out, results = race
    codes = sorted(code for _, code, _, _ in results)
    assert codes == [0, 2], results
    (winner, _, _, _), (_, _, _, loser_err) = sorted(results, key=lambda r: r[1])
    assert f"is in use by process {winner} (training" in loser_err and "Traceback" not in loser_err
    config = json.loads((out / "config.json").read_text())  # the winner's, whole
    winner_seed = next(seed for (pid, *_), seed in zip(results, (1, 2)) if pid == winner)
    assert config["seed"] == winner_seed and f"--seed {winner_seed}" in config["command"]
    assert all(json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines())
    record = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert record["config_digest"] and record["progress"]["epoch"] == 2
    assert json.loads((out / "summary.json").read_text())["epochs"] == 2


def test_the_lock_ends_with_its_process_even_after_kill_9(tmp_path):
    folder = tmp_path / "run"
    code = ("import sys, time\nfrom mxfp16.plumbing.locking import FolderLock\n"
            f"lock = FolderLock({str(folder)!r}, 'training').acquire()\nprint('locked', flush=True)\ntime.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(FolderBusyError, match=f"process {holder.pid} \\(training since"):
            FolderLock(folder, "training").acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with FolderLock(folder, "training") as lock:  # nothing stale: the kernel dropped it with the process
        assert lock.held
    assert (folder / LOCK_FILE).exists()


def test_export_of_a_run_that_trains_reads_a_copy_the_pruning_cannot_take(copy, tmp_path):
    record = json.loads((copy / "checkpoints" / "latest.json").read_text())
    params = copy / "checkpoints" / f"{record['tag']}.params"
    digest = record["files"][params.name]
    lines = []

    def log(line):
        lines.append(line)
        if ", checkpoint " in line:  # the trainer prunes it now (--keep-checkpoints 1, a new epoch written)
            for path in (copy / "checkpoints").glob(f"{record['tag']}.*"):
                path.unlink()

    with FolderLock(copy, "training"):
        info = export_run(copy, tmp_path / "export", precision="float32", ctx="cpu", log=log)
    assert not params.exists() and info["source"]["params_sha256"] == digest
    assert any(f"is being written by process {os.getpid()} (training" in line for line in lines)


def test_export_holds_the_run_so_no_overwrite_starts_while_it_reads(copy, tmp_path):
    refused = []

    def log(line):
        if ", checkpoint " in line:
            try:
                FolderLock(copy, "replacing the run (--overwrite), then training").acquire()
            except FolderBusyError as err:
                refused.append(str(err))

    export_run(copy, tmp_path / "export", precision="float32", ctx="cpu", log=log)
    assert refused and "is in use by another mxfp16 command (reading it)" in refused[0]
    with FolderLock(copy, "training") as lock:  # released when the export ended
        assert lock.held


def test_copy_params_follows_a_checkpoint_pruned_before_it_was_opened(copy, tmp_path, monkeypatch):
    real = ckpt.params_file
    calls = []

    def pruned_first(out, epoch=None, verify=True):
        path, record = real(out, epoch, verify)
        calls.append(path)
        return (path.with_name("epoch-0001.params") if len(calls) == 1 else path), record

    monkeypatch.setattr(ckpt, "params_file", pruned_first)
    (tmp_path / "into").mkdir()
    copy_path, record = ckpt.copy_params(copy, tmp_path / "into")
    assert len(calls) == 2 and copy_path.read_bytes() == calls[-1].read_bytes()


def test_a_second_pack_into_a_prefix_being_packed_is_refused(data, tmp_path, capsys):
    prefix = tmp_path / "rec" / "tiny"
    prefix.parent.mkdir()
    with FolderLock(prefix.parent, "packing", name=f".{prefix.name}.lock"):
        assert main(["data", "pack", "--src", str(data), "--out", str(prefix), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert f"is in use by process {os.getpid()} (packing since" in err and "Traceback" not in err
    assert sorted(p.name for p in prefix.parent.iterdir()) == [".tiny.lock"]


def test_two_packs_at_once_leave_one_whole_verified_pack(data, tmp_path):
    prefix = tmp_path / "rec" / "tiny"
    outcomes = []

    def pack():
        try:
            outcomes.append(pack_recordio(data, prefix, workers=1))
        except DataError as err:
            outcomes.append(err)

    threads = [threading.Thread(target=pack) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = [o for o in outcomes if isinstance(o, dict)]
    assert done and all("is in use by" in str(o) for o in outcomes if not isinstance(o, dict))
    for split in ("train", "test"):
        rec, idx = (prefix.parent / f"tiny_{split}.rec", prefix.parent / f"tiny_{split}.idx")
        assert damaged_records(rec, idx) == []
        assert sum(1 for line in idx.read_text().splitlines() if line) == done[-1]["counts"][split]
    assert not [p.name for p in prefix.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_pack_that_does_not_verify_is_not_reported_and_replaces_nothing(data, tmp_path, monkeypatch):
    from mxfp16.data import pack

    prefix = tmp_path / "rec" / "tiny"
    monkeypatch.setattr(pack, "damaged_records", lambda rec, idx, **_: [(3, 100, "its JPEG is cut short")])
    with pytest.raises(DataError, match="do not check out \\(record 3: its JPEG is cut short\\); nothing was replaced"):
        pack_recordio(data, prefix, workers=1)
    assert sorted(p.name for p in prefix.parent.iterdir()) == [".tiny.lock"]
