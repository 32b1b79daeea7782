"""Extraction limits: zip bombs, a tar.gz bomb inside a zip, headers that lie, and the defaults Caltech-101 needs."""
import io
import os
import struct
import tarfile
import zipfile

from mxfp16.cli import main
from mxfp16.data import DataError
from mxfp16.data.extract import ArchiveDamaged, ExtractLimits, parse_size, safe_extract
from mxfp16.data.fetch import fetch_caltech101

import pytest
from test_data_fetch import CLASSES, _caltech_zip, _images, _jpeg

MiB = 1 << 20
GiB = 1 << 30


def _files(folder):
    """Every file under ``folder`` (hidden temporaries included)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


def _disk_use(folder):
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _declare_size(zip_bytes, name, size):
    """``zip_bytes`` with the central directory claiming ``size`` uncompressed bytes for member ``name``.

    zipfile takes sizes from the central directory: offset 24 of an entry is
    the uncompressed size, 28 the name's length, 46 the name.
    """
    data = bytearray(zip_bytes)
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        length, = struct.unpack_from("<H", data, at + 28)
        if data[at + 46:at + 46 + length] == name.encode():
            struct.pack_into("<I", data, at + 24, size)
            return bytes(data)
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(f"{name} not in the central directory")


def _tar(members, mode="w:gz"):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zip(members, compression=zipfile.ZIP_STORED):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.fixture(scope="module")
def gigabyte_of_zeros(tmp_path_factory):
    """A 4.5 MB zip holding 1 GiB of zeros, streamed in 1 MiB blocks: nothing here holds or writes 1 GiB."""
    path = tmp_path_factory.mktemp("bomb") / "caltech-101.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        with zf.open("caltech-101/101_ObjectCategories/faces/image_0001.jpg", "w") as out:
            block = bytes(MiB)
            for _ in range(1024):
                out.write(block)
    assert path.stat().st_size < 8 * MiB
    return path


def test_a_zip_of_a_gigabyte_of_zeros_is_refused_before_anything_is_written(gigabyte_of_zeros, tmp_path):
    with pytest.raises(DataError, match=r"member 'caltech-101/101_ObjectCategories/faces/image_0001\.jpg' expands "
                                        r"from 4\.\d MiB .* to 1\.0 GiB \(1073741824 bytes\) .*limit of 100:1.*"
                                        r"Nothing was extracted.*raise --max-ratio"):
        safe_extract(gigabyte_of_zeros, tmp_path / "out")
    assert _files(tmp_path / "out") == []
    # The whole command: no data set, no temporary folder, the disk untouched.
    root = tmp_path / "root"
    with pytest.raises(DataError, match="--max-ratio"):
        fetch_caltech101(root, url=str(gigabyte_of_zeros), progress=False)
    assert _files(root) == ["downloads/caltech-101.zip"]
    assert _disk_use(root) == gigabyte_of_zeros.stat().st_size


def test_a_header_declaring_a_bomb_sized_member_is_refused_before_writing(tmp_path):
    archive = tmp_path / "a.zip"
    archive.write_bytes(_declare_size(_zip({"small.jpg": _jpeg(1), "huge.jpg": _jpeg(2)}), "huge.jpg", 3 * GiB))
    with pytest.raises(DataError, match=r"member 'huge\.jpg' declares 3\.0 GiB \(3221225472 bytes\), which brings "
                                        r"the extracted total to 3\.0 GiB .* limit of 2\.0 GiB \(2147483648 bytes\)"
                                        r".*Nothing was extracted.*raise --max-extract-bytes"):
        safe_extract(archive, tmp_path / "out")
    assert _files(tmp_path / "out") == []


def test_a_zip_holding_a_tar_gz_holding_an_oversized_jpg_is_refused(tmp_path):
    archive = tmp_path / "caltech-101.zip"
    archive.write_bytes(_caltech_zip(extra={"101_ObjectCategories/accordion/image_9999.jpg": bytes(64 * MiB)}))
    assert archive.stat().st_size < MiB
    root = tmp_path / "root"
    with pytest.raises(DataError, match=r"101_ObjectCategories\.tar\.gz: member '101_ObjectCategories/accordion/"
                                        r"image_9999\.jpg' expands from .* to 64\.0 MiB .*raise --max-ratio"):
        fetch_caltech101(root, url=str(archive), progress=False)
    assert _files(root) == ["downloads/caltech-101.zip"]  # no data set, no temporary folder


def test_the_total_counts_the_outer_zip_and_the_tar_gz_inside_it(tmp_path):
    # Random bytes do not compress: only the total can stop them.
    noise = os.urandom(3 * MiB)
    archive = tmp_path / "caltech-101.zip"
    archive.write_bytes(_caltech_zip(extra={"101_ObjectCategories/accordion/image_9999.jpg": noise}))
    root = tmp_path / "root"
    with pytest.raises(DataError, match=r"member '101_ObjectCategories/accordion/image_9999\.jpg' declares 3\.0 MiB"
                                        r".*\(3\.0 MiB .* of it extracted from an enclosing archive\), more than "
                                        r"the limit of 4\.0 MiB.*--max-extract-bytes"):
        fetch_caltech101(root, url=str(archive), progress=False, limits=ExtractLimits(max_bytes=4 * MiB))
    assert _files(root) == ["downloads/caltech-101.zip"]
    # The flag raises the limit: the same archive is accepted with room.
    final = fetch_caltech101(root, url=str(archive), progress=False, limits=ExtractLimits(max_bytes=8 * MiB))
    assert _images(final) == dict(CLASSES, accordion=CLASSES["accordion"] + 1)


def test_a_member_whose_header_under_reports_its_size_is_refused_while_writing(tmp_path):
    body = _zip({"a/first.jpg": _jpeg(1), "a/liar.jpg": os.urandom(MiB)})
    archive = tmp_path / "caltech-101.zip"
    archive.write_bytes(_declare_size(body, "a/liar.jpg", 1000))
    with pytest.raises(ArchiveDamaged, match=r"is damaged: member 'a/liar\.jpg' cannot be read \(BadZipFile: Bad "
                                             r"CRC-32.*what was extracted has been removed"):
        safe_extract(archive, tmp_path / "out")
    assert _files(tmp_path / "out") == []  # a/first.jpg was written, then removed with its folder
    # Through the command, the check after the download finds it, and moves the file aside so the next run
    # fetches it afresh.
    root = tmp_path / "root"
    with pytest.raises(DataError, match=r"is damaged \(member 'a/liar\.jpg' fails its CRC check\)\. It was moved to "
                                        r".*caltech-101\.zip\.damaged and nothing was extracted\. "
                                        r"Run the same command"):
        fetch_caltech101(root, url=str(archive), progress=False)
    assert _files(root) == ["downloads/caltech-101.zip.damaged"]


def test_bytes_are_counted_as_they_are_written_whatever_the_reader_returns(tmp_path, monkeypatch):
    """A reader that returns more than the header declares is stopped at the header's size."""
    archive = tmp_path / "a.zip"
    archive.write_bytes(_zip({"x/small.jpg": b"x" * 1000}))
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, info: io.BytesIO(os.urandom(4 * MiB)))
    with pytest.raises(DataError, match=r"member 'x/small\.jpg' holds more data than its header declares \(1000 "
                                        r"bytes\).*what was written has been removed"):
        safe_extract(archive, tmp_path / "out")
    assert _files(tmp_path / "out") == []


@pytest.mark.parametrize("mode", ["w:gz", "w:bz2", "w:xz"])
def test_compressed_tar_bombs_are_refused_from_their_headers(tmp_path, mode):
    archive = tmp_path / "a.tar"
    archive.write_bytes(_tar({"ok.jpg": _jpeg(1), "bomb.jpg": bytes(16 * MiB), "after.jpg": _jpeg(2)}, mode))
    with pytest.raises(DataError, match=r"member 'bomb\.jpg' expands from .* to 16\.0 MiB .*Nothing was extracted"):
        safe_extract(archive, tmp_path / "out")
    assert _files(tmp_path / "out") == []


def test_the_defaults_accept_what_a_data_set_holds(tmp_path):
    # JPEG-like (incompressible) members of several MiB, text that compresses 5-10:1, and small runs of zeros
    # (ratio 1000:1 but below the 1 MiB floor) all pass.
    text = b"".join(b"%d,%d,%d,%d\n" % (i, i * 7 % 300, i * 13 % 200, i % 101) for i in range(200000))
    members = {"d/big.jpg": os.urandom(3 * MiB), "d/boxes.csv": text, "d/zeros.pad": bytes(512 * 1024)}
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(_tar(members))
    safe_extract(archive, tmp_path / "out")
    assert {name: (tmp_path / "out" / name).read_bytes() for name in members} == members
    assert _files(tmp_path / "out") == sorted(members)  # no temporary file left beside them


def test_special_files_in_a_zip_are_refused(tmp_path):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("pipe.jpg")
        info.external_attr = 0o010644 << 16  # a FIFO
        zf.writestr(info, b"")
    with pytest.raises(DataError, match="member 'pipe.jpg' is a special file"):
        safe_extract(archive, tmp_path / "out")


def test_limits_are_checked_and_sizes_parsed():
    with pytest.raises(DataError, match=r"--max-extract-bytes 0: .*default 2\.0 GiB"):
        ExtractLimits(max_bytes=0)
    for bad in (0.5, float("nan"), float("inf")):
        with pytest.raises(DataError, match="--max-ratio .*at least 1"):
            ExtractLimits(max_ratio=bad)
    assert [parse_size(t) for t in ("2147483648", "2G", "2GiB", "500MB", "1.5k")] == [2 * GiB, 2 * GiB, 2 * GiB,
                                                                                     500 * MiB, 1536]
    for bad in ("", "2X", "-1", "0"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_the_command_takes_the_limits(tmp_path, capsys):
    archive = tmp_path / "caltech-101.zip"
    archive.write_bytes(_caltech_zip(extra={"101_ObjectCategories/accordion/big.jpg": os.urandom(2 * MiB)}))
    base = ["data", "fetch", "caltech101", "--url", str(archive), "--no-progress"]
    assert main([*base, "--root", str(tmp_path / "a"), "--max-extract-bytes", "3M"]) == 2
    err = capsys.readouterr().err
    assert "mxfp16 data: error: refusing to extract" in err and "--max-extract-bytes" in err and "Traceback" not in err
    assert main([*base, "--root", str(tmp_path / "b"), "--max-extract-bytes", "6M", "--max-ratio", "2"]) == 0
    assert main([*base, "--root", str(tmp_path / "c"), "--max-ratio", "0"]) == 2
    assert "argument --max-ratio: 0: must be between 1 and 1e+06" in capsys.readouterr().err


def test_an_archive_of_countless_empty_entries_is_refused_before_writing(tmp_path):
    """200,000 empty members declare 0 bytes; the count, and each member's file-system cost, refuse them."""
    import time

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        for i in range(200_000):
            zf.writestr(f"d/{i}", b"")
    archive = tmp_path / "many.zip"
    archive.write_bytes(buffer.getvalue())
    target = tmp_path / "out"
    start = time.monotonic()
    with pytest.raises(DataError, match=r"more than 100,000 files and folders \(200,000 counted.*--max-members"):
        safe_extract(archive, target)
    assert time.monotonic() - start < 10  # refused from the central directory, not after extracting
    assert not target.exists() or not any(target.iterdir())
    # Under the count, each member still costs ENTRY_OVERHEAD bytes toward the total.
    from mxfp16.data.extract import ENTRY_OVERHEAD

    with pytest.raises(DataError, match="more than the limit"):
        safe_extract(archive, target, ExtractLimits(max_bytes=100_000 * ENTRY_OVERHEAD, max_members=300_000))
    assert not any(target.iterdir())


def test_a_tar_of_countless_entries_is_refused_while_its_headers_are_read(tmp_path):
    archive = tmp_path / "many.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for i in range(150):
            info = tarfile.TarInfo(f"d/{i}")
            tf.addfile(info, io.BytesIO(b""))
    with pytest.raises(DataError, match=r"more than 100 files and folders \(101 counted"):
        safe_extract(archive, tmp_path / "out", ExtractLimits(max_members=100))
    assert safe_extract(archive, tmp_path / "ok", ExtractLimits(max_members=150)) == 0
