"""File names as the OS gives them: bytes that are not UTF-8, newlines, tabs and percent signs.

On POSIX a file name is any bytes but ``/`` and NUL; Python keeps the bytes
that are not UTF-8 as lone surrogates, which C++ (MXNet, OpenCV), ``print``
and a UTF-8 file refuse. Such image files are read end to end (scan, train,
pack, predict); a class folder whose name cannot be a label is skipped with
one warning naming it.
"""
import csv
import json
import os
import shutil

from mxfp16.cli import main
from mxfp16.data import make_loaders
from mxfp16.data.pack import escape_name, pack_recordio, unescape_name
from mxfp16.inference.predict import unescape_text

import pytest
from train_support import QUICK, ok, run_train, tiny_dataset

pytestmark = pytest.mark.slow

#: Names an image may have: invalid UTF-8, a newline, a tab, a percent sign, ordinary non-ASCII.
ODD = [b"\xff\xfe-latin1-\xe9.jpg", b"new\nline.jpg", b"tab\there.jpg", b"100%.jpg", "caf\u00e9.jpg".encode()]


def _odd_copy(src, dst):
    """A copy of the data set whose first class holds one image under each of :data:`ODD`'s names."""
    shutil.copytree(src, dst)
    for split in ("train", "test"):
        folder = sorted((dst / split).iterdir())[0]
        sample = sorted(folder.iterdir())[0]
        for name in ODD:
            shutil.copyfile(sample, os.path.join(os.fsencode(folder), name))
    return dst


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    root = tmp_path_factory.mktemp("names")
    return _odd_copy(tiny_dataset(root / "base"), root / "odd")


def test_escaped_names_round_trip_and_stay_one_line():
    for raw in ODD + [b"plain.jpg", b"%41.jpg"]:
        name = os.fsdecode(raw)
        text = escape_name(name)
        assert "\n" not in text and "\t" not in text and text.encode("utf-8")
        assert os.fsencode(unescape_name(text)) == raw
    assert escape_name("plain.jpg") == "plain.jpg" and escape_name("caf\u00e9.jpg") == "caf\u00e9.jpg"


def test_the_scan_keeps_them_and_the_loaders_decode_them(odd):
    loaders = make_loaders(odd, image_size=16, batch_size=64)
    assert loaders.skipped == []
    names = {os.fsencode(os.path.basename(p)) for p, _ in loaders._train.items}
    assert set(ODD) <= names
    images = sum(data.shape[0] for data, _ in loaders.train_batches(0))
    assert images == loaders.num_train  # every image, odd names included, decoded in the epoch


def test_training_reads_them_end_to_end(odd, tmp_path):
    proc = ok(run_train("--data-dir", odd, "--precision", "float32", "--out", tmp_path / "run", "--epochs", 1,
                        *QUICK))
    assert "unusable file" not in proc.stdout
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data_fingerprint"]["files"] == sum(len(os.listdir(os.path.join(odd, s, c)))
                                                      for s in ("train", "test") for c in os.listdir(odd / s))


def test_a_class_folder_whose_name_is_not_text_is_skipped_with_one_warning(odd, tmp_path, caplog):
    copy = tmp_path / "data"
    shutil.copytree(odd, copy)
    for split in ("train", "test"):
        first = sorted((copy / split).iterdir())[0]
        shutil.copytree(first, os.fsdecode(os.path.join(os.fsencode(copy / split), b"cls-\xff")))
    loaders = make_loaders(copy, image_size=16, batch_size=8)
    assert len(loaders.classes) == 3 and all(name.isprintable() for name in loaders.classes)
    warned = [r.getMessage() for r in caplog.records if "skipping class folder" in r.getMessage()]
    assert len(warned) == 2 and all("cls-\\xff" in m and "not UTF-8" in m for m in warned)  # printable, named


def test_pack_writes_every_image_and_a_list_with_one_line_each(odd, tmp_path):
    prefix = tmp_path / "rec" / "odd"
    meta = pack_recordio(odd, prefix)
    assert meta["skipped"] == []
    for split in ("train", "test"):
        lines = (tmp_path / "rec" / f"odd_{split}.lst").read_text(encoding="utf-8").splitlines()
        assert len(lines) == meta["counts"][split]
        listed = {os.fsencode(unescape_name(line.split("\t")[2])) for line in lines}
        assert {os.path.basename(p) for p in listed} >= set(ODD)
    assert not [p for p in (tmp_path / "rec").iterdir() if p.name.endswith(".tmp")]
    loaders = make_loaders(prefix, image_size=16, batch_size=8, pipeline="recordio")
    assert sum(d.shape[0] for d, _ in loaders.test_batches()) == meta["counts"]["test"]
    # A batch more than twice a split is a clear error, not the C++ check failing inside ImageRecordIter.
    from mxfp16.data import DataError

    count = meta["counts"]["test"]
    with pytest.raises(DataError, match=f"test split holds {count} images, too few for a batch of {2 * count + 1}"):
        make_loaders(prefix, image_size=16, batch_size=2 * count + 1, pipeline="recordio")
    assert make_loaders(prefix, image_size=16, batch_size=2 * count, pipeline="recordio").num_test == count


def test_predict_reports_every_file_and_writes_their_names_as_the_os_gave_them(odd, tmp_path, capsys):
    run = tmp_path / "run"
    ok(run_train("--data-dir", odd, "--precision", "float32", "--out", run, "--epochs", 1, "--max-batches", 2,
                 *QUICK))
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "exp"), "--precision", "float32",
                 "--ctx", "cpu", "--margin", "100"]) == 0
    folder = sorted((odd / "test").iterdir())[0]
    out_csv, out_json = tmp_path / "p.csv", tmp_path / "p.json"
    assert main(["predict", "--model", str(tmp_path / "exp"), str(folder), "--output", str(out_csv),
                 "--no-progress"]) == 0
    assert main(["predict", "--model", str(tmp_path / "exp"), str(folder), "--output", str(out_json),
                 "--no-progress"]) == 0
    printed = capsys.readouterr()
    assert "\\xff\\xfe-latin1-\\xe9.jpg" in printed.out and "new\\nline.jpg" in printed.out  # one line each
    with open(out_csv, newline="", encoding="utf-8") as handle:  # UTF-8 throughout: the names are escaped
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(os.listdir(folder)) and all(r["class_1"] and not r["error"] for r in rows)
    # The bytes the OS gave, back from the escaped names.
    assert {os.path.basename(os.fsencode(unescape_text(r["path"]))) for r in rows} >= set(ODD)
    document = json.loads(out_json.read_text())
    assert {os.path.basename(os.fsencode(p["path"])) for p in document["predictions"]} >= set(ODD)
