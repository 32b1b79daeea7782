"""Bad input: missing and empty folders, empty classes, corrupt, truncated and non-image files, grayscale, CMYK,
decompression bombs, FIFOs, sockets, devices and bad links."""
import contextlib
import logging
import os
import shutil
import socket
import stat
import struct
import threading
import zlib

from mxfp16.data import DataError, make_loaders, scan_image, synth_dataset
from mxfp16.data.pack import pack_recordio
from mxfp16.data.split import split_folder

import numpy as np
import pytest
from PIL import Image


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
    pixels = np.stack([*np.meshgrid(np.arange(48) * 5, np.arange(40) * 6), np.full((40, 48), 128)], -1).astype(np.uint8)
    return Image.fromarray(pixels).convert(mode)


def test_missing_folder_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(DataError, match=f"{tmp_path / 'nope' / 'train'} does not exist.*mxfp16 data synth"):
        make_loaders(tmp_path / "nope")


def test_empty_folder(tmp_path):
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(DataError, match="has no usable class sub-folders"):
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


def _png_declaring(width, height):
    """A 1-bit PNG of ``width`` x ``height`` black pixels: 48 KB on disk for 20000x20000 (400 M pixels).

    Written chunk by chunk (length, type, data, CRC), as Pillow would need the
    whole image in memory to save it.
    """
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor, row = zlib.compressobj(9), bytes(1 + (width + 7) // 8)  # filter byte + packed bits
    pixels = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def bomb_png():
    return _png_declaring(20000, 20000)


def _within(seconds, call, fifos=()):
    """``call()``, failing the test if it takes longer (a scan that opens a FIFO waits forever)."""
    result = {}

    def run():
        try:
            result["value"] = call()
        except BaseException as err:  # re-raised below, in the test's thread
            result["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in fifos:  # let the blocked reader go, so the thread can end
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"still running after {seconds} s: the scan hangs")
    if "error" in result:
        raise result["error"]
    return result["value"]


def _hostile_files(folder, bomb):
    """Plant a decompression bomb, special files and bad links in ``folder``; return ``{name: reason words}``."""
    (folder / "bomb.png").write_bytes(bomb)
    (folder / "large.png").write_bytes(_png_declaring(10000, 10000))  # Pillow only warns at 100 M pixels
    os.mkfifo(folder / "pipe.jpg")
    with socket.socket(socket.AF_UNIX) as sock:  # a socket file stays after the socket is closed
        cwd = os.getcwd()
        os.chdir(folder)  # AF_UNIX paths are limited to about 100 bytes
        try:
            sock.bind("sock.jpg")
        finally:
            os.chdir(cwd)
    os.symlink("/dev/zero", folder / "zero.jpg")
    os.symlink("missing.jpg", folder / "dangling.jpg")
    outside = folder.parent.parent.parent / "outside.jpg"
    shutil.copy(next(folder.glob("*.jpg")), outside)
    os.symlink(outside, folder / "elsewhere.jpg")
    return {"bomb.png": "decompression bomb", "large.png": "decompression bomb", "pipe.jpg": "FIFO",
            "sock.jpg": "socket", "zero.jpg": "/dev/zero, a character device", "dangling.jpg": "dangling",
            "elsewhere.jpg": "outside"}


def _skipped_names(skipped, words):
    named = {os.path.basename(path): reason for path, reason in skipped}
    assert set(named) == set(words), named
    for name, expected in words.items():
        assert expected in named[name], (name, named[name])


def test_decompression_bombs_and_special_files_are_skipped_and_named(data, bomb_png, caplog):
    folder = data / "train" / "bar"
    words = _hostile_files(folder, bomb_png)
    # A link inside the data set, to a good image, is fine.
    os.symlink(sorted((data / "train" / "circle").glob("*.jpg"))[0], folder / "link.jpg")
    with caplog.at_level(logging.WARNING, logger="mxfp16.data"):
        loaders = _within(60, lambda: make_loaders(data, image_size=24, batch_size=4), [folder / "pipe.jpg"])
    _skipped_names(loaders.skipped, words)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert all(f"skipping {folder / name}:" in logged for name in words)
    assert loaders.num_train == 9 and sum(len(l) for _, l in _all(loaders.train_batches(0))) == 9
    assert len(bomb_png) < 64 * 1024


def test_split_and_pack_skip_them_too(data, bomb_png, tmp_path):
    words = _hostile_files(data / "train" / "bar", bomb_png)
    fifo = data / "train" / "bar" / "pipe.jpg"
    manifest = _within(60, lambda: split_folder(data / "train", tmp_path / "split", train_per_class=2), [fifo])
    _skipped_names(manifest["skipped"], words)
    meta = _within(120, lambda: pack_recordio(data, tmp_path / "rec" / "p", workers=1), [fifo])
    _skipped_names(meta["skipped"], words)
    assert meta["counts"] == {"train": 8, "test": 4}


def test_a_device_node_is_never_opened(tmp_path):
    try:
        os.mknod(tmp_path / "null.jpg", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    except PermissionError:
        pytest.skip("creating device nodes needs privileges")
    assert scan_image(tmp_path / "null.jpg") == "a character device: only regular files are read"


def test_a_fifo_named_like_an_image_does_not_hang_the_scan(data):
    fifo = data / "train" / "bar" / "pipe.jpg"
    os.mkfifo(fifo)
    loaders = _within(30, lambda: make_loaders(data, image_size=24, batch_size=4), [fifo])
    assert loaders.skipped == [(str(fifo), "a FIFO (named pipe): only regular files are read")]


def test_a_class_folder_that_cannot_be_read_is_named_with_the_fix(data, monkeypatch):
    """(As root every folder is readable, so the refusal is made by the OS call the scan uses.)"""
    import pathlib

    locked = data / "train" / sorted(os.listdir(data / "train"))[0]
    real = pathlib.Path.iterdir

    def iterdir(self):
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "iterdir", iterdir)
    with pytest.raises(DataError, match=fr"{locked} cannot be read \(Permission denied\).*chmod -R u\+rX"):
        make_loaders(data)


def _encoded(fmt):
    import io

    buffer = io.BytesIO()
    _gradient("RGB").save(buffer, format=fmt)
    return buffer.getvalue()


def test_the_scan_admits_exactly_the_formats_mxnets_decoder_reads():
    from mxfp16.data.validate import DECODABLE_FORMATS

    import mxnet as mx

    decoded = set()
    for fmt in ("JPEG", "PNG", "BMP", "TIFF", "GIF", "WEBP", "PPM", "JPEG2000", "TGA", "ICO"):
        with contextlib.suppress(mx.base.MXNetError):
            mx.image.imdecode(_encoded(fmt), flag=1)
            decoded.add(fmt)
    assert decoded == set(DECODABLE_FORMATS)


def test_a_gif_named_png_and_a_webp_named_jpg_are_skipped_at_the_scan_not_in_epoch_one(data, caplog):
    (data / "train" / "bar" / "a-gif.png").write_bytes(_encoded("GIF"))
    (data / "train" / "bar" / "a-webp.jpg").write_bytes(_encoded("WEBP"))
    assert "a GIF image named .png" in scan_image(data / "train" / "bar" / "a-gif.png")
    with caplog.at_level(logging.WARNING, logger="mxfp16.data"):
        loaders = make_loaders(data, image_size=16, batch_size=4)
    skipped = {os.path.basename(path): reason for path, reason in loaders.skipped}
    assert "MXNet's decoder cannot read" in skipped["a-gif.png"] and "a WEBP image" in skipped["a-webp.jpg"]
    assert sum("a-gif.png" in r.getMessage() for r in caplog.records if "skipping" in r.getMessage()) == 1
    batches = _all(loaders.train_batches(0))  # the whole epoch decodes: nothing left that the decoder refuses
    assert sum(len(labels) for _, labels in batches) == loaders.num_train == 8
