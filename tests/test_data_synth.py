"""The synthetic shapes set and the demo set: layout, determinism, atomic generation, reuse."""
import json
import os

from mxfp16.data import SHAPES, DataError, demo_dataset, synth, synth_dataset

import numpy as np
import pytest
from PIL import Image

TINY = dict(classes=3, per_class=4, test_per_class=2, size=40, seed=7)


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.jpg"))


def test_layout_counts_and_sizes(tmp_path):
    out = synth_dataset(tmp_path / "s", **TINY)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["classes"] == list(SHAPES[:3])
    for split, count in (("train", 4), ("test", 2)):
        assert sorted(p.name for p in (out / split).iterdir()) == sorted(SHAPES[:3])
        for name in SHAPES[:3]:
            images = list((out / split / name).glob("*.jpg"))
            assert len(images) == count
            for path in images:
                with Image.open(path) as img:
                    assert img.mode == "RGB"
                    assert all(0.8 * 40 - 1 <= side <= 1.25 * 40 + 1 for side in img.size)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_same_seed_same_bytes_other_seed_other_images(tmp_path):
    a = synth_dataset(tmp_path / "a", **TINY)
    b = synth_dataset(tmp_path / "b", **TINY)
    c = synth_dataset(tmp_path / "c", **dict(TINY, seed=8))
    assert _files(a) == _files(b) == _files(c)
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in _files(a))
    assert sum((a / f).read_bytes() != (c / f).read_bytes() for f in _files(a)) == len(_files(a))


def test_classes_differ_in_shape_not_only_colour(tmp_path):
    # The shape mask is the class signal: for one random state, two classes give different masks.
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    a = np.asarray(synth.render("circle", rng_a, 64), dtype=np.float64)
    b = np.asarray(synth.render("square", rng_b, 64), dtype=np.float64)
    assert a.shape == b.shape and np.abs(a - b).mean() > 1.0


def test_reused_when_complete_regenerated_refused_when_foreign(tmp_path):
    out = synth_dataset(tmp_path / "s", **TINY)
    stamp = {f: os.stat(out / f).st_mtime_ns for f in _files(out)}
    synth_dataset(tmp_path / "s", **TINY)
    assert {f: os.stat(out / f).st_mtime_ns for f in _files(out)} == stamp
    with pytest.raises(DataError, match="does not hold this synthetic set"):
        synth_dataset(tmp_path / "s", **dict(TINY, per_class=5))
    # A missing file makes the set incomplete: it is not reused silently.
    (out / "train" / SHAPES[0] / f"{SHAPES[0]}_00000.jpg").unlink()
    with pytest.raises(DataError, match="files are missing"):
        synth_dataset(tmp_path / "s", **TINY)


def test_interrupted_generation_leaves_nothing_that_looks_complete(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = synth.render

    def failing(*args):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(synth, "render", failing)
    with pytest.raises(KeyboardInterrupt):
        synth_dataset(tmp_path / "s", **TINY)
    assert list(tmp_path.iterdir()) == []


def test_bad_settings(tmp_path):
    with pytest.raises(DataError, match="1 to 10 classes"):
        synth_dataset(tmp_path / "s", classes=11)
    with pytest.raises(DataError, match="per_class"):
        synth_dataset(tmp_path / "s", per_class=0)


def test_demo_dataset_generates_once_under_root(tmp_path, monkeypatch):
    monkeypatch.setattr(synth, "DEMO_SETTINGS", dict(TINY))
    path = demo_dataset(tmp_path)
    assert path == tmp_path / "demo"
    first = _files(path)
    assert len(first) == 3 * (4 + 2)
    assert demo_dataset(tmp_path) == path and _files(path) == first


def test_demo_dataset_replaces_an_outdated_generated_set_but_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setattr(synth, "DEMO_SETTINGS", dict(TINY))
    old = synth_dataset(tmp_path / "demo", **dict(TINY, per_class=2))
    assert demo_dataset(tmp_path) == old and len(_files(old)) == 3 * (4 + 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]
    foreign = tmp_path / "other"
    (foreign / "demo").mkdir(parents=True)
    (foreign / "demo" / "mine.txt").write_text("user data")
    with pytest.raises(DataError, match="holds mine.txt, which is not part of a synthetic set: --overwrite replaces "
                                        "the whole folder, and would delete it"):
        demo_dataset(foreign)
    assert (foreign / "demo" / "mine.txt").read_text() == "user data"
