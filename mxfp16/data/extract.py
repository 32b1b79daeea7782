"""Extract zip and tar archives without trusting them.

``safe_extract`` refuses, before writing anything, an archive with a member
that is not a regular file or folder, leaves the target folder, or passes
``max_bytes``, ``max_members`` or ``max_ratio`` by its headers; the limits
and their defaults are ``docs/data.md`` ("Extraction limits"). Headers can
lie, so the same limits are enforced again while the bytes are written, and
whatever a failed call wrote is removed again.

Errors are :class:`~mxfp16.data.validate.DataError`; a damaged archive
(bad CRC, truncated stream, a header that is not a header) raises the
subclass :class:`ArchiveDamaged`, so a caller can move the file aside and
download it again.
"""
import bz2
import contextlib
import gzip
import lzma
import math
import os
import re
import stat
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..plumbing.output import temporary_prefix
from .validate import DataError

__all__ = ["ExtractLimits", "ArchiveDamaged", "safe_extract", "archive_problem", "parse_size",
           "DEFAULT_MAX_EXTRACT_BYTES", "DEFAULT_MAX_RATIO", "DEFAULT_MAX_MEMBERS", "ENTRY_OVERHEAD"]

# Caltech-101 extracts to about 290 MB: the 131 MB 101_ObjectCategories.tar.gz
# and the annotations out of caltech-101.zip, then ~140 MB of JPEGs out of the
# tar.gz. 2 GiB leaves about 7x room and still stops a bomb long before it
# fills a disk.
DEFAULT_MAX_EXTRACT_BYTES = 2 * 1024 ** 3
# JPEGs are already compressed: deflate and gzip keep them at about 1:1, and
# plain text reaches 3-10:1. A run of zeros reaches deflate's ceiling of about
# 1030:1 and bzip2 goes far beyond; that is what a decompression bomb is made of.
DEFAULT_MAX_RATIO = 100
# Caltech-101 holds about 9,300 files and folders over both archives; 100,000
# leaves 10x room and stops an archive of countless empty entries, which
# costs inodes and minutes without adding a byte to the declared total.
DEFAULT_MAX_MEMBERS = 100_000
# What one extracted file or folder costs at least, whatever its size (a block and an inode), toward max_bytes.
ENTRY_OVERHEAD = 4096
# Members smaller than this are never refused for their ratio: a few KB of
# zeros (tar padding, an empty annotation) compress 100:1 and harm nobody, and
# the total limit bounds what many small members can do.
RATIO_FLOOR = 1 << 20
# Small blocks keep the measured ratio close to the true one: a decompressor reads about one block ahead.
_BLOCK = 1 << 16
# Reading a damaged archive raises any of these, depending on the layer.
# (zipfile: NotImplementedError for an unknown compression method; bz2:
# OSError for invalid data; writes never get here, see ``_Writer._writing``.)
_DAMAGE = (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, NotImplementedError, OSError)
# Compressed tars by their first bytes; each opener takes an open binary file.
_COMPRESSED_TAR = ((b"\x1f\x8b", lambda raw: gzip.GzipFile(fileobj=raw)), (b"BZh", bz2.BZ2File),
                   (b"\xfd7zXZ\x00", lzma.LZMAFile))


class ArchiveDamaged(DataError):
    """The archive cannot be read to the end: truncated, corrupt or not an archive."""


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE)


def parse_size(text):
    """Bytes from ``'2147483648'``, ``'2G'``, ``'500MB'`` or ``'1.5GiB'`` (powers of 1024); else ``ValueError``."""
    match = _SIZE.fullmatch(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a size; write bytes or a number with K, M, G or T, e.g. 4G")
    value = int(float(match.group(1)) * 1024 ** " KMGT".index(match.group(2).upper() or " "))
    if value < 1:
        raise ValueError(f"{text!r}: a size must be at least 1 byte")
    return value


def _format_size(count):
    """``'1.0 GiB (1073741824 bytes)'``: readable, and exact for comparing with a flag."""
    power = min(4, (max(count, 1).bit_length() - 1) // 10)  # 1024 ** power <= count, up to TiB
    return f"{count / 1024 ** power:.1f} {' KMGT'[power]}iB ({count} bytes)" if power else f"{count} bytes"


@dataclass(frozen=True)
class ExtractLimits:
    """How much an archive may expand to.

    Attributes
    ----------
    max_bytes : int
        The extracted total, over every archive of one fetch, each member counted :data:`ENTRY_OVERHEAD` bytes more.
    max_ratio : float
        Uncompressed over compressed size, per member larger than 1 MiB.
    max_members : int
        Files and folders in one archive.
    """

    max_bytes: int = DEFAULT_MAX_EXTRACT_BYTES
    max_ratio: float = DEFAULT_MAX_RATIO
    max_members: int = DEFAULT_MAX_MEMBERS

    def __post_init__(self):
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes < 1:
            raise DataError(f"--max-extract-bytes {self.max_bytes!r}: need a whole number of bytes, at least 1 "
                            f"(default {_format_size(DEFAULT_MAX_EXTRACT_BYTES)}).")
        if not (isinstance(self.max_ratio, (int, float)) and math.isfinite(self.max_ratio) and self.max_ratio >= 1):
            raise DataError(f"--max-ratio {self.max_ratio!r}: need a finite number of at least 1 "
                            f"(default {DEFAULT_MAX_RATIO}).")
        if isinstance(self.max_members, bool) or not isinstance(self.max_members, int) or self.max_members < 1:
            raise DataError(f"--max-members {self.max_members!r}: need a whole number, at least 1 "
                            f"(default {DEFAULT_MAX_MEMBERS}).")


def _member_problem(name, kind):
    """Why an archive member must not be extracted (a phrase after its name), or ``None``."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        return "is an absolute path"
    if ".." in path.parts:
        return "escapes the target folder (..)"
    if kind == "file" and not [part for part in path.parts if part != "."]:
        return "is a file without a name"
    if kind not in ("file", "dir"):
        article = "an" if kind[0] in "aeiou" else "a"
        return f"is {article} {kind} (only regular files and folders are extracted)"
    return None


def _tar_kind(member):
    if member.issparse():
        return "sparse file"  # its header's size is not what it occupies: holes expand on extraction
    if member.isfile():
        return "file"
    if member.isdir():
        return "dir"
    return "symbolic link" if member.issym() else "hard link" if member.islnk() else "special file"


def _zip_kind(info):
    mode = info.external_attr >> 16
    if info.flag_bits & 0x1:
        return "encrypted file"  # zipfile would stop for a password
    if info.is_dir() or stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_IFMT(mode) in (0, stat.S_IFREG):  # zips made outside Unix carry no file type
        return "file"
    return "special file"


def _refuse_unsafe(archive, members):
    for name, kind in members:
        problem = _member_problem(name, kind)
        if problem:
            raise DataError(f"refusing to extract {archive}: member {name!r} {problem}. The archive is unsafe "
                            "or not the official one; nothing was extracted. Delete it and fetch from the official "
                            "source or a trusted mirror.")


def _too_big(archive, name, declared, total, limits, already):
    earlier = f" ({_format_size(already)} of it extracted from an enclosing archive)" if already else ""
    return DataError(
        f"refusing to extract {archive}: member {name!r} declares {_format_size(declared)}, which brings the "
        f"extracted total to {_format_size(total)}{earlier}, more than the limit of {_format_size(limits.max_bytes)}. "
        "Nothing was extracted. Caltech-101 needs about 300 MB; if you trust this archive, raise "
        "--max-extract-bytes.")


def _too_many(archive, count, limits):
    return DataError(
        f"refusing to extract {archive}: it holds more than {limits.max_members:,} files and folders ({count:,} "
        "counted so far); Caltech-101 holds about 9,300. Nothing was extracted. If you trust this archive, raise "
        "--max-members.")


def _too_compressed(archive, name, size, compressed, limits, when):
    ratio = f"{size / compressed:.0f}:1" if compressed else "out of nothing"
    return DataError(
        f"refusing to extract {archive}: member {name!r} expands from {_format_size(compressed)} to "
        f"{_format_size(size)} ({ratio}), more than the limit of {limits.max_ratio:g}:1; images never compress like "
        f"that, decompression bombs do. {when} If you trust this archive, raise --max-ratio.")


def _ratio_exceeded(size, compressed, limits):
    return size > RATIO_FLOOR and size > limits.max_ratio * compressed


class _Writer:
    """Write the members of one archive under ``target``, counting every byte; undo it all on failure."""

    def __init__(self, archive, target, limits, already):
        self.archive, self.target, self.limits = archive, target, limits
        self.written, self.created = already, []  # created: the files and folders this call made, in order

    @contextlib.contextmanager
    def _writing(self, path):
        """Turn a failed write into a DataError naming ``path`` (a full disk, a member clashing with another)."""
        try:
            yield
        except OSError as err:
            raise DataError(f"cannot write {path} while extracting {self.archive} ({err.strerror or err}); free "
                            "some space or choose another --root, then run again. What was extracted has been "
                            "removed.") from None

    def folder(self, path):
        missing = []
        while not path.exists():
            missing.append(path)
            path = path.parent
        for path in reversed(missing):
            with self._writing(path):
                path.mkdir()
            self.created.append(path)

    def member(self, name, source, declared, consumed):
        """Copy ``source`` to ``target/name``; ``consumed()`` is the compressed bytes read so far for it."""
        path = self.target / name
        self.folder(path.parent)
        with self._writing(path):
            fd, tmp = tempfile.mkstemp(prefix=temporary_prefix(path), suffix=".tmp", dir=path.parent)
        self.created.append(Path(tmp))
        size = 0
        # No fsync: the caller renames the whole extraction into place, and a
        # crash before that discards it.
        with os.fdopen(fd, "wb") as out:
            while True:
                try:
                    block = source.read(_BLOCK)
                except _DAMAGE as err:
                    raise ArchiveDamaged(f"{self.archive} is damaged: member {name!r} cannot be read "
                                         f"({type(err).__name__}: {err}); what was extracted has been "
                                         "removed.") from None
                if not block:
                    break
                size += len(block)
                self._check(name, size, len(block), declared, consumed())
                with self._writing(path):
                    out.write(block)
                self.written += len(block)
        new = not path.exists()
        with self._writing(path):
            os.replace(tmp, path)
        self.created[-1] = path if new else None  # never delete a file that was there before

    def _check(self, name, size, block, declared, compressed):
        """Refuse the block about to be written: ``size`` is the member's bytes including it."""
        stop = "Extraction stopped and what was written has been removed."
        if size > declared:
            raise DataError(f"refusing to extract {self.archive}: member {name!r} holds more data than its header "
                            f"declares ({_format_size(declared)}): the archive is damaged or crafted. {stop} Delete it "
                            "and fetch from the official source or a trusted mirror.")
        if self.written + block > self.limits.max_bytes:
            raise DataError(f"refusing to extract {self.archive}: member {name!r} brings the extracted total past "
                            f"the limit of {_format_size(self.limits.max_bytes)}. {stop} If you trust this archive, "
                            "raise --max-extract-bytes.")
        if _ratio_exceeded(size, compressed, self.limits):
            raise _too_compressed(self.archive, name, size, compressed, self.limits, stop)

    def undo(self):
        for path in reversed(self.created):
            if path is not None:
                with contextlib.suppress(OSError):
                    path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()


def _open_tar(path):
    """``(tarfile, raw file)``: the raw file's position is the compressed bytes read so far."""
    raw = open(path, "rb")
    try:
        head = raw.read(6)
        raw.seek(0)
        stream = next((opener(raw) for magic, opener in _COMPRESSED_TAR if head.startswith(magic)), raw)
        return tarfile.open(fileobj=stream, mode="r:"), raw
    except BaseException:
        raw.close()
        raise


def _scan_tar(archive, limits, already):
    """The tar's members, refused on paths, kinds, declared total or measured ratio before anything is written.

    A header declaring a huge size stops the scan before its data is decompressed.
    """
    tf, raw = _open_tar(archive)
    members, total, previous = [], already, None
    with tf, raw:
        for member in tf:
            position = raw.tell()
            if previous is not None:
                _check_tar_ratio(archive, previous[0], position - previous[1], limits)
            _refuse_unsafe(archive, [(member.name, _tar_kind(member))])
            if len(members) >= limits.max_members:
                raise _too_many(archive, len(members) + 1, limits)
            total += ENTRY_OVERHEAD + (member.size if member.isfile() else 0)
            if total > limits.max_bytes:
                raise _too_big(archive, member.name, member.size, total, limits, already)
            members.append(member)
            previous = (member, position)
        if previous is not None:
            _check_tar_ratio(archive, previous[0], raw.tell() - previous[1], limits)
    return members


def _check_tar_ratio(archive, member, compressed, limits):
    if member.isfile() and _ratio_exceeded(member.size, compressed, limits):
        raise _too_compressed(archive, member.name, member.size, compressed, limits, "Nothing was extracted.")


def _extract_tar(archive, writer, limits):
    members = _scan_tar(archive, limits, writer.written)
    tf, raw = _open_tar(archive)
    with tf, raw:
        for member in members:
            if member.isdir():
                writer.folder(writer.target / member.name)
                continue
            start = raw.tell()  # extractfile reads nothing
            with tf.extractfile(member) as source:
                writer.member(member.name, source, member.size, lambda start=start: raw.tell() - start)


def _check_zip(archive, infos, limits, already):
    """Refuse a zip on its members' paths, kinds, declared total or declared ratios."""
    if len(infos) > limits.max_members:
        raise _too_many(archive, len(infos), limits)
    _refuse_unsafe(archive, [(info.filename, _zip_kind(info)) for info in infos])
    total = already
    for info in infos:
        total += ENTRY_OVERHEAD
        if info.is_dir():
            continue
        total += info.file_size
        if total > limits.max_bytes:
            raise _too_big(archive, info.filename, info.file_size, total, limits, already)
        if _ratio_exceeded(info.file_size, info.compress_size, limits):
            raise _too_compressed(archive, info.filename, info.file_size, info.compress_size, limits,
                                  "Nothing was extracted.")


def _extract_zip(archive, writer, limits):
    with open(archive, "rb") as raw, zipfile.ZipFile(raw) as zf:
        infos = zf.infolist()
        _check_zip(archive, infos, limits, writer.written)
        for info in infos:
            if info.is_dir():
                writer.folder(writer.target / info.filename)
                continue
            with zf.open(info) as source:
                start = raw.tell()  # zipfile reads the member through our file object
                writer.member(info.filename, source, info.file_size, lambda start=start: raw.tell() - start)


def safe_extract(archive, target, limits=None, already=0):
    """Extract a zip or tar archive (plain, gz, bz2 or xz) into ``target`` within ``limits``.

    Parameters
    ----------
    archive, target : str or Path
    limits : ExtractLimits, optional
    already : int
        Bytes already extracted from other archives of the same data set (the outer zip of a zip holding a tar.gz);
        they count toward ``limits.max_bytes``.

    Returns
    -------
    int
        ``already`` plus the bytes this call wrote.

    Raises
    ------
    DataError
        Naming the member that is unsafe, too large or too compressed;
        before anything is written when the headers show it, otherwise
        after removing what was written.
    ArchiveDamaged
        The archive is truncated or corrupt (everything written is removed).
    """
    archive, target = Path(archive), Path(target)
    limits = ExtractLimits() if limits is None else limits
    target.mkdir(parents=True, exist_ok=True)
    writer = _Writer(archive, target, limits, already)
    try:
        (_extract_zip if zipfile.is_zipfile(archive) else _extract_tar)(archive, writer, limits)
    except BaseException as err:  # Ctrl-C too: leave nothing half-extracted
        writer.undo()
        if isinstance(err, _DAMAGE):
            raise ArchiveDamaged(f"{archive} is not a readable zip or tar archive, or is damaged "
                                 f"({type(err).__name__}: {err}); nothing was kept.") from None
        raise
    return writer.written


def archive_problem(path, limits=None):
    """Why ``path`` is not a readable zip or tar archive, or ``None``; writes nothing.

    Every member is read to the end (CRCs of a zip, the whole stream of a compressed tar), within ``limits``: an
    archive that is unsafe or past the limits is not *damaged* and gets ``None``; :func:`safe_extract` refuses it.
    """
    limits = ExtractLimits() if limits is None else limits
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                _check_zip(path, zf.infolist(), limits, 0)
                bad = zf.testzip()
            return None if bad is None else f"damaged (member {bad!r} fails its CRC check)"
        _scan_tar(path, limits, 0)
        return None
    except DataError:
        return None
    except _DAMAGE as err:
        return f"not a readable zip or tar archive ({type(err).__name__}: {err})"
