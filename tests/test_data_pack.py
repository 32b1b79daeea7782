"""RecordIO: pack a folder split, read it back directly and through the recordio pipeline."""
import json

from mxfp16.data import DataError, make_loaders, synth_dataset
from mxfp16.data.pack import pack_recordio

import cv2
import mxnet as mx
import numpy as np
import pytest

SIZE = 32


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("pack")
    src = synth_dataset(root / "src", classes=3, per_class=7, test_per_class=3, size=48)
    (src / "train" / "bar" / "junk.jpg").write_bytes(b"junk")  # skipped by the scan, recorded in the pack
    meta = pack_recordio(src, root / "out" / "tiny", quality=95)
    return src, root / "out" / "tiny", meta


def test_files_and_metadata(packed):
    src, prefix, meta = packed
    for split in ("train", "test"):
        for ext in ("rec", "idx", "lst"):
            assert prefix.with_name(f"tiny_{split}.{ext}").is_file()
    on_disk = json.loads(prefix.with_name("tiny_classes.json").read_text())
    assert on_disk == meta
    assert meta["classes"] == ["bar", "circle", "crescent"] and meta["counts"] == {"train": 21, "test": 9}
    assert [p.split("/")[-1] for p, _ in meta["skipped"]] == ["junk.jpg"]
    assert not list(prefix.parent.glob(".*.tmp"))


def test_records_round_trip_labels_and_pixels(packed):
    src, prefix, meta = packed
    record = mx.recordio.MXIndexedRecordIO(str(prefix) + "_test.idx", str(prefix) + "_test.rec", "r")
    lines = [line.split("\t") for line in prefix.with_name("tiny_test.lst").read_text().splitlines()]
    assert len(lines) == len(record.keys) == 9
    for index, label, rel in lines:
        header, jpeg = mx.recordio.unpack(record.read_idx(int(index)))
        assert header.label == float(label) == meta["classes"].index(rel.split("/")[1])
        decoded = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        # Independent reference: the source file decoded and re-encoded at quality 95 by hand.
        original = cv2.imread(str(src / rel))
        _, buf = cv2.imencode(".jpg", original, [cv2.IMWRITE_JPEG_QUALITY, 95])
        assert np.array_equal(decoded, cv2.imdecode(buf, cv2.IMREAD_COLOR))
        assert np.abs(decoded.astype(np.float64) - original).mean() < 10
    record.close()


def test_pack_resizes_the_short_side(packed, tmp_path):
    src, _, _ = packed
    pack_recordio(src, tmp_path / "small", resize=20)
    record = mx.recordio.MXIndexedRecordIO(str(tmp_path / "small_train.idx"), str(tmp_path / "small_train.rec"), "r")
    for key in record.keys:
        _, img = mx.recordio.unpack_img(record.read_idx(key))
        assert min(img.shape[:2]) == 20
    record.close()


def test_recordio_pipeline_matches_the_folder_pipeline(packed):
    src, prefix, _ = packed
    rec = make_loaders(prefix, image_size=SIZE, batch_size=4, pipeline="recordio")
    folder = make_loaders(src, image_size=SIZE, batch_size=4)
    assert (rec.classes, rec.num_train, rec.num_test) == (folder.classes, folder.num_train, folder.num_test)
    rec_test = [(d.asnumpy(), l.asnumpy()) for d, l in rec.test_batches()]
    folder_test = [(d.asnumpy(), l.asnumpy()) for d, l in folder.test_batches()]
    assert [len(l) for _, l in rec_test] == [4, 4, 1]  # ImageRecordIter's padding stripped
    assert np.array_equal(np.concatenate([l for _, l in rec_test]), np.concatenate([l for _, l in folder_test]))
    a, b = np.concatenate([d for d, _ in rec_test]), np.concatenate([d for d, _ in folder_test])
    assert a.dtype == np.float32 and a.shape == b.shape
    assert np.abs(a - b).mean() < 0.1  # same normalisation; JPEG re-encoding and resize kernels differ slightly
    train = [(d.asnumpy(), l.asnumpy()) for d, l in rec.train_batches(0)]
    assert sum(len(l) for _, l in train) == 21 and len(train) == rec.train_batches_per_epoch
    assert all(d.shape[1:] == (3, SIZE, SIZE) and l.dtype == np.float32 for d, l in train)
    assert np.bincount(np.concatenate([l for _, l in train]).astype(int)).tolist() == [7, 7, 7]


def test_recordio_order_seeded_by_epoch_and_resumable(packed):
    _, prefix, _ = packed
    loaders = make_loaders(prefix, image_size=SIZE, batch_size=4, pipeline="recordio", seed=2)
    first = [(d.asnumpy(), l.asnumpy()) for d, l in loaders.train_batches(3)]
    again = [(d.asnumpy(), l.asnumpy()) for d, l in loaders.train_batches(3)]
    resumed = [(d.asnumpy(), l.asnumpy()) for d, l in loaders.train_batches(3, start_batch=2)]
    assert all(np.array_equal(x, y) and np.array_equal(p, q) for (x, p), (y, q) in zip(first, again))
    assert all(np.array_equal(x, y) and np.array_equal(p, q) for (x, p), (y, q) in zip(first[2:], resumed))
    assert len(resumed) == len(first) - 2


def test_recordio_shards_run_the_same_number_of_steps(packed):
    _, prefix, _ = packed
    shards = [make_loaders(prefix, image_size=SIZE, batch_size=2, pipeline="recordio", shard=(r, 4)) for r in range(4)]
    # ImageRecordIter parts: ceil(21 / 4) = 6 records each, the last 3; every worker stops at 3.
    assert {s.num_train for s in shards} == {3}
    counts = [sum(len(l) for _, l in s.train_batches(0)) for s in shards]
    assert counts == [3, 3, 3, 3]


def test_incomplete_pack_is_refused(packed, tmp_path):
    with pytest.raises(DataError, match="not a complete pack.*mxfp16 data pack"):
        make_loaders(tmp_path / "none", pipeline="recordio")


def test_truncated_record_file_is_refused_before_reading(packed, tmp_path):
    import shutil

    _, prefix, _ = packed
    for path in prefix.parent.glob("tiny_*"):
        shutil.copy(path, tmp_path / path.name)
    rec = tmp_path / "tiny_train.rec"
    rec.write_bytes(rec.read_bytes()[: rec.stat().st_size // 2])
    with pytest.raises(DataError, match=r"tiny_train.rec has damaged records \(record \d+ at byte \d+: it claims"):
        make_loaders(tmp_path / "tiny", pipeline="recordio")


@pytest.mark.parametrize("damage", ["overwritten", "jpeg cut", "idx off by one"])
def test_a_damaged_record_is_refused_with_its_index_and_offset(packed, tmp_path, damage):
    """Damage inside the .rec (not a truncation): ImageRecordIter would abort the process on it."""
    import shutil

    from mxfp16.data.records import damaged_records, read_index

    _, prefix, _ = packed
    for path in prefix.parent.glob("tiny_*"):
        shutil.copy(path, tmp_path / path.name)
    rec, idx = tmp_path / "tiny_train.rec", tmp_path / "tiny_train.idx"
    entries = read_index(idx)
    key, offset = entries[3]
    data = bytearray(rec.read_bytes())
    if damage == "overwritten":
        data[offset:offset + 4] = b"\x00\x00\x00\x00"  # the record's magic number
    elif damage == "jpeg cut":
        length = int.from_bytes(data[offset + 4:offset + 8], "little") & ((1 << 29) - 1)
        data[offset + 8 + length - 2:offset + 8 + length] = b"\x00\x00"  # its end-of-image marker
    else:
        lines = idx.read_text().splitlines()
        lines[3] = f"{key}\t{offset + 1}"
        idx.write_text("\n".join(lines) + "\n")
    rec.write_bytes(bytes(data))
    assert damaged_records(rec, idx)[0][:2] == (key, offset + (damage == "idx off by one"))
    with pytest.raises(DataError, match=fr"record {key} at byte {offset + (damage == 'idx off by one')}: .*re-run"):
        make_loaders(tmp_path / "tiny", pipeline="recordio")


# ---- issue 42, case 8: damage inside a record, which the frame checks cannot see ---------------------
def _copy_pack(packed, folder):
    import shutil

    _, prefix, _ = packed
    for path in prefix.parent.glob("tiny_*"):
        shutil.copy(path, folder / path.name)
    return folder / "tiny"


def test_every_record_carries_the_crc32_of_the_rest(packed):
    import struct
    import zlib

    _, prefix, meta = packed
    assert meta["record_checksum"] == "crc32-in-id2"
    record = mx.recordio.MXIndexedRecordIO(str(prefix) + "_train.idx", str(prefix) + "_train.rec", "r")
    for key in record.keys:
        header, jpeg = mx.recordio.unpack(record.read_idx(key))
        # Independently of mxfp16: zlib over the header's flag, label (float32) and id, then the JPEG.
        assert header.id2 == zlib.crc32(struct.pack("<IfQ", 0, header.label, header.id) + jpeg)
    record.close()


@pytest.mark.parametrize("where", ["inside the JPEG", "the label"])
def test_bytes_overwritten_inside_a_record_are_refused(packed, tmp_path, where):
    from mxfp16.data.records import damaged_records, read_index

    prefix = _copy_pack(packed, tmp_path)
    rec, idx = tmp_path / "tiny_train.rec", tmp_path / "tiny_train.idx"
    key, offset = read_index(idx)[3]
    data = bytearray(rec.read_bytes())
    length = int.from_bytes(data[offset + 4:offset + 8], "little") & ((1 << 29) - 1)
    if where == "inside the JPEG":
        middle = offset + 8 + 24 + length // 2
        data[middle:middle + 16] = bytes(range(16))  # 16 bytes of entropy-coded data: the frame is intact
    else:
        data[offset + 12:offset + 16] = np.float32(2.0).tobytes()  # another class, a valid float
    rec.write_bytes(bytes(data))
    assert damaged_records(rec, idx) == []  # what the frame checks alone see
    with pytest.raises(DataError, match=fr"record {key} at byte {offset}: its bytes changed since it was packed"):
        make_loaders(prefix, pipeline="recordio", batch_size=8)


def test_a_pack_without_checksums_is_used_with_a_warning(packed, tmp_path, caplog):
    prefix = _copy_pack(packed, tmp_path)
    classes = tmp_path / "tiny_classes.json"
    meta = json.loads(classes.read_text())
    del meta["record_checksum"]  # what an older mxfp16 wrote
    classes.write_text(json.dumps(meta))
    with caplog.at_level("WARNING", logger="mxfp16.data"):
        assert make_loaders(prefix, pipeline="recordio", batch_size=8).num_train == 21
    assert "carry no checksum" in caplog.text and "mxfp16 data pack" in caplog.text
    meta["record_checksum"] = "md5-somewhere"
    classes.write_text(json.dumps(meta))
    with pytest.raises(DataError, match="names record checksums 'md5-somewhere'"):
        make_loaders(prefix, pipeline="recordio")
