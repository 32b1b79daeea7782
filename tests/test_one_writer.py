"""One writer per output, for every command that writes (issue 42, cases 1-4 and 13).

The rule (:class:`mxfp16.plumbing.output.Output`): the output is locked
before anything decides whether it exists, published in one step that
never replaces what appeared meanwhile, refused when it exists (without
``--overwrite``) or is an input of the same command, and ``--overwrite``
replaces it whole.

Case 1: two ``export --out E`` started together both said "wrote E"
(:func:`test_two_exports_to_one_folder_one_wins_whole_the_other_names_it`).
Case 2: ``predict --output E/export.json`` overwrote the export it ran
(:func:`test_predict_never_writes_into_its_export_or_over_its_inputs`).
Case 3: ``data pack`` over an existing pack, and over the pack a running
train reads, replaced it without a word
(:func:`test_a_pack_over_a_pack_is_refused_unless_overwrite_replaces_it_whole`,
:func:`test_a_pack_over_the_pack_a_run_trains_on_is_refused_naming_the_run`).
Case 4: an MXNet ``export --overwrite`` over an ONNX export left
``model.onnx`` behind (:func:`test_overwrite_replaces_an_onnx_export_whole_nothing_stale`).
Case 13: a full disk named "a file" and another disk's free space, and a
pack left its lock file (:func:`test_a_full_disk_names_the_output_and_the_free_space_of_its_own_disk`
for ``data pack``, ``test_a_full_disk_during_export_*`` and
``test_a_full_disk_under_predict_output_*``).

Every writing command has a concurrency test (``test_two_*``): the first
is held inside its publishing step by :func:`writer_race.race` (the train
by :mod:`fault_injection`'s pause, in a child process) while the second
runs; exactly one succeeds, the other names the output and the holder, and
the survivor's output is whole.
"""
import csv
import errno
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from mxfp16.cli import main
from mxfp16.data import DataError, synth_dataset
from mxfp16.data.digits import digits_dataset
from mxfp16.data.fetch import fetch_caltech101
from mxfp16.data.pack import pack_recordio
from mxfp16.data.records import damaged_records
from mxfp16.data.split import split_folder
from mxfp16.inference import bundle
from mxfp16.inference.bundle import ExportError
from mxfp16.inference.export import export_run
from mxfp16.plumbing.fileio import write_json
from mxfp16.plumbing.output import (
    Contents,
    Output,
    OutputFolderError,
    PathBusyError,
    PathLock,
    exchange,
    lock_file,
    read_lock,
    rename_noreplace,
)

import numpy as np
import pytest
from conftest import REPO
from export_support import images, tiny_export
from fault_injection import environment
from PIL import Image
from train_support import QUICK, tiny_dataset
from writer_race import race

HOLDER = f"is in use by process {os.getpid()} ("


def _quiet(*_):
    pass


def _leftovers(folder):
    """Lock files and staging or temporary names left in ``folder`` (none may stay)."""
    return sorted(p.name for p in Path(folder).iterdir() if p.name.startswith("."))


def _busy(outcome, target):
    """The refused command's message names the output and the holder (this process: the race runs in threads)."""
    text = str(outcome)
    assert str(target) in text and HOLDER in text and "Wait until that command ends" in text, text
    return text


# ---- the plumbing -------------------------------------------------------------------------------------
def test_rename_noreplace_never_replaces_a_file_or_a_folder(tmp_path):
    for make in (lambda p: p.write_text("mine"), lambda p: (p.mkdir(), (p / "f").write_text("mine"))):
        for name in ("file", "folder"):
            source, target = tmp_path / f"new-{name}", tmp_path / "target"
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
            make(target)
            source.mkdir() if name == "folder" else source.write_text("new")
            with pytest.raises(FileExistsError):
                rename_noreplace(source, target)
            assert source.exists() and "mine" in (target.read_text() if target.is_file() else
                                                  (target / "f").read_text())
            shutil.rmtree(source) if source.is_dir() else source.unlink()
    source = tmp_path / "free"
    source.write_text("new")
    rename_noreplace(source, tmp_path / "placed")
    assert (tmp_path / "placed").read_text() == "new" and not source.exists()


def test_exchange_puts_the_new_folder_in_place_and_hands_back_the_old(tmp_path):
    new, out = tmp_path / "new", tmp_path / "out"
    new.mkdir()
    (new / "model-symbol.json").write_text("new")
    out.mkdir()
    (out / "model.onnx").write_text("old")
    old = exchange(new, out)
    assert sorted(p.name for p in out.iterdir()) == ["model-symbol.json"]
    assert [p.read_text() for p in Path(old).rglob("model.onnx")] == ["old"]


def test_publish_never_replaces_what_appeared_meanwhile(tmp_path):
    out = tmp_path / "E"
    with pytest.raises(OutputFolderError, match="appeared while this command ran.*left as it is"):
        with Output(out, "testing", contents=bundle.CONTENTS) as output:
            staged = output.stage()
            (staged / "export.json").write_text("{}")
            out.mkdir()  # a program that takes no lock
            (out / "theirs.txt").write_text("theirs")
            output.publish(staged)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["E", "theirs.txt"]  # theirs kept, nothing staged left


def test_overwrite_refuses_a_folder_holding_what_the_command_does_not_write(tmp_path):
    out = tmp_path / "E"
    out.mkdir()
    (out / "model.onnx").write_text("an old export's")
    (out / "notes.txt").write_text("mine")
    contents = Contents("an export", ("model.onnx", "export.json"))
    with pytest.raises(OutputFolderError, match="holds notes.txt, which is not part of an export: --overwrite "
                                                "replaces the whole folder, and would delete it"):
        Output(out, "testing", overwrite=True, contents=contents).open()
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "notes.txt"] and _leftovers(tmp_path) == []


def test_the_lock_file_goes_with_its_last_holder_and_a_long_name_fits(tmp_path):
    target = tmp_path / "data"
    first, second = read_lock(target, "training on it"), read_lock(target, "training on it too")
    with pytest.raises(PathBusyError) as refused:
        PathLock(target, "packing", flag="--out").acquire()
    assert f"--out {target} {HOLDER}training on it since" in str(refused.value)
    first.release()
    assert lock_file(target).exists()  # the other reader still holds it
    second.release()
    assert _leftovers(tmp_path) == []
    long = tmp_path / ("n" * 250)
    with PathLock(long, "writing") as lock:
        assert lock.held and len(lock.path.name.encode()) <= 255
    assert _leftovers(tmp_path) == []


# ---- exports (cases 1 and 4) --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("writer-data"))


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    """Two finished runs of different seeds (their exports differ), trained at once."""
    root = tmp_path_factory.mktemp("writer-runs")
    env = dict(os.environ, PYTHONPATH=REPO)
    procs = [subprocess.Popen([sys.executable, "-m", "mxfp16.train", "--data-dir", str(data), "--out",
                               str(root / name), "--seed", str(seed), "--precision", "float32", "--epochs", "1",
                               "--max-batches", "2", *QUICK], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed, name in enumerate("ab")]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    return root / "a", root / "b"


@pytest.mark.slow
def test_two_exports_to_one_folder_one_wins_whole_the_other_names_it(runs, tmp_path, monkeypatch):
    out = tmp_path / "E"
    first, second = race(monkeypatch,
                         lambda: export_run(runs[0], out, precision="float32", ctx="cpu", log=_quiet),
                         lambda: export_run(runs[1], out, precision="float32", ctx="cpu", log=_quiet))
    assert isinstance(first, dict) and isinstance(second, ExportError), (first, second)
    _busy(second, out)
    bundle.verify(out)  # every file against SHA256SUMS
    info = bundle.read_info(out)
    assert info["source"]["run"] == str(runs[0].resolve()) and info["source"]["params_sha256"] == \
        first["source"]["params_sha256"]
    assert _leftovers(tmp_path) == []
    # Run alone afterwards, the second is refused: E exists.
    with pytest.raises(ExportError, match="already exists; replace it with --overwrite"):
        export_run(runs[1], out, precision="float32", ctx="cpu", log=_quiet)


@pytest.mark.slow
def test_overwrite_replaces_an_onnx_export_whole_nothing_stale(runs, tmp_path, capsys):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    out = tmp_path / "E"
    export_run(runs[0], out, ctx="cpu", log=_quiet, model_format="onnx", onnx_dtypes=("float32", "float16"))
    assert {"model.onnx", "model-float16.onnx"} <= {p.name for p in out.iterdir()}
    assert main(["export", "--run", str(runs[1]), "--out", str(out), "--precision", "float32", "--ctx", "cpu",
                 "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [bundle.SYMBOL_FILE, bundle.PARAMS_FILE, bundle.INFO_FILE, bundle.CHECKSUM_FILE])
    assert set(bundle.verify(out)) == {bundle.SYMBOL_FILE, bundle.PARAMS_FILE, bundle.INFO_FILE}
    assert bundle.read_info(out)["source"]["run"] == str(runs[1].resolve())
    assert _leftovers(tmp_path) == []


# ---- predict (case 2) ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("writer-export")
    images(root / "photos")
    return tiny_export(root / "E"), root / "photos"


def _predict(export, *flags):
    model, photos = export
    return main(["predict", "--model", str(model), str(photos), "--ctx", "cpu", "--no-progress", *flags])


def test_predict_never_writes_into_its_export_or_over_its_inputs(export, tmp_path, capsys):
    model, photos = export
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    for target in (model / "export.json", model / "predictions.csv"):
        for overwrite in ([], ["--overwrite"]):
            assert _predict(export, "--output", str(target), *overwrite) == 2
            err = capsys.readouterr().err
            assert f"--output {target}" in err and "the export --model" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before
    bundle.read_info(model)  # the export still loads
    image = sorted(photos.iterdir())[0]
    assert _predict(export, "--output", str(image.with_suffix(".csv"))) == 0  # beside the images: not one of them
    image.with_suffix(".csv").unlink()
    csv_image = photos / "list.csv"
    csv_image.write_text("not an image")
    try:  # an input predict reads (and skips) is not written over, --overwrite or not
        assert _predict(export, "--output", str(csv_image), "--overwrite") == 2
        assert "is an input image" in capsys.readouterr().err and csv_image.read_text() == "not an image"
    finally:
        csv_image.unlink()


def test_predict_output_is_new_unless_overwrite(export, tmp_path, capsys):
    out = tmp_path / "p.csv"
    out.write_text("earlier")
    assert _predict(export, "--output", str(out)) == 2
    assert "already exists; replace it with --overwrite" in capsys.readouterr().err and out.read_text() == "earlier"
    assert _predict(export, "--output", str(out), "--overwrite") == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 3 and all(row["class_1"] for row in rows)
    assert _leftovers(tmp_path) == []


def test_two_predicts_to_one_file_one_writes_it_whole_the_other_names_it(export, tmp_path, monkeypatch, capsys):
    out = tmp_path / "p.json"

    def second():
        code = _predict(export, "--output", str(out))
        return code, capsys.readouterr().err

    first, (code, err) = race(monkeypatch, lambda: _predict(export, "--output", str(out)), second)
    assert (first, code) == (0, 2)
    _busy(err, out)
    assert len(json.loads(out.read_text())["predictions"]) == 3 and _leftovers(tmp_path) == []


# ---- data pack (case 3) -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return synth_dataset(tmp_path_factory.mktemp("writer-small") / "s", classes=2, per_class=3, test_per_class=2,
                         size=32)


def _paused_trainer(flags, pause):
    """``python -m mxfp16.train FLAGS`` in its own process, held after its first step (its locks taken) until
    ``pause`` exists (:mod:`fault_injection`)."""
    faults = environment(pause_file=str(pause))
    env = dict(os.environ, **faults)
    env["PYTHONPATH"] = os.pathsep.join([REPO, faults["PYTHONPATH"]])
    trainer = subprocess.Popen([sys.executable, "-m", "mxfp16.train", *map(str, flags)], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not Path(f"{pause}.paused").exists() and trainer.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if not Path(f"{pause}.paused").exists():
        pause.touch()
        raise AssertionError(f"the trainer never paused: {trainer.communicate(timeout=300)[1]}")
    return trainer


def _whole_pack(prefix, meta):
    for split in ("train", "test"):
        rec, idx = Path(f"{prefix}_{split}.rec"), Path(f"{prefix}_{split}.idx")
        assert damaged_records(rec, idx) == []
        assert sum(1 for line in idx.read_text().splitlines() if line) == meta["counts"][split]
    assert json.loads(Path(f"{prefix}_classes.json").read_text()) == meta


def test_a_pack_over_a_pack_is_refused_unless_overwrite_replaces_it_whole(small, data, tmp_path, capsys):
    prefix = tmp_path / "rec" / "x"
    assert main(["data", "pack", "--src", str(small), "--out", str(prefix), "--workers", "1"]) == 0
    before = {p.name: p.read_bytes() for p in prefix.parent.iterdir()}
    assert main(["data", "pack", "--src", str(data), "--out", str(prefix), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert f"--out {prefix} already exists (a pack: {prefix}_train.rec is there)" in err
    assert "replace it with --overwrite" in err
    assert {p.name: p.read_bytes() for p in prefix.parent.iterdir()} == before
    meta = pack_recordio(data, prefix, workers=1, overwrite=True)
    _whole_pack(prefix, meta)
    assert meta["source"] == str(data) and _leftovers(prefix.parent) == []


@pytest.mark.slow
def test_a_pack_over_the_pack_a_run_trains_on_is_refused_naming_the_run(small, data, tmp_path, capsys):
    prefix = tmp_path / "rec" / "x"
    meta = pack_recordio(small, prefix, workers=1)
    pause = tmp_path / "go"
    trainer = _paused_trainer(["--data-dir", prefix, "--pipeline", "recordio", "--out", tmp_path / "run",
                               "--precision", "float32", "--epochs", "1", "--max-batches", "2", *QUICK], pause)
    try:
        for overwrite in ([], ["--overwrite"]):
            assert main(["data", "pack", "--src", str(data), "--out", str(prefix), "--workers", "1",
                         *overwrite]) == 2
            err = capsys.readouterr().err
            assert f"--out {prefix} is in use by process {trainer.pid} (training on it since" in err, err
    finally:
        pause.touch()
        _, err = trainer.communicate(timeout=300)
    assert trainer.returncode == 0, err
    _whole_pack(prefix, meta)  # the run's data, as it read it


def test_two_packs_into_one_prefix_one_wins_whole_the_other_names_it(small, data, tmp_path, monkeypatch):
    prefix = tmp_path / "rec" / "x"
    first, second = race(monkeypatch, lambda: pack_recordio(small, prefix, workers=1),
                         lambda: pack_recordio(data, prefix, workers=1), step="publish_files")
    assert isinstance(first, dict) and isinstance(second, DataError), (first, second)
    _busy(second, prefix)
    _whole_pack(prefix, first)
    assert _leftovers(prefix.parent) == []


# ---- the data commands --------------------------------------------------------------------------------
def test_two_splits_into_one_folder_one_wins_whole_the_other_names_it(small, tmp_path, monkeypatch):
    out = tmp_path / "split"
    first, second = race(monkeypatch, lambda: split_folder(small / "train", out, train_per_class=2),
                         lambda: split_folder(small / "train", out, train_per_class=1))
    assert isinstance(first, dict) and isinstance(second, DataError), (first, second)
    _busy(second, out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest == first and manifest["train_per_class"] == 2
    assert sum(1 for p in (out / "train").rglob("*") if p.is_file()) == manifest["totals"]["train"]
    # Another split is refused, and replaced whole with overwrite; the same one is reused.
    with pytest.raises(DataError, match="already exists; it holds other contents or settings"):
        split_folder(small / "train", out, train_per_class=1)
    assert split_folder(small / "train", out, train_per_class=2) == manifest
    assert split_folder(small / "train", out, train_per_class=1, overwrite=True)["train_per_class"] == 1
    assert _leftovers(tmp_path) == []


def test_a_split_over_its_own_source_is_refused_even_with_overwrite(small, tmp_path):
    source = tmp_path / "src"
    shutil.copytree(small / "train", source)
    for out in (source, source / "split", tmp_path):
        with pytest.raises(DataError, match="the source folder --src"):
            split_folder(source, out, train_per_class=1, overwrite=True)
    assert sorted(p.name for p in source.iterdir()) == sorted(p.name for p in (small / "train").iterdir())


def test_two_synths_into_one_folder_one_wins_whole_the_other_names_it(tmp_path, monkeypatch):
    out = tmp_path / "s"
    settings = dict(classes=2, per_class=2, test_per_class=1, size=16)
    first, second = race(monkeypatch, lambda: synth_dataset(out, **settings),
                         lambda: synth_dataset(out, **dict(settings, seed=1)))
    assert first == out and isinstance(second, DataError), (first, second)
    _busy(second, out)
    assert json.loads((out / "manifest.json").read_text())["seed"] == 0
    assert synth_dataset(out, **settings) == out  # whole: reused as it is
    assert _leftovers(tmp_path) == []


def test_two_runs_making_the_demo_set_at_once_both_use_it(tmp_path, monkeypatch):
    import threading

    from mxfp16.data import synth

    monkeypatch.setattr(synth, "DEMO_SETTINGS", dict(classes=2, per_class=2, test_per_class=1, size=16, seed=0))
    real, inside, go = Output.publish, threading.Event(), threading.Event()

    def held(self, staged):
        inside.set()
        go.wait(60)
        return real(self, staged)

    monkeypatch.setattr(Output, "publish", held)
    outcomes = []
    makers = [threading.Thread(target=lambda: outcomes.append(synth.demo_dataset(tmp_path))) for _ in range(2)]
    makers[0].start()
    assert inside.wait(60)
    makers[1].start()  # the second worker of a job: it waits for the first rather than failing the job
    makers[1].join(1.0)
    assert makers[1].is_alive() and len(outcomes) == 0
    go.set()
    for maker in makers:
        maker.join(60)
    assert outcomes == [tmp_path / "demo"] * 2
    assert sum(1 for p in (tmp_path / "demo").rglob("*.jpg")) == 2 * 3 and _leftovers(tmp_path) == []


def test_two_digit_sets_into_one_folder_one_wins_whole_the_other_names_it(tmp_path, monkeypatch):
    out = tmp_path / "digits"
    first, second = race(monkeypatch, lambda: digits_dataset(out), lambda: digits_dataset(out, seed=1))
    assert first == out and isinstance(second, DataError), (first, second)
    _busy(second, out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 0
    assert sum(1 for p in out.rglob("*.png")) == sum(manifest["per_class"].values())
    with pytest.raises(DataError, match="holds the digits with other settings"):
        digits_dataset(out, seed=1)
    assert json.loads((digits_dataset(out, seed=1, overwrite=True) / "manifest.json").read_text())["seed"] == 1
    assert _leftovers(tmp_path) == []


def _caltech_archive(path):
    """A ``101_ObjectCategories.tar.gz`` of two classes of one JPEG each."""
    with tarfile.open(path, "w:gz") as tar:
        for name in ("cat", "dog"):
            buffer = io.BytesIO()
            Image.fromarray(np.full((8, 8, 3), 100, np.uint8)).save(buffer, "JPEG")
            info = tarfile.TarInfo(f"101_ObjectCategories/{name}/image_0001.jpg")
            info.size = len(buffer.getvalue())
            tar.addfile(info, io.BytesIO(buffer.getvalue()))
    return path


def test_two_fetches_into_one_root_one_wins_whole_the_other_names_it(tmp_path, monkeypatch):
    archive = _caltech_archive(tmp_path / "101_ObjectCategories.tar.gz")
    root = tmp_path / "data"
    fetch = lambda: fetch_caltech101(root, url=str(archive), progress=False)  # noqa: E731
    first, second = race(monkeypatch, fetch, fetch)
    assert first == root / "caltech101" and isinstance(second, DataError), (first, second)
    _busy(second, root / "caltech101")
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["classes"] == 2 and manifest["files"] == 2
    assert fetch() == first and _leftovers(root) == []  # complete: reused


def test_two_data_benches_to_one_file_one_writes_it_the_other_names_it(small, tmp_path, monkeypatch, capsys):
    from mxfp16.data import timing

    report = {"image_sizes": {}, "results": [], "load_average": {"before": [0.0], "after": [0.0]},
              "settings": {"cpu_count": 2}}
    monkeypatch.setattr(timing, "bench_pipelines", lambda *args: report)  # the race is over the file, not the timing
    out = tmp_path / "bench.json"
    argv = ["data", "bench", "--src", str(small), "--json", str(out)]
    first, second = race(monkeypatch, lambda: main(argv), lambda: (main(argv), capsys.readouterr().err))
    assert (first, second[0]) == (0, 2)
    _busy(second[1], out)
    assert json.loads(out.read_text()) == report
    assert main(argv) == 2 and "already exists" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0


# ---- compare, bench, diagnose, selftest, demo ---------------------------------------------------------
def _finished_run(path, precision, seed):
    path.mkdir(parents=True)
    write_json(path / "config.json", {"precision": precision, "model": "m", "batch_size": 8, "epochs": 1,
                                      "seed": seed})
    (path / "metrics.jsonl").write_text(json.dumps(
        {"epoch": 1, "train_loss": 1.0, "train_top1": 0.5, "val_top1": 0.5 + seed / 100, "val_top5": 0.9,
         "images_per_second": 10.0 + seed, "loss_scale": 1.0, "skipped_steps": 0, "lr": 0.1, "seconds": 1.0}) + "\n")
    write_json(path / "summary.json", {
        "precision": precision, "model": "m", "epochs": 1, "final_val_top1": 0.5 + seed / 100,
        "best_val_top1": 0.5 + seed / 100, "images_per_second": 10.0 + seed, "peak_memory_mb": 1.0,
        "skipped_steps": 0, "final_loss_scale": 1.0, "params_digest": f"{precision}-{seed}"})
    return str(path)


def test_two_compares_into_one_folder_one_wins_whole_the_other_names_it(tmp_path, monkeypatch, capsys):
    runs = [_finished_run(tmp_path / "runs" / name, precision, seed)
            for name, precision, seed in (("f32", "float32", 0), ("bf16", "amp-bfloat16", 1))]
    out = tmp_path / "cmp"
    argv = ["compare", *runs, "--out", str(out)]
    first, second = race(monkeypatch, lambda: main(argv), lambda: (main(argv), capsys.readouterr().err))
    assert (first, second[0]) == (0, 2)
    _busy(second[1], out)
    assert [row["run"] for row in json.loads((out / "compare.json").read_text())["runs"]] == ["f32", "bf16"]
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "compare.md", "compare.png"]
    assert main(argv) == 2 and "already exists; replace it with --overwrite" in capsys.readouterr().err
    (out / "parity.txt").write_text("an earlier comparison's")  # what a compare writes: replaced with the rest
    assert main([*argv, "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "compare.md", "compare.png"]
    assert main(["compare", *runs, "--out", runs[0], "--overwrite"]) == 2  # a run folder is an input
    assert "is the run folder" in capsys.readouterr().err and (Path(runs[0]) / "summary.json").exists()


@pytest.mark.slow
def test_two_benches_into_one_folder_one_wins_whole_the_other_names_it(tmp_path, monkeypatch, capsys):
    out = tmp_path / "bench"
    argv = ["bench", "--model", "cifar_resnet20_v1", "--image-size", "8", "--classes", "2", "--batch-sizes", "2",
            "--precisions", "float32", "--iters", "1", "--warmup", "0", "--repeats", "1", "--no-plots", "--out",
            str(out), "--no-census"]
    first, second = race(monkeypatch, lambda: main(argv), lambda: (main(argv), capsys.readouterr().err))
    assert (first, second[0]) == (0, 2)
    _busy(second[1], out)
    assert [row["status"] for row in json.loads((out / "bench.json").read_text())["results"]] == ["ok"]
    assert sorted(p.name for p in out.iterdir()) == ["bench.csv", "bench.json"] and _leftovers(tmp_path) == []


def test_two_diagnoses_into_one_folder_one_wins_whole_the_other_names_it(small, tmp_path, monkeypatch, capsys):
    out = tmp_path / "diag"
    argv = ["diagnose", "--data-dir", str(small), "--model", "elementwise-mlp", "--image-size", "8",
            "--batch-size", "2", "--batches", "1", "--no-forward-check", "--ctx", "cpu", "--out", str(out)]
    first, second = race(monkeypatch, lambda: main(argv), lambda: (main(argv), capsys.readouterr().err))
    assert (first, second[0]) == (0, 2)
    _busy(second[1], out)
    assert json.loads((out / "diagnose.json").read_text())["recommendation"]["scale"] > 0
    assert sorted(p.name for p in out.iterdir()) == ["diagnose.json", "diagnose.txt", "gradient_histogram.png"]
    assert main(argv) == 2 and "already exists; replace it with --overwrite" in capsys.readouterr().err


def test_two_selftests_to_one_file_one_writes_it_the_other_names_it(tmp_path, monkeypatch, capsys):
    from mxfp16.train import selftest

    rows = [{"precision": "float32", "verdict": "control"}]
    monkeypatch.setattr(selftest, "run_selftest", lambda **kwargs: rows)  # the race is over the file
    monkeypatch.setattr(selftest, "format_table", lambda rows: "table")
    out = tmp_path / "selftest.json"
    argv = ["selftest", "--json", str(out)]
    first, second = race(monkeypatch, lambda: main(argv), lambda: (main(argv), capsys.readouterr().err))
    assert (first, second[0]) == (0, 2)
    _busy(second[1], out)
    assert json.loads(out.read_text()) == rows


def test_two_demos_into_one_folder_the_second_names_the_first(tmp_path, monkeypatch, capsys):
    from mxfp16.commands import demo

    out = tmp_path / "demo"
    seconds = []

    def train_or_compare(*args):  # the first demo's first run: the second demo starts meanwhile
        if not seconds:
            seconds.append((main(["demo", "--out", str(out)]), capsys.readouterr().err))
        Path(args[args.index("--out") + 1]).mkdir(parents=True, exist_ok=True)
        return True

    monkeypatch.setattr(demo, "resolve_auto", lambda: ("amp-bfloat16", "stand-in"))
    monkeypatch.setattr(demo, "_mxfp16", train_or_compare)
    assert main(["demo", "--out", str(out)]) == 0
    assert seconds[0][0] == 2
    _busy(seconds[0][1], out)
    assert sorted(p.name for p in out.iterdir()) == ["amp-bfloat16", "compare", "float32"]
    assert main(["demo", "--out", str(out)]) == 2 and "already exists" in capsys.readouterr().err


@pytest.mark.slow
def test_two_trainers_on_one_folder_one_trains_whole_the_other_names_it(data, tmp_path, capsys):
    out, pause = tmp_path / "run", tmp_path / "go"
    flags = ["--data-dir", str(data), "--out", str(out), "--precision", "float32", "--epochs", "1",
             "--max-batches", "2", *QUICK]
    first = _paused_trainer(flags, pause)
    try:
        for mode in ([], ["--overwrite"], ["--resume"]):  # refused at the lock, before anything is built
            assert main(["train", *flags, *mode, "--seed", "1"]) == 2
            err = capsys.readouterr().err
            assert f"--out {out} is in use by process {first.pid} (training since" in err and "Traceback" not in err
    finally:
        pause.touch()
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert json.loads((out / "config.json").read_text())["seed"] == 0
    assert json.loads((out / "summary.json").read_text())["epochs"] == 1
    record = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert record["progress"]["epoch"] == 1 and _leftovers(tmp_path) == []


# ---- case 13: a full disk -----------------------------------------------------------------------------
@pytest.fixture
def full_disk(tmp_path, monkeypatch):
    """The disk under ``tmp_path`` is full (0 bytes free); every other has 73526 MB, as on the issue's machine.

    Returns ``fail(how)``: a stand-in that raises as a full disk does, ``'os'`` as ``write()`` and ``fsync()``
    (an OSError naming no file), ``'mxnet'`` as MXNet's writers (no errno either). No ``ulimit -f`` is set here.
    """
    import resource

    import mxnet as mx

    real, limits = shutil.disk_usage, resource.getrlimit

    def usage(path):
        found = real(path)
        free = 0 if str(Path(path).resolve()).startswith(str(tmp_path.resolve())) else 73526 << 20
        return type(found)(found.total, found.total - free, free)

    monkeypatch.setattr(shutil, "disk_usage", usage)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY,) * 2
                        if which == resource.RLIMIT_FSIZE else limits(which))

    def fail(how):
        def fails(*args, **kwargs):
            if how == "mxnet":
                raise mx.base.MXNetError("Check failed: std::fwrite(ptr, 1, size, fp_) == size: FileStream.Write "
                                         "incomplete")
            raise OSError(errno.ENOSPC, "No space left on device")
        return fails

    return fail


def _one_line(capsys, code, target):
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    line = [line for line in err.splitlines() if ": error: " in line]
    assert len(line) == 1 and f"error: {target}: No space left on device; the disk is full (0 MB free there)" \
        in line[0], err
    return line[0]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["os", "mxnet"])
def test_a_full_disk_during_export_names_the_export_and_its_own_disk(runs, tmp_path, full_disk, monkeypatch,
                                                                     capsys, how):
    from mxfp16.inference import export

    import mxnet as mx

    if how == "mxnet":
        monkeypatch.setattr(mx.nd, "save", full_disk(how))  # the parameters
    else:
        monkeypatch.setattr(export, "_copy_checkpoint", full_disk(how))  # the first file written
    out = tmp_path / "E"
    _one_line(capsys, main(["export", "--run", str(runs[0]), "--out", str(out), "--precision", "float32", "--ctx",
                            "cpu"]), out)
    assert list(tmp_path.iterdir()) == []  # no staging folder, no lock file


@pytest.mark.parametrize("how", ["os", "mxnet"])
def test_a_full_disk_names_the_output_and_the_free_space_of_its_own_disk(small, tmp_path, full_disk, monkeypatch,
                                                                        capsys, how):
    from mxfp16.data import pack

    import mxnet as mx

    if how == "mxnet":
        monkeypatch.setattr(mx.recordio.MXIndexedRecordIO, "write_idx", full_disk(how))  # a record
    else:
        monkeypatch.setattr(pack, "write_json", full_disk(how))  # PREFIX_classes.json, after both splits
    prefix = tmp_path / "rec" / "x"
    _one_line(capsys, main(["data", "pack", "--src", str(small), "--out", str(prefix), "--workers", "1"]), prefix)
    assert not prefix.parent.exists()  # no lock file (0 bytes or any), no staged file, no empty folder


def test_a_full_disk_under_predict_output_names_the_file_and_its_own_disk(export, tmp_path, full_disk,
                                                                          monkeypatch, capsys):
    monkeypatch.setattr(os, "fsync", full_disk("os"))  # the atomic write of --output
    out = tmp_path / "p.csv"
    _one_line(capsys, _predict(export, "--output", str(out)), out)
    assert list(tmp_path.iterdir()) == []
