"""``split_folder``: counts, determinism, hard links, exclusions, refusal of impossible splits."""
import json
import os

from mxfp16.data import DataError
from mxfp16.data.split import split_folder

import pytest
from PIL import Image


def _source(root, counts):
    for name, n in counts.items():
        (root / name).mkdir(parents=True)
        for i in range(n):
            Image.new("RGB", (12, 10), (i * 20 % 256, 40, 90)).save(root / name / f"image_{i:04d}.jpg")
    return root


@pytest.fixture
def src(tmp_path):
    return _source(tmp_path / "src", {"ant": 9, "bee": 6, "BACKGROUND_Google": 5})


def _listing(out, split):
    return {p.name: sorted(f.name for f in p.iterdir()) for p in sorted((out / split).iterdir())}


def test_train_per_class_counts_and_partition(src, tmp_path):
    manifest = split_folder(src, tmp_path / "out", train_per_class=3, seed=1)
    train, test = _listing(tmp_path / "out", "train"), _listing(tmp_path / "out", "test")
    for name, n in {"ant": 9, "bee": 6, "BACKGROUND_Google": 5}.items():
        assert len(train[name]) == 3 and len(test[name]) == n - 3
        assert not set(train[name]) & set(test[name])
        assert sorted(train[name] + test[name]) == sorted(os.listdir(src / name))
        assert manifest["counts"][name] == {"train": 3, "test": n - 3}
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert on_disk["seed"] == 1 and on_disk["totals"] == {"train": 9, "test": 11}


def test_same_seed_same_split_other_seed_differs(src, tmp_path):
    split_folder(src, tmp_path / "a", train_per_class=3, seed=5)
    split_folder(src, tmp_path / "b", train_per_class=3, seed=5)
    assert _listing(tmp_path / "a", "train") == _listing(tmp_path / "b", "train")
    others = [split_folder(src, tmp_path / f"s{s}", train_per_class=3, seed=s) and _listing(tmp_path / f"s{s}", "train")
              for s in range(6, 10)]
    assert any(o != _listing(tmp_path / "a", "train") for o in others)


def test_class_split_independent_of_excluded_classes(src, tmp_path):
    split_folder(src, tmp_path / "all", train_per_class=3, seed=2)
    manifest = split_folder(src, tmp_path / "some", train_per_class=3, seed=2, exclude=["BACKGROUND_Google"])
    assert manifest["classes"] == ["ant", "bee"]
    assert _listing(tmp_path / "some", "train") == {k: v for k, v in _listing(tmp_path / "all", "train").items()
                                                    if k != "BACKGROUND_Google"}


def test_hard_links_share_the_source_files(src, tmp_path):
    manifest = split_folder(src, tmp_path / "out", test_fraction=0.5, seed=0)
    linked = next((tmp_path / "out" / "train" / "ant").iterdir())
    assert os.stat(linked).st_ino == os.stat(src / "ant" / linked.name).st_ino
    assert manifest["files"] == "hard links"
    assert manifest["counts"]["ant"] == {"train": 9 - round(9 * 0.5), "test": round(9 * 0.5)}


def test_bad_files_are_skipped_and_recorded(src, tmp_path):
    (src / "ant" / "notes.txt").write_text("not an image")
    (src / "ant" / "broken.jpg").write_bytes(b"\xff\xd8garbage")
    manifest = split_folder(src, tmp_path / "out", train_per_class=3)
    assert sorted(os.path.basename(p) for p, _ in manifest["skipped"]) == ["broken.jpg", "notes.txt"]
    assert manifest["counts"]["ant"]["train"] + manifest["counts"]["ant"]["test"] == 9


def test_impossible_or_conflicting_splits_are_refused(src, tmp_path):
    with pytest.raises(DataError, match="BACKGROUND_Google has 5 usable images.*--exclude BACKGROUND_Google"):
        split_folder(src, tmp_path / "out", train_per_class=5)
    assert not (tmp_path / "out").exists()
    with pytest.raises(DataError, match="exactly one"):
        split_folder(src, tmp_path / "out", train_per_class=3, test_fraction=0.2)
    with pytest.raises(DataError, match="no such class folder"):
        split_folder(src, tmp_path / "out", train_per_class=3, exclude=["cat"])
    split_folder(src, tmp_path / "out", train_per_class=3, seed=0)
    assert split_folder(src, tmp_path / "out", train_per_class=3, seed=0)["seed"] == 0  # same split: reused
    with pytest.raises(DataError, match="already exists"):
        split_folder(src, tmp_path / "out", train_per_class=3, seed=1)
