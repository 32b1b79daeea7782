"""Download and unpack Caltech-101 safely: the steps, and what each problem does, are ``docs/data.md`` ("Fetch").

The expected checksum of the official archive is NOT known to mxfp16 (no
machine it was built on could download it). Without ``sha256`` the download
is accepted with a warning and its computed checksum is recorded in
``<root>/caltech101/manifest.json``; pass ``sha256`` to enforce one.
"""
import logging
import math
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tqdm.auto import tqdm

from ..plumbing.fileio import sha256_file, write_json
from ..plumbing.output import Output, refusals_as
from .extract import ArchiveDamaged, ExtractLimits, archive_problem, safe_extract
from .layout import IMAGES, caltech101_paths
from .validate import DataError

__all__ = ["DATASETS", "safe_extract", "fetch_caltech101", "ExtractLimits"]

LOG = logging.getLogger("mxfp16.data")

DATASETS = {
    "caltech101": {
        # Caltech's data repository, record mzrjq-6wc02 (CC BY 4.0). The zip holds
        # caltech-101/101_ObjectCategories.tar.gz (131 MB) and the annotations.
        "url": "https://data.caltech.edu/records/mzrjq-6wc02/files/caltech-101.zip?download=1",
        "file": "caltech-101.zip",
        "sha256": None,  # unknown: see the module docstring
        "inner": "101_ObjectCategories.tar.gz",
        "folder": IMAGES,
    },
}
CHUNK = 1 << 20


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


def _set_aside(path, why, name=None):
    """Rename ``path`` to ``<name>.<why>`` beside it (``name``: its own) so it is never reused; return the new path."""
    aside = path.with_name(f"{name or path.name}.{why}")
    os.replace(path, aside)
    return aside


def _kept(part):
    """The end of an error message: what is true about the partial file."""
    if part.exists() and part.stat().st_size:
        return f"; the partial file {part} ({part.stat().st_size} bytes) is kept for resuming"
    return ""


def _remote_size(content_range):
    """The total size from a ``Content-Range: bytes */N`` or ``bytes A-B/N`` header, or ``None``."""
    match = re.fullmatch(r"bytes [^/]*/(\d+)", (content_range or "").strip())
    return int(match.group(1)) if match else None


def _too_large(part, have, size, url):
    aside = _set_aside(part, "too-large")
    LOG.warning("the partial file %s (%d bytes) is larger than %s (%d bytes), so it is not part of this download; "
                "moved it to %s and downloading from the start", part, have, url, size, aside)


def _fetch_into(url, part, progress, timeout):
    """Complete ``part`` from ``url``, resuming from its current size; return the size it resumed from."""
    have = part.stat().st_size if part.exists() else 0
    local = _local_source(url)
    if local is not None:
        if not local.is_file():
            raise DataError(f"--url {url}: no such file {local}. Give an existing archive or an http(s) mirror.")
        size = local.stat().st_size
        if have > size:
            _too_large(part, have, size, url)
            have = 0
        with open(local, "rb") as reader, open(part, "r+b" if have else "wb") as writer:
            reader.seek(have)
            writer.seek(have)
            writer.truncate()
            _copy_with_progress(reader, writer, size, have, part.name, progress)
        return have
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # "Range Not Satisfiable": nothing at or after byte `have`
            size = _remote_size(err.headers.get("Content-Range"))
            if size is not None and have > size:
                _too_large(part, have, size, url)
                return _fetch_into(url, part, progress, timeout)
            return have  # the partial file looks whole; the checks decide
        raise DataError(f"downloading {url} failed: HTTP {err.code} {err.reason}. Check the URL or use a mirror "
                        f"(--url){_kept(part)}.") from None
    except (urllib.error.URLError, OSError) as err:
        raise DataError(f"cannot reach {url} ({err}). Check the network or give a mirror or a local copy with "
                        f"--url{_kept(part)}.") from None
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
    return have


def _verify(path, sha256, limits):
    """``(digest, None)`` when ``path`` passes, else ``(digest, (suffix, what is wrong))``.

    With ``sha256`` the checksum decides; without, the file must at least be a
    readable zip or tar archive (read to the end within ``limits``).
    """
    digest = sha256_file(path)
    if sha256 is not None:
        if digest != sha256.lower():
            return digest, ("sha256-mismatch", f"does not match --sha256 (expected {sha256.lower()}, got {digest})")
        return digest, None
    problem = archive_problem(path, limits)
    return digest, (None if problem is None else ("damaged", f"is {problem}"))


def _download(url, dest, sha256, progress, timeout, limits):
    """Download ``url`` to ``dest`` via ``dest.part`` (resumable), check it, rename; return ``(dest, sha256)``."""
    if sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
        raise DataError(f"--sha256 {sha256!r}: expected 64 hexadecimal digits (the output of `sha256sum FILE`).")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
            or timeout <= 0:
        raise DataError(f"--timeout {timeout}: need a positive number of seconds without data before giving up, "
                        "e.g. 60 (the default).")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        digest, problem = _verify(dest, sha256, limits)
        if problem is None:
            return dest, digest
        LOG.warning("%s %s (moved to %s); downloading it again", dest, problem[1], _set_aside(dest, problem[0]))
    part = dest.with_name(dest.name + ".part")
    resumed = _fetch_into(url, part, progress, timeout)
    digest, problem = _verify(part, sha256, limits)
    if problem is not None and resumed:
        aside = _set_aside(part, problem[0], dest.name)
        LOG.warning("the download of %s was resumed from a partial file of %d bytes left by an earlier run, and the "
                    "result %s: that partial file was not the start of this file. Moved it to %s; downloading from "
                    "the start.", url, resumed, problem[1], aside)
        _fetch_into(url, part, progress, timeout)
        digest, problem = _verify(part, sha256, limits)
    if problem is not None:
        aside = _set_aside(part, problem[0], dest.name)
        if sha256 is not None:
            raise DataError(f"checksum mismatch for {url}: expected sha256 {sha256.lower()}, got {digest}. The file "
                            f"was moved to {aside} and nothing was extracted. Check --url/--sha256 and run again.")
        raise DataError(f"the download of {url} {problem[1]}. It was moved to {aside} and nothing was extracted. "
                        "Run the same command again to download it afresh; if that fails too, --url does not give a "
                        "good copy of caltech-101.zip or 101_ObjectCategories.tar.gz.")
    os.replace(part, dest)
    return dest, digest


def _find(root, name, want_dir):
    for path in sorted(root.rglob(name)):
        if path.is_dir() == want_dir and "__MACOSX" not in path.parts:
            return path
    return None


def _download_name(url, default):
    """The file name ``url`` names (``default`` when its path ends in ``/``); refuse one that names no file."""
    name = Path(urllib.parse.urlparse(str(url)).path).name
    if name == "..":
        raise DataError(f"--url {url}: the path ends in '..', which names a folder, not a file. Give the archive's "
                        f"own URL or path, e.g. .../{default}.")
    return name or default


def fetch_caltech101(root="data", url=None, sha256=None, progress=True, timeout=60, limits=None):
    """Download and unpack Caltech-101 into ``<root>/caltech101/101_ObjectCategories``.

    A problem raises a :class:`DataError` naming it and the fix (``docs/data.md``, "Fetch").

    Parameters
    ----------
    root : str or Path
    url : str, optional
        The official URL by default; a mirror, a local file or a ``file://``
        URL of ``caltech-101.zip`` or of ``101_ObjectCategories.tar.gz``.
    sha256 : str, optional
        Expected SHA-256 of the downloaded file (none is built in: see the module docstring).
    progress : bool
    timeout : float
    limits : ExtractLimits, optional
        Over the zip and the tar.gz inside it (``docs/data.md``, "Extraction limits").

    Returns
    -------
    Path
        ``<root>/caltech101``, reused when complete; not a split yet
        (:func:`~mxfp16.data.layout.caltech101_commands`: the steps after it).
    """
    spec = DATASETS["caltech101"]
    final = caltech101_paths(Path(root)).fetched
    output = Output(final, "fetching Caltech-101", flag="--root",
                    reuse=lambda folder: (folder / "manifest.json").is_file() and (folder / spec["folder"]).is_dir(),
                    refusal="it is not a complete fetch (no manifest.json). Delete it and run again")
    with refusals_as(DataError), output:
        if output.reused:
            LOG.info("%s is already complete", final)
        else:
            _fetch(output, Path(root), spec, (url, sha256, progress, timeout, limits))
    return final


def _fetch(output, root, spec, request):
    """Download, check, extract into a staging folder and publish, once ``<root>/caltech101`` is locked."""
    url, sha256, progress, timeout, limits = request
    final = output.path
    url = url or spec["url"]
    expected = sha256 or spec["sha256"]
    name = _download_name(url, spec["file"])
    archive, digest = _download(url, root / "downloads" / name, expected, progress, timeout, limits)
    if expected is None:
        LOG.warning("no expected checksum is known for %s, so the download is NOT verified; its sha256 is %s "
                    "(recorded in %s). Pass --sha256 to enforce one.", name, digest, final / "manifest.json")
    extracted, staged = output.stage() / "extract", output.stage()
    try:
        written = safe_extract(archive, extracted, limits)
        inner = _find(extracted, spec["inner"], want_dir=False)
        if inner is not None:
            safe_extract(inner, extracted, limits, already=written)
    except ArchiveDamaged as err:
        aside = _set_aside(archive, "damaged")
        raise DataError(f"{err} The download was moved to {aside}; run the same command again to download it "
                        "afresh (if this happens again, the source itself is damaged: check --url).") from None
    folder = _find(extracted, spec["folder"], want_dir=True)
    if folder is None:
        raise DataError(f"{archive} holds neither {spec['inner']} nor a {spec['folder']} folder: not a "
                        "Caltech-101 archive. Check --url.")
    os.rename(folder, staged / spec["folder"])
    classes = sorted(p.name for p in (staged / spec["folder"]).iterdir() if p.is_dir())
    images = sum(1 for p in (staged / spec["folder"]).rglob("*") if p.is_file())
    write_json(staged / "manifest.json",
               {"dataset": "caltech101", "url": str(url), "archive": str(archive), "sha256": digest,
                "sha256_verified": expected is not None, "classes": len(classes), "files": images})
    output.publish(staged)
