"""Atomic writes: a file is either the old version or the complete new one.

Checkpoints, results and downloads are written to a temporary file in the
same folder, flushed to disk, then renamed over the target (``os.replace`` is
atomic on POSIX and Windows). A crash or Ctrl-C mid-write leaves the previous
file intact and at most a stray ``.tmp`` file.
"""
import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "atomic_path", "write_json", "append_jsonl", "read_jsonl", "sha256_file", "default_mode"]


def default_mode(folder=False):
    """The permissions ``open()`` (or ``mkdir``) gives a new file (folder) under this process's umask."""
    umask = os.umask(0)  # the only way to read it is to set it
    os.umask(umask)
    return (0o777 if folder else 0o666) & ~umask


@contextlib.contextmanager
def atomic_write(path, mode="w", encoding="utf-8"):
    """Open a temporary file beside ``path``; on success rename it over ``path``.

    Parameters
    ----------
    path : str or Path
    mode : str
        ``'w'`` (text) or ``'wb'`` (binary).

    Yields
    ------
    file object
        For writers that need a filename (``net.save_parameters``), use
        :func:`atomic_path` instead.
    """
    with atomic_path(path) as tmp:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": encoding})) as handle:
            yield handle


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path`` for a writer that wants a filename; rename on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, default_mode())  # mkstemp makes it private (0600); the target gets what open() would give
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path, obj, indent=2):
    """Write ``obj`` as JSON, atomically."""
    with atomic_write(path) as handle:
        json.dump(obj, handle, indent=indent, sort_keys=False)
        handle.write("\n")


def append_jsonl(path, record):
    """Append one JSON record as a line, atomically (the file is rewritten whole).

    Files here hold one record per epoch, so rewriting is cheap and a crash
    never leaves a half-written line.
    """
    path = Path(path)
    old = path.read_bytes() if path.exists() else b""
    with atomic_write(path, "wb") as handle:
        handle.write(old + (json.dumps(record) + "\n").encode("utf-8"))


def read_jsonl(path):
    """The records of a JSON-lines file (an empty list when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def sha256_file(path, chunk=1 << 20):
    """Hex SHA-256 of a file, read in chunks (a checkpoint or an export may not fit in memory twice)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()
