"""Download and unpack Caltech-101 safely.

``fetch_caltech101`` downloads the official archive to
``<root>/downloads/<name>.part`` (resuming a partial file with an HTTP Range
request), checks its SHA-256, renames it to ``<root>/downloads/<name>``,
extracts it into a temporary folder -- refusing the whole archive if any
member is an absolute path, climbs out with ``..``, or is a link or a device
-- and renames the result to ``<root>/caltech101``. Until that last rename
nothing looks like a complete data set: an interrupted fetch leaves only the
``.part`` file (resumed next time) or a hidden ``.tmp`` folder (deleted).

The expected checksum of the official archive is NOT known to mxfp16 (no
machine it was built on could download it). Without ``sha256`` the download
is accepted with a warning and its computed checksum is recorded in
``<root>/caltech101/manifest.json``; pass ``sha256`` to enforce one.
"""
import hashlib
import logging
import os
import re
import shutil
import stat
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

from tqdm.auto import tqdm

from ..fileio import write_json
from .validate import DataError

__all__ = ["DATASETS", "download", "safe_extract", "fetch_caltech101", "sha256_of"]

LOG = logging.getLogger("mxfp16.data")

DATASETS = {
    "caltech101": {
        # Caltech's data repository, record mzrjq-6wc02 (CC BY 4.0). The zip holds
        # caltech-101/101_ObjectCategories.tar.gz (131 MB) and the annotations.
        "url": "https://data.caltech.edu/records/mzrjq-6wc02/files/caltech-101.zip?download=1",
        "file": "caltech-101.zip",
        "sha256": None,  # unknown: see the module docstring
        "inner": "101_ObjectCategories.tar.gz",
        "folder": "101_ObjectCategories",
    },
}
CHUNK = 1 << 20


def sha256_of(path):
    """Hex SHA-256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _local_source(url):
    """The local path ``url`` names (a plain path or a ``file://`` URL), else ``None``."""
    parsed = urllib.parse.urlparse(str(url))
    if parsed.scheme == "file":
        return Path(urllib.request.url2pathname(parsed.path))
    if len(parsed.scheme) <= 1:  # a plain path (or a Windows drive letter)
        return Path(url)
    return None


def _copy_with_progress(reader, writer, total, initial, label, progress):
    with tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=label,
              disable=not progress, leave=False) as bar:
        for block in iter(lambda: reader.read(CHUNK), b""):
            writer.write(block)
            bar.update(len(block))


def _fetch_into(url, part, progress, timeout):
    """Complete ``part`` from ``url``, resuming from its current size."""
    have = part.stat().st_size if part.exists() else 0
    local = _local_source(url)
    if local is not None:
        if not local.is_file():
            raise DataError(f"--url {url}: no such file {local}. Give an existing archive or an http(s) mirror.")
        size = local.stat().st_size
        if have > size:
            have = 0
        with open(local, "rb") as reader, open(part, "r+b" if have else "wb") as writer:
            reader.seek(have)
            writer.seek(have)
            writer.truncate()
            _copy_with_progress(reader, writer, size, have, part.name, progress)
        return
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:
            return  # nothing left to send: the partial file is already whole; the checksum decides
        raise DataError(f"downloading {url} failed: HTTP {err.code} {err.reason}. Check the URL or use a mirror "
                        f"(--url); the partial file {part} is kept for resuming.") from None
    except (urllib.error.URLError, OSError) as err:
        raise DataError(f"cannot reach {url} ({err}). Check the network or give a mirror or a local copy with "
                        f"--url; the partial file {part} is kept for resuming.") from None
    with response:
        resumed = response.status == 206
        if have and not resumed:
            LOG.warning("%s ignored the range request; downloading %s from the start", url, part.name)
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        try:
            with open(part, "ab" if resumed else "wb") as writer:
                _copy_with_progress(response, writer, total, have, part.name, progress)
        except OSError as err:
            raise DataError(f"download of {url} interrupted ({err}); run the same command again to resume "
                            f"from {part}.") from None
    if total is not None and part.stat().st_size != total:
        raise DataError(f"download of {url} stopped at {part.stat().st_size} of {total} bytes; run the same command "
                        f"again to resume from {part}.")


def download(url, dest, sha256=None, progress=True, timeout=60):
    """Download ``url`` to ``dest`` via ``dest.part`` (resumable), check SHA-256, rename.

    Parameters
    ----------
    url : str
        http(s) URL, ``file://`` URL or local path.
    dest : str or Path
    sha256 : str, optional
        Expected hex digest; on a mismatch the file is moved to
        ``dest.sha256-mismatch`` (so a retry starts afresh) and ``DataError``
        is raised.
    progress : bool
        Show a tqdm progress bar.
    timeout : float
        Seconds without data before giving up (the ``.part`` is kept).

    Returns
    -------
    (Path, str)
        ``dest`` and its SHA-256.
    """
    if sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
        raise DataError(f"--sha256 {sha256!r}: expected 64 hexadecimal digits (the output of `sha256sum FILE`).")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    bad = dest.with_name(dest.name + ".sha256-mismatch")
    if dest.exists():
        digest = sha256_of(dest)
        if sha256 is None or digest == sha256.lower():
            return dest, digest
        LOG.warning("%s does not match --sha256 (moved to %s); downloading it again", dest, bad)
        os.replace(dest, bad)
    part = dest.with_name(dest.name + ".part")
    _fetch_into(url, part, progress, timeout)
    digest = sha256_of(part)
    if sha256 is not None and digest != sha256.lower():
        os.replace(part, bad)
        raise DataError(f"checksum mismatch for {url}: expected sha256 {sha256.lower()}, got {digest}. The file was "
                        f"moved to {bad} and nothing was extracted. Check --url/--sha256 and run again.")
    os.replace(part, dest)
    return dest, digest


def _member_problem(name, kind):
    """Why an archive member must not be extracted, or ``None``."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        return "absolute path"
    if ".." in path.parts:
        return "path escapes the target folder (..)"
    if kind not in ("file", "dir"):
        return f"{kind} (only regular files and folders are extracted)"
    return None


def _tar_kind(member):
    if member.isfile():
        return "file"
    if member.isdir():
        return "dir"
    return "symbolic link" if member.issym() else "hard link" if member.islnk() else "special file"


def _zip_kind(info):
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        return "symbolic link"
    return "dir" if info.is_dir() else "file"


def safe_extract(archive, target):
    """Extract a zip or tar archive into ``target`` after checking every member.

    Raises
    ------
    DataError
        Naming the first member that is absolute, contains ``..``, or is a
        link or special file; nothing is extracted then.
    """
    archive, target = Path(archive), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            members = [(info.filename, _zip_kind(info)) for info in zf.infolist()]
            _refuse_unsafe(archive, members)
            zf.extractall(target)
        return target
    try:
        with tarfile.open(archive) as tf:
            members = tf.getmembers()
            _refuse_unsafe(archive, [(m.name, _tar_kind(m)) for m in members])
            tf.extractall(target, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    except tarfile.TarError as err:
        raise DataError(f"{archive} is neither a zip nor a readable tar archive ({err}). Delete it and "
                        "download it again.") from None
    return target


def _refuse_unsafe(archive, members):
    for name, kind in members:
        problem = _member_problem(name, kind)
        if problem:
            raise DataError(f"refusing to extract {archive}: member {name!r} is a {problem}. The archive is unsafe "
                            "or not the official one; nothing was extracted. Delete it and fetch from the official "
                            "source or a trusted mirror.")


def _find(root, name, want_dir):
    for path in sorted(root.rglob(name)):
        if path.is_dir() == want_dir and "__MACOSX" not in path.parts:
            return path
    return None


def fetch_caltech101(root="data", url=None, sha256=None, progress=True, timeout=60):
    """Download and unpack Caltech-101 into ``<root>/caltech101/101_ObjectCategories``.

    Parameters
    ----------
    root : str or Path
    url : str, optional
        The official URL by default; a mirror, a local file or a ``file://``
        URL of ``caltech-101.zip`` or of ``101_ObjectCategories.tar.gz``.
    sha256 : str, optional
        Expected SHA-256 of the downloaded file. None is built in (the
        official checksum is unknown here): without it the download is
        accepted with a warning and its checksum recorded.
    progress : bool
    timeout : float

    Returns
    -------
    Path
        ``<root>/caltech101``; already there is reused without downloading.
    """
    spec = DATASETS["caltech101"]
    root = Path(root)
    final = root / "caltech101"
    if (final / "manifest.json").is_file() and (final / spec["folder"]).is_dir():
        LOG.info("%s is already complete", final)
        return final
    if final.exists():
        raise DataError(f"{final} exists but is not a complete fetch (no manifest.json). Delete it and run again.")
    url = url or spec["url"]
    expected = sha256 or spec["sha256"]
    name = Path(urllib.parse.urlparse(str(url)).path).name or spec["file"]
    archive, digest = download(url, root / "downloads" / name, expected, progress, timeout)
    if expected is None:
        LOG.warning("no expected checksum is known for %s, so the download is NOT verified; its sha256 is %s "
                    "(recorded in %s). Pass --sha256 to enforce one.", name, digest, final / "manifest.json")
    tmp = Path(tempfile.mkdtemp(prefix=".caltech101.", suffix=".tmp", dir=root))
    try:
        safe_extract(archive, tmp / "extract")
        inner = _find(tmp / "extract", spec["inner"], want_dir=False)
        if inner is not None:
            safe_extract(inner, tmp / "extract")
        folder = _find(tmp / "extract", spec["folder"], want_dir=True)
        if folder is None:
            raise DataError(f"{archive} holds neither {spec['inner']} nor a {spec['folder']} folder: not a "
                            "Caltech-101 archive. Check --url.")
        (tmp / "final").mkdir()
        os.rename(folder, tmp / "final" / spec["folder"])
        classes = sorted(p.name for p in (tmp / "final" / spec["folder"]).iterdir() if p.is_dir())
        images = sum(1 for p in (tmp / "final" / spec["folder"]).rglob("*") if p.is_file())
        write_json(tmp / "final" / "manifest.json",
                   {"dataset": "caltech101", "url": str(url), "archive": str(archive), "sha256": digest,
                    "sha256_verified": expected is not None, "classes": len(classes), "files": images})
        os.rename(tmp / "final", final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
