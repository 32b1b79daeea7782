"""One writer per run folder and per pack prefix: a lock the kernel releases, refusals that name the holder.

Issue 37's cases: two ``train --out runs/c1`` half a second apart both exited 0
with one run's files over the other's; ``--overwrite`` while the first run
trained mixed both; ``export`` while the run pruned its checkpoints
(``--keep-checkpoints 1``) died with ``FileNotFoundError``; two ``data pack``
into one prefix wrote a damaged ``.rec`` and reported success. (Two real
trainers at once, and two packs at once, are in test_one_writer.py, with
every other writing command.)

A test that needs "another process training" holds the folder's lock
itself (``flock`` locks conflict between two open files of one process
too), so the command under test runs in-process; one kills a holder with
SIGKILL.
"""
import json
import os
import signal
import subprocess
import sys

from mxfp16.cli import main
from mxfp16.data.pack import pack_recordio
from mxfp16.data.validate import DataError
from mxfp16.inference.export import export_run
from mxfp16.plumbing.output import PathBusyError, PathLock, lock_file
from mxfp16.train import checkpoint as ckpt

import pytest
from conftest import REPO
from train_support import QUICK, ok, run_train, tiny_dataset

pytestmark = pytest.mark.slow
FLAGS = ["--precision", "float32", "--epochs", "2", "--max-batches", "2", "--keep-checkpoints", "1", *QUICK]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("lock-data"))


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    """A finished run of two epochs that kept one checkpoint."""
    out = tmp_path_factory.mktemp("lock-run") / "c1"
    ok(run_train("--data-dir", data, "--out", out, *FLAGS))
    return out


@pytest.fixture
def copy(run, tmp_path):
    import shutil

    return shutil.copytree(run, tmp_path / "run")


def _snapshot(folder):
    """Every file of a run folder and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("mode", [[], ["--overwrite"], ["--resume"]], ids=["start", "overwrite", "resume"])
def test_a_train_on_a_folder_another_process_trains_in_is_refused_and_changes_nothing(data, copy, capsys, mode):
    before = _snapshot(copy)
    with PathLock(copy, "training"):  # as the first trainer holds it
        code = main(["train", "--data-dir", str(data), "--out", str(copy), *FLAGS, *mode])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"is in use by process {os.getpid()} (training since" in err and "Wait until that command ends" in err
    assert _snapshot(copy) == before  # nothing written, nothing deleted


def test_the_lock_ends_with_its_process_even_after_kill_9(tmp_path):
    folder = tmp_path / "run"
    code = ("import sys, time\nfrom mxfp16.plumbing.output import PathLock\n"
            f"lock = PathLock({str(folder)!r}, 'training').acquire()\nprint('locked', flush=True)\ntime.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(PathBusyError, match=f"process {holder.pid} \\(training since"):
            PathLock(folder, "training").acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock_file(folder).exists()  # the killed holder could not remove its file; nothing holds it
    with PathLock(folder, "training") as lock:  # nothing stale: the kernel dropped it with the process
        assert lock.held
    assert not lock_file(folder).exists()  # the next holder removed it when it let go


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

    with PathLock(copy, "training"):
        info = export_run(copy, tmp_path / "export", precision="float32", ctx="cpu", log=log)
    assert not params.exists() and info["source"]["params_sha256"] == digest
    assert any(f"is being written by process {os.getpid()} (training" in line for line in lines)


def test_export_holds_the_run_so_no_overwrite_starts_while_it_reads(copy, tmp_path):
    refused = []

    def log(line):
        if ", checkpoint " in line:
            try:
                PathLock(copy, "replacing the run (--overwrite), then training").acquire()
            except PathBusyError as err:
                refused.append(str(err))

    export_run(copy, tmp_path / "export", precision="float32", ctx="cpu", log=log)
    assert refused and f"is in use by process {os.getpid()} (exporting it since" in refused[0]
    with PathLock(copy, "training") as lock:  # released when the export ended
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
    with PathLock(prefix, "packing"):
        assert main(["data", "pack", "--src", str(data), "--out", str(prefix), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert f"is in use by process {os.getpid()} (packing since" in err and "Traceback" not in err
    assert list(prefix.parent.iterdir()) == []


def test_a_pack_that_does_not_verify_is_not_reported_and_replaces_nothing(data, tmp_path, monkeypatch):
    from mxfp16.data import pack

    prefix = tmp_path / "rec" / "tiny"
    monkeypatch.setattr(pack, "damaged_records", lambda rec, idx, **_: [(3, 100, "its JPEG is cut short")])
    with pytest.raises(DataError, match="do not check out \\(record 3: its JPEG is cut short\\); nothing was replaced"):
        pack_recordio(data, prefix, workers=1)
    assert not prefix.parent.exists()  # no file, no lock file, no folder made for them
