"""Bad input: missing and empty folders, empty classes, corrupt, truncated and non-image files, grayscale, CMYK."""
import logging
import shutil

import numpy as np
import pytest
from PIL import Image

from mxfp16.data import DataError, make_loaders, scan_image, synth_dataset


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return synth_dataset(tmp_path_factory.mktemp("data") / "s", classes=2, per_class=4, test_per_class=2, size=40)


@pytest.fixture
def data(base, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    return copy


def _all(batches):
    return [(d.asnumpy(), l.asnumpy()) for d, l in batches]


def _gradient(mode):
    pixels = np.stack(np.meshgrid(np.arange(48) * 5, np.arange(40) * 6) + [np.full((40, 48), 128)], -1).astype(np.uint8)
    return Image.fromarray(pixels).convert(mode)


def test_missing_folder_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(DataError, match=f"{tmp_path / 'nope' / 'train'} does not exist.*mxfp16 data synth"):
        make_loaders(tmp_path / "nope")


def test_empty_folder(tmp_path):
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(DataError, match="no class sub-folders"):
        make_loaders(tmp_path / "empty")


def test_class_without_images_is_an_error_naming_it(data):
    (data / "train" / "zebra").mkdir()
    (data / "train" / "zebra" / "readme.txt").write_text("no images here")
    with pytest.raises(DataError, match=r"train/zebra.*Add images to them or delete"):
        make_loaders(data)


def test_corrupt_truncated_and_non_image_files_are_skipped_and_logged(data, caplog):
    folder = data / "train" / "bar"
    good = sorted(folder.glob("*.jpg"))[0].read_bytes()
    (folder / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (folder / "garbage.jpg").write_bytes(b"this is not a jpeg at all")
    (folder / "notes.txt").write_text("hello")
    (folder / "empty.png").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="mxfp16.data"):
        loaders = make_loaders(data, image_size=24, batch_size=4)
    reasons = {p.split("/")[-1]: r for p, r in loaders.skipped}
    assert set(reasons) == {"truncated.jpg", "garbage.jpg", "notes.txt", "empty.png"}
    assert "truncated" in reasons["truncated.jpg"] and "not an image" in reasons["notes.txt"]
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert all(str(folder / name) in logged for name in reasons) and "skipped 4 unusable" in logged
    assert loaders.num_train == 8
    assert sum(len(l) for _, l in _all(loaders.train_batches(0))) == 8


@pytest.mark.parametrize("mode", ["L", "CMYK", "P"])
def test_grayscale_cmyk_and_palette_images_become_rgb(data, mode):
    path = data / "train" / "bar" / f"odd_{mode}.{'png' if mode == 'P' else 'jpg'}"
    _gradient(mode).save(path)
    assert Image.open(path).mode == mode and scan_image(path) is None
    loaders = make_loaders(data, image_size=24, batch_size=16)
    assert not loaders.skipped and loaders.num_train == 9
    (images, _), = _all(loaders.test_batches())
    assert images.shape[1] == 3
    train, = _all(loaders.train_batches(0))
    assert train[0].shape == (9, 3, 24, 24) and np.isfinite(train[0]).all()


def test_a_file_broken_after_the_scan_raises_with_its_path(data):
    loaders = make_loaders(data, image_size=24, batch_size=2)
    victim = sorted((data / "train" / "circle").glob("*.jpg"))[0]
    victim.write_bytes(b"overwritten after the scan")
    with pytest.raises(DataError, match=f"cannot decode {victim}"):
        _all(loaders.train_batches(0))


@pytest.mark.slow
def test_a_file_broken_after_the_scan_raises_with_its_path_from_workers(data):
    loaders = make_loaders(data, image_size=24, batch_size=2, workers=2)
    victim = sorted((data / "train" / "circle").glob("*.jpg"))[0]
    victim.write_bytes(b"overwritten after the scan")
    with pytest.raises(DataError, match=f"cannot decode {victim}"):
        _all(loaders.train_batches(0))
