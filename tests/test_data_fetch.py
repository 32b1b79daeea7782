"""Fetching Caltech-101 from a local HTTP server: resume, checksum, unsafe archives, local files."""
import hashlib
import http.server
import io
import logging
import tarfile
import threading
import zipfile

import pytest
from PIL import Image

from mxfp16.data import DataError
from mxfp16.data.fetch import fetch_caltech101, safe_extract

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
    """Serves ``files`` on 127.0.0.1 with HTTP Range support; records each request's Range header."""

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
    with pytest.raises(DataError, match="refusing to extract"):
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
