"""Atomic writes: a failed write leaves the previous file whole and no debris."""
import json

import pytest

from mxfp16.fileio import append_jsonl, atomic_path, atomic_write, read_jsonl, write_json


def test_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "summary.json"
    write_json(target, {"epoch": 1})
    with pytest.raises(RuntimeError):
        with atomic_write(target) as handle:
            handle.write('{"epoch": 2, "half')
            raise RuntimeError("interrupted mid-write")
    assert json.loads(target.read_text()) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_atomic_path_for_writers_that_want_a_filename(tmp_path):
    target = tmp_path / "sub" / "model.params"
    with atomic_path(target) as tmp:
        assert not target.exists()
        with open(tmp, "wb") as handle:
            handle.write(b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            open(tmp, "wb").close()
            raise KeyboardInterrupt
    assert target.read_bytes() == b"\x00\x01" and len(list(target.parent.iterdir())) == 1


def test_jsonl_appends_whole_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert read_jsonl(path) == []
    for epoch in (1, 2, 3):
        append_jsonl(path, {"epoch": epoch, "val_top1": epoch / 10})
    assert [r["epoch"] for r in read_jsonl(path)] == [1, 2, 3]
    assert path.read_text().count("\n") == 3
