"""Fetching Caltech-101 from a local HTTP server: resume, checksum, unsafe archives, local files."""
import hashlib
import http.server
import io
import logging
import re
import tarfile
import threading
import zipfile

from mxfp16.data import DataError
from mxfp16.data.fetch import fetch_caltech101, safe_extract

import pytest
from PIL import Image

CLASSES = {"BACKGROUND_Google": 2, "accordion": 3, "airplanes": 2}


def _jpeg(seed):
    buf = io.BytesIO()
    Image.new("RGB", (30, 20), (seed * 40 % 256, 90, 200)).save(buf, format="JPEG")
    return buf.getvalue()


def _tar_gz(members):
    """A gzipped tar of ``{name: bytes}``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _caltech_zip(extra=None):
    """A zip shaped like caltech-101.zip: caltech-101/101_ObjectCategories.tar.gz (+ annotations)."""
    members = {f"101_ObjectCategories/{name}/image_{i:04d}.jpg": _jpeg(i)
               for name, n in CLASSES.items() for i in range(1, n + 1)}
    members.update(extra or {})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("caltech-101/101_ObjectCategories.tar.gz", _tar_gz(members))
        zf.writestr("caltech-101/Annotations.tar", b"annotations")
    return buf.getvalue()


class _Server:
    """Serves ``files`` on 127.0.0.1 with HTTP Range support (416 past the end); records each request's Range."""

    def __init__(self, files):
        self.files, self.ranges, self.sent = files, [], 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = outer.files.get(self.path.split("?")[0])
                if body is None:
                    self.send_error(404)
                    return
                wanted = self.headers.get("Range")
                outer.ranges.append(wanted)
                start = int(wanted.split("=")[1].split("-")[0]) if wanted else 0
                if start >= len(body) > 0:  # as RFC 9110 and real servers: 416, with the full length
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(body)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206 if wanted else 200)
                if wanted:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                self.wfile.write(body[start:])
                outer.sent += len(body) - start

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.timeout = 5
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def server():
    srv = _Server({"/caltech-101.zip": _caltech_zip()})
    yield srv
    srv.close()


def _sha(data):
    return hashlib.sha256(data).hexdigest()


def _images(final):
    return {p.parent.name: len(list(p.parent.glob("*.jpg"))) for p in (final / "101_ObjectCategories").rglob("*.jpg")}


def test_resumed_download_completes_and_verifies(server, tmp_path):
    body = server.files["/caltech-101.zip"]
    part = tmp_path / "downloads" / "caltech-101.zip.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(body[:len(body) // 2])  # an interrupted earlier run
    final = fetch_caltech101(tmp_path, url=f"{server.url}/caltech-101.zip?download=1", sha256=_sha(body),
                             progress=False, timeout=10)
    assert server.ranges == [f"bytes={len(body) // 2}-"]
    assert server.sent == len(body) - len(body) // 2
    assert _images(final) == CLASSES
    assert (tmp_path / "downloads" / "caltech-101.zip").read_bytes() == body and not part.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # Fetching again reuses the complete set without a request.
    assert fetch_caltech101(tmp_path, url=f"{server.url}/caltech-101.zip", progress=False) == final
    assert len(server.ranges) == 1


def test_checksum_mismatch_extracts_nothing(server, tmp_path):
    with pytest.raises(DataError, match="checksum mismatch.*expected sha256 0{64}"):
        fetch_caltech101(tmp_path, url=f"{server.url}/caltech-101.zip", sha256="0" * 64, progress=False, timeout=10)
    assert not (tmp_path / "caltech101").exists()
    assert not (tmp_path / "downloads" / "caltech-101.zip").exists()
    assert (tmp_path / "downloads" / "caltech-101.zip.sha256-mismatch").exists()
    with pytest.raises(DataError, match="64 hexadecimal digits"):
        fetch_caltech101(tmp_path, url=f"{server.url}/caltech-101.zip", sha256="abc", progress=False)


def test_member_escaping_the_target_is_refused(tmp_path):
    archive = tmp_path / "evil.tar.gz"
    archive.write_bytes(_tar_gz({"101_ObjectCategories/a/image_0001.jpg": _jpeg(1), "../escaped.txt": b"x"}))
    root = tmp_path / "root"
    with pytest.raises(DataError, match=r"member '\.\./escaped\.txt'.*escapes"):
        fetch_caltech101(root, url=str(archive), progress=False)
    assert not (root / "caltech101").exists()
    assert not list(tmp_path.rglob("escaped.txt"))
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]


def test_nested_escape_inside_the_zip_is_refused(tmp_path):
    server = _Server({"/caltech-101.zip": _caltech_zip(extra={"../../outside.txt": b"x"})})
    try:
        with pytest.raises(DataError, match="escapes the target"):
            fetch_caltech101(tmp_path / "root", url=f"{server.url}/caltech-101.zip", progress=False, timeout=10)
    finally:
        server.close()
    assert not list(tmp_path.rglob("outside.txt")) and not (tmp_path / "root" / "caltech101").exists()


@pytest.mark.parametrize("kind", ["absolute", "symlink", "hardlink"])
def test_absolute_paths_and_links_are_refused(tmp_path, kind):
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tf:
        info = tarfile.TarInfo("/tmp/abs.txt" if kind == "absolute" else "link")
        if kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        elif kind == "hardlink":
            info.type, info.linkname = tarfile.LNKTYPE, "other"
        else:
            info.size = 1
        tf.addfile(info, io.BytesIO(b"x") if kind == "absolute" else None)
    words = {"absolute": "is an absolute path", "symlink": "is a symbolic link", "hardlink": "is a hard link"}[kind]
    with pytest.raises(DataError, match=f"refusing to extract .*'{info.name}' {words}"):
        safe_extract(archive, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_zip_symlink_is_refused(tmp_path):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("link")
        info.external_attr = (0o120777 << 16)
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(DataError, match="symbolic link"):
        safe_extract(archive, tmp_path / "out")


def test_local_file_without_checksum_warns_and_records_it(tmp_path, caplog):
    body = _caltech_zip()
    archive = tmp_path / "mirror" / "caltech-101.zip"
    archive.parent.mkdir()
    archive.write_bytes(body)
    with caplog.at_level(logging.WARNING, logger="mxfp16.data"):
        final = fetch_caltech101(tmp_path / "root", url=archive.as_uri(), progress=False)
    assert _images(final) == CLASSES
    manifest = (final / "manifest.json").read_text()
    assert _sha(body) in manifest and '"sha256_verified": false' in manifest
    assert any("NOT verified" in r.message and _sha(body) in r.message for r in caplog.records)


def test_unreachable_server_keeps_the_partial_file(tmp_path):
    part = tmp_path / "downloads" / "caltech-101.zip.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"12345")
    srv = _Server({})
    url = f"{srv.url}/caltech-101.zip"
    srv.close()
    with pytest.raises(DataError, match="cannot reach|failed"):
        fetch_caltech101(tmp_path, url=url, progress=False, timeout=5)
    assert part.read_bytes() == b"12345" and not (tmp_path / "caltech101").exists()


def _caltech_zip_with_inner(inner):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("caltech-101/101_ObjectCategories.tar.gz", inner)
    return buf.getvalue()


def _warnings(caplog):
    return " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


@pytest.mark.parametrize("sha256", [False, True])
def test_a_leftover_garbage_part_is_set_aside_and_the_download_restarted(server, tmp_path, caplog, sha256):
    body = server.files["/caltech-101.zip"]
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / "caltech-101.zip.part").write_bytes(b"garbage!" * 10)  # from some other, killed download
    with caplog.at_level(logging.WARNING, logger="mxfp16.data"):
        final = fetch_caltech101(tmp_path, url=f"{server.url}/caltech-101.zip", progress=False, timeout=10,
                                 sha256=_sha(body) if sha256 else None)
    assert _images(final) == CLASSES
    assert server.ranges == ["bytes=80-", None]  # resumed, found bad, then fetched whole
    assert (downloads / "caltech-101.zip").read_bytes() == body
    why = "sha256-mismatch" if sha256 else "damaged"
    aside = downloads / f"caltech-101.zip.{why}"
    assert aside.read_bytes()[:80] == b"garbage!" * 10  # kept for inspection, never reused
    assert "resumed from a partial file of 80 bytes" in _warnings(caplog) and str(aside) in _warnings(caplog)


def test_a_damaged_download_is_never_reused(tmp_path, caplog):
    body = _caltech_zip()
    server = _Server({"/caltech-101.zip": b"<html>Service unavailable</html>"})
    try:
        for _ in range(2):  # the second run downloads again instead of reusing the bad file
            with pytest.raises(DataError, match=r"is not a readable zip or tar archive .*moved to .*caltech-101\.zip"
                                                r"\.damaged and nothing was extracted\. Run the same command again"):
                fetch_caltech101(tmp_path, url=f"{server.url}/caltech-101.zip", progress=False, timeout=10)
        assert server.ranges == [None, None]
        # A complete but damaged file from an earlier run is set aside too, and fetched again.
        (tmp_path / "downloads" / "caltech-101.zip").write_bytes(body[:-100] + bytes(100))
        server.files["/caltech-101.zip"] = body
        with caplog.at_level(logging.WARNING, logger="mxfp16.data"):
            final = fetch_caltech101(tmp_path, url=f"{server.url}/caltech-101.zip", progress=False, timeout=10)
    finally:
        server.close()
    assert _images(final) == CLASSES and server.ranges == [None, None, None]
    assert "caltech-101.zip is not a readable zip or tar archive" in _warnings(caplog)


def test_damage_inside_the_inner_archive_sets_the_download_aside(tmp_path):
    inner = _tar_gz({f"101_ObjectCategories/a/image_{i:04d}.jpg": _jpeg(i) for i in range(1, 30)})
    archive = tmp_path / "mirror" / "caltech-101.zip"
    archive.parent.mkdir()
    archive.write_bytes(_caltech_zip_with_inner(inner[:len(inner) // 2]))  # the zip is fine, its tar.gz truncated
    with pytest.raises(DataError, match=r"101_ObjectCategories\.tar\.gz is not a readable zip or tar archive, or is "
                                        r"damaged .*nothing was kept\. The download was moved to .*caltech-101\.zip"
                                        r"\.damaged; run the same command again"):
        fetch_caltech101(tmp_path / "root", url=str(archive), progress=False)
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["downloads"]
    assert [p.name for p in (tmp_path / "root" / "downloads").iterdir()] == ["caltech-101.zip.damaged"]


def test_a_part_larger_than_the_remote_file_is_set_aside(server, tmp_path, caplog):
    body = server.files["/caltech-101.zip"]
    part = tmp_path / "downloads" / "caltech-101.zip.part"
    part.parent.mkdir()
    part.write_bytes(body + b"tail of another, larger file")
    with caplog.at_level(logging.WARNING, logger="mxfp16.data"):
        final = fetch_caltech101(tmp_path, url=f"{server.url}/caltech-101.zip", progress=False, timeout=10)
    assert _images(final) == CLASSES
    assert server.ranges == [f"bytes={len(body) + 28}-", None]
    assert f"is larger than {server.url}/caltech-101.zip ({len(body)} bytes)" in _warnings(caplog)
    assert (part.parent / "caltech-101.zip.part.too-large").stat().st_size == len(body) + 28
    # The same from a local file.
    local = tmp_path / "mirror.zip"
    local.write_bytes(body)
    part = tmp_path / "other" / "downloads" / "mirror.zip.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(body * 2)
    assert _images(fetch_caltech101(tmp_path / "other", url=str(local), progress=False)) == CLASSES
    assert (part.parent / "mirror.zip.part.too-large").exists()


def test_a_url_naming_a_folder_is_refused(server, tmp_path):
    for url in (f"{server.url}/caltech-101.zip/..", str(tmp_path / "x" / "..")):
        with pytest.raises(DataError, match=rf"--url {re.escape(url)}: the path ends in '\.\.', which names a "
                                            r"folder, not a file.*caltech-101\.zip"):
            fetch_caltech101(tmp_path / "root", url=url, progress=False, timeout=10)
    assert not (tmp_path / "root").exists() and server.ranges == []


@pytest.mark.parametrize("timeout", [-1, 0, float("nan")])
def test_a_bad_timeout_is_refused(server, tmp_path, timeout):
    with pytest.raises(DataError, match=r"--timeout .*: need a positive number of seconds"):
        fetch_caltech101(tmp_path, url=f"{server.url}/caltech-101.zip", progress=False, timeout=timeout)
    assert server.ranges == []


def test_a_404_mentions_a_partial_file_only_when_there_is_one(server, tmp_path):
    with pytest.raises(DataError, match=r"HTTP 404 Not Found\. Check the URL or use a mirror \(--url\)\.$"):
        fetch_caltech101(tmp_path, url=f"{server.url}/missing.zip", progress=False, timeout=10)
    assert not list((tmp_path / "downloads").iterdir())
    (tmp_path / "downloads" / "missing.zip.part").write_bytes(b"12345")
    with pytest.raises(DataError, match=r"HTTP 404 .*the partial file .*missing\.zip\.part \(5 bytes\) is kept"):
        fetch_caltech101(tmp_path, url=f"{server.url}/missing.zip", progress=False, timeout=10)


def test_fetch_errors_reach_the_command_line_without_a_traceback(server, tmp_path, capsys):
    from mxfp16.cli import main

    base = ["data", "fetch", "caltech101", "--root", str(tmp_path), "--no-progress"]
    assert main([*base, "--url", f"{server.url}/caltech-101.zip", "--timeout", "-1"]) == 2
    assert main([*base, "--url", f"{server.url}/a/.."]) == 2
    err = capsys.readouterr().err
    assert "argument --timeout: -1: must be between 0.001 and 604800" in err and "names a folder, not a file" in err
    assert "Traceback" not in err
