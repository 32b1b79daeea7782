"""Atomic writes: a failed write leaves the previous file whole and no debris."""
import json
import os

from mxfp16.plumbing.fileio import append_jsonl, read_jsonl, sha256_file, write_json
from mxfp16.plumbing.output import atomic_path, atomic_write, default_mode

import pytest


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


def test_atomic_files_get_the_permissions_open_would_give(tmp_path):
    import stat

    old = os.umask(0o027)
    try:
        write_json(tmp_path / "a.json", {"x": 1})
        assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640  # not mkstemp's private 0600
        assert default_mode() == 0o640 and default_mode(folder=True) == 0o750
    finally:
        os.umask(old)


def test_sha256_file_reads_in_chunks_and_matches_hashlib(tmp_path):
    import hashlib

    blob = os.urandom(3000)
    (tmp_path / "b").write_bytes(blob)
    assert sha256_file(tmp_path / "b", chunk=1024) == hashlib.sha256(blob).hexdigest()
