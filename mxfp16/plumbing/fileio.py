"""Atomic writes, one guarded JSON reader, the rule for output folders, and OS errors as one line.

Writes: a file is either the old version or the complete new one.
Checkpoints, results and downloads are written to a temporary file in the
same folder, flushed to disk, then renamed over the target (``os.replace`` is
atomic on POSIX and Windows). A crash or Ctrl-C mid-write leaves the previous
file intact and at most a stray ``.tmp`` file. Every temporary name comes
from :func:`temporary_prefix` (through ``mkstemp``/``mkdtemp``): unique to
one process and call, so two commands writing the same file never share
one, and never longer than the file system allows, so a target whose own
name is near the limit still works (the temporary name is shortened, never
the target's).

Reads: every JSON file mxfp16 reads back (a run's config, summary and
metrics, checkpoint records, export.json, manifests) goes through
:func:`read_json` / :func:`read_jsonl`, which refuse, naming the file, what a
hand-edited or hostile file can hold: more than :data:`MAX_JSON_BYTES`,
nesting deeper than :data:`MAX_JSON_DEPTH`, ``NaN``/``Infinity`` or numbers
that overflow a float, another top-level type, or a field of the wrong type.

Outputs: :func:`check_output_folder` enforces the part of the rule every
writing command follows (:class:`mxfp16.plumbing.locking.Output`) that
concerns its inputs: its ``--out`` is never one of its inputs, never
contains one and never sits inside one, so nothing it writes, and nothing
``--overwrite`` replaces, can be an input. Both sides are compared after
every symbolic link in them is resolved, however many steps a chain of
links takes.

Publishing: :func:`rename_noreplace` moves a finished file or folder into
place only where nothing is (``renameat2(RENAME_NOREPLACE)``), and
:func:`exchange` swaps a finished folder with the one it replaces in one
step (``RENAME_EXCHANGE``); where the kernel or the file system lacks them,
each falls back to the closest step POSIX offers (a hard link for a file, a
rename that fails over a non-empty folder). The rule for whole outputs, its
lock and its staging are :class:`mxfp16.plumbing.locking.Output`'s.

OS errors: :func:`describe_os_error` turns the ``OSError`` a command meets
(no permission, a name too long, a full disk, a file where a folder belongs)
into one line naming the path and the fix; ``mxfp16``'s command line prints
it instead of a traceback. An error raised while writing a temporary file
(a ``write`` or ``fsync`` names no file) is given the file it was for
(:func:`naming`), so a full disk is always reported with the path and the
free space of its own disk.
"""
import contextlib
import ctypes
import errno
import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "atomic_path", "write_json", "append_jsonl", "read_json", "read_jsonl", "JSONFileError",
           "MAX_JSON_BYTES", "MAX_JSON_DEPTH", "sha256_file", "default_mode", "check_output_folder",
           "OutputFolderError", "shown", "temporary_prefix", "temporary_file", "temporary_folder", "NAME_MAX",
           "describe_os_error", "check_output_path", "PATH_MAX", "rename_noreplace", "exchange", "naming",
           "failed_write"]

#: The longest file name (in bytes) where the file system does not say (ext4, XFS, Btrfs, tmpfs: 255).
NAME_MAX = 255
#: The longest path (in bytes) Linux accepts.
PATH_MAX = 4095
#: What ``mkstemp``/``mkdtemp`` add between the prefix and the suffix.
_RANDOM_CHARS = 8

#: A JSON file mxfp16 reads is a record of a run, not data: beyond this size it is refused.
MAX_JSON_BYTES = 64 << 20
#: The deepest nesting of lists and objects a JSON file mxfp16 reads may have (its own files need 6).
MAX_JSON_DEPTH = 32


class JSONFileError(ValueError):
    """A JSON file that cannot be used; the message names the file, what is wrong and the fix."""


class OutputFolderError(ValueError):
    """An output folder that would overlap an input of the same command."""


def shown(path):
    """``path`` as text that can always be printed: bytes that are not UTF-8 appear as ``\\xNN``.

    File names are bytes on POSIX; Python keeps the undecodable ones as lone
    surrogates, which ``print`` and the log refuse to encode.
    """
    return os.fsencode(os.fspath(path)).decode("utf-8", "backslashreplace")


def default_mode(folder=False):
    """The permissions ``open()`` (or ``mkdir``) gives a new file (folder) under this process's umask."""
    umask = os.umask(0)  # the only way to read it is to set it
    os.umask(umask)
    return (0o777 if folder else 0o666) & ~umask


def _name_max(folder):
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return NAME_MAX


def temporary_prefix(path, suffix=".tmp"):
    """The prefix of a hidden temporary name beside ``path``: ``.<name>.``, its ``<name>`` shortened to fit.

    ``mkstemp``/``mkdtemp`` add 8 random characters and ``suffix``; the
    whole stays within the file system's limit on a name (255 bytes), so a
    target whose own name is near the limit can still be written. Characters
    are never cut in half.
    """
    path = Path(path)
    room = _name_max(path.parent if path.parent.exists() else ".") - len(os.fsencode(suffix)) - _RANDOM_CHARS - 2
    name = os.fsencode(path.name)[:max(1, room)].decode("utf-8", "ignore") if len(os.fsencode(path.name)) > room \
        else path.name
    return f".{name or 'x'}."


def temporary_file(path, suffix=".tmp"):
    """Create an empty temporary file beside ``path`` (:func:`temporary_prefix`); return its name.

    Unique to this call (``mkstemp``), with the permissions ``open()`` would
    give a new file (mkstemp makes it private).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=temporary_prefix(path, suffix), suffix=suffix, dir=path.parent)
    os.close(fd)
    os.chmod(tmp, default_mode())
    return tmp


def temporary_folder(path, suffix=".tmp"):
    """Create an empty temporary folder beside ``path`` (:func:`temporary_prefix`); return it as a Path."""
    path = Path(path)
    folder = Path(tempfile.mkdtemp(prefix=temporary_prefix(path, suffix), suffix=suffix, dir=path.parent))
    os.chmod(folder, default_mode(folder=True))  # mkdtemp makes it private; the result is an ordinary folder
    return folder


@contextlib.contextmanager
def atomic_write(path, mode="w", encoding="utf-8", errors="strict"):
    """Open a temporary file beside ``path``; on success rename it over ``path``.

    Parameters
    ----------
    path : str or Path
    mode : str
        ``'w'`` (text) or ``'wb'`` (binary).
    encoding, errors : str
        For text: ``errors="surrogateescape"`` writes file names that are not
        UTF-8 as their original bytes.

    Yields
    ------
    file object
        For writers that need a filename (``net.save_parameters``), use
        :func:`atomic_path` instead.
    """
    with atomic_path(path) as tmp:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": encoding, "errors": errors})) as handle:
            yield handle


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path`` for a writer that wants a filename; rename on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_file(path)
    try:
        with naming(path, tmp):
            yield tmp
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def failed_write(path):
    """The ``OSError`` for a write to ``path`` that a library reports without its cause (MXNet's
    "FileStream.Write incomplete").

    A file that could be opened but not written whole meets one of two
    limits: the file-size limit (``ulimit -f``) when one is set, else a full
    disk; :func:`describe_os_error` then names the path and the fix.
    """
    try:
        import resource

        limited = resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY
    except (ImportError, OSError, ValueError):
        limited = False
    code = errno.EFBIG if limited else errno.ENOSPC
    return OSError(code, os.strerror(code), os.fspath(path))


#: The errors a write meets that belong to the disk written to, whatever call raised them.
_DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})


@contextlib.contextmanager
def naming(path, *within):
    """Give an ``OSError`` raised inside the block ``path`` as its file when it names none, or names one of ``within``.

    ``write()``, ``fsync()`` and MXNet's writers report a full disk without
    a file name; a temporary name (``within``: a staging folder, a file's
    temporary copy) means nothing to the user. The error then names the
    output it was written for, and :func:`describe_os_error` measures that
    output's own disk.
    """
    try:
        yield
    except OSError as err:
        places = [os.path.abspath(p) for p in within]
        if err.filename is None:
            if err.errno not in _DISK_ERRORS:  # a socket's or a pipe's error is not the output's
                raise
        elif not any(name == p or name.startswith(p + os.sep)
                     for name in [os.path.abspath(os.fsdecode(err.filename))] for p in places):
            raise
        raise type(err)(err.errno, err.strerror or str(err), os.fspath(path)) from err


def write_json(path, obj, indent=2):
    """Write ``obj`` as JSON, atomically; a NaN or infinity raises ``ValueError`` (JSON has neither)."""
    text = json.dumps(obj, indent=indent, sort_keys=False, allow_nan=False)
    with atomic_write(path) as handle:
        handle.write(text + "\n")


def append_jsonl(path, record):
    """Append one JSON record as a line, atomically (the file is rewritten whole).

    Files here hold one record per epoch, so rewriting is cheap and a crash
    never leaves a half-written line.
    """
    path = Path(path)
    old = path.read_bytes() if path.exists() else b""
    with atomic_write(path, "wb") as handle:
        handle.write(old + (json.dumps(record, allow_nan=False) + "\n").encode("utf-8"))


def _no_constant(name):
    raise ValueError(f"{name} is not a number JSON allows (a NaN or infinite value was written)")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a 64-bit float")
    return value


def _depth(value, limit):
    """The nesting depth of ``value``, or ``limit + 1`` as soon as it passes ``limit`` (iterative: no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _type_name(types):
    types = types if isinstance(types, tuple) else (types,)
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "an object", type(None): "null"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _is(value, types):
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in types:  # JSON true is not the number 1 here
        return False
    if float in types and isinstance(value, int) and not isinstance(value, bool):
        return True
    return isinstance(value, types)


def parse_json(text, where, fix="", expect=dict, fields=None, max_depth=MAX_JSON_DEPTH):
    """Parse JSON ``text`` with :func:`read_json`'s checks; ``where`` names it in errors."""
    tail = f"; {fix}" if fix else ""
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise JSONFileError(f"{where} is nested too deeply to be a file mxfp16 wrote{tail}") from None
    except ValueError as err:
        raise JSONFileError(f"{where} is not valid JSON ({err}){tail}") from None
    if _depth(value, max_depth) > max_depth:
        raise JSONFileError(f"{where} nests lists or objects more than {max_depth} deep; mxfp16 never writes that"
                            f"{tail}")
    if expect is not None and not _is(value, expect):
        raise JSONFileError(f"{where} holds {_type_name(type(value))} where {_type_name(expect)} belongs{tail}")
    for name, types in (fields or {}).items():
        if name not in value:
            raise JSONFileError(f"{where} lacks the field {name!r}{tail}")
        if not _is(value[name], types):
            raise JSONFileError(f"{where}: field {name!r} is {json.dumps(value[name])[:80]}, where "
                                f"{_type_name(types)} belongs{tail}")
    return value


_MISSING = object()


def read_json(path, fix="", expect=dict, fields=None, default=_MISSING, max_bytes=MAX_JSON_BYTES,
              max_depth=MAX_JSON_DEPTH):
    """Read a JSON file mxfp16 (or a user) wrote, refusing what cannot be trusted.

    Parameters
    ----------
    path : str or Path
    fix : str
        What the user should do about a bad file; ends every message.
    expect : type or tuple of types, optional
        The top-level type (default: an object); ``None`` accepts any.
    fields : dict, optional
        ``{name: type or tuple of types}`` the object must have (``float``
        accepts integers; ``bool`` is never a number).
    default : optional
        Returned when the file does not exist (default: raise).
    max_bytes, max_depth : int

    Returns
    -------
    object

    Raises
    ------
    JSONFileError
        Missing (without ``default``), unreadable, too large, not UTF-8, not
        JSON, nested too deeply, holding NaN/Infinity or a number that
        overflows, or of the wrong type; the message names the file.
    """
    path = Path(path)
    tail = f"; {fix}" if fix else ""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > max_bytes:
                raise JSONFileError(f"{shown(path)} is {size / 2 ** 20:.0f} MB, more than the {max_bytes >> 20} MB "
                                    f"a file mxfp16 writes can be{tail}")
            raw = handle.read(max_bytes + 1)
    except FileNotFoundError:
        if default is not _MISSING:
            return default
        raise JSONFileError(f"{shown(path)} is missing{tail}") from None
    except IsADirectoryError:
        raise JSONFileError(f"{shown(path)} is a folder, not a JSON file{tail}") from None
    except OSError as err:
        raise JSONFileError(f"{shown(path)} cannot be read ({err.strerror or err}){tail}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise JSONFileError(f"{shown(path)} is not UTF-8 text ({err.reason} at byte {err.start}){tail}") from None
    return parse_json(text, shown(path), fix, expect, fields, max_depth)


def read_jsonl(path, fix="", expect=dict, max_bytes=MAX_JSON_BYTES, max_depth=MAX_JSON_DEPTH):
    """The records of a JSON-lines file (an empty list when it does not exist), each checked as :func:`read_json`."""
    path = Path(path)
    try:
        if path.stat().st_size > max_bytes:
            raise JSONFileError(f"{shown(path)} is more than the {max_bytes >> 20} MB a file mxfp16 writes can be"
                                + (f"; {fix}" if fix else ""))
        with open(path, "rb") as handle:
            lines = handle.read().split(b"\n")
    except FileNotFoundError:
        return []
    except OSError as err:
        raise JSONFileError(f"{shown(path)} cannot be read ({err.strerror or err})"
                            + (f"; {fix}" if fix else "")) from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise JSONFileError(f"{shown(path)} line {number} is not UTF-8 text"
                                + (f"; {fix}" if fix else "")) from None
        records.append(parse_json(text, f"{shown(path)} line {number}", fix, expect, None, max_depth))
    return records


def _overlap(out, inp):
    """How ``out`` overlaps ``inp`` (both resolved), or ``None``."""
    if out == inp:
        return "is"
    if out in inp.parents:
        return "contains"
    if inp in out.parents:
        return "sits inside"
    return None


def check_output_folder(out, inputs, flag="--out"):
    """Refuse an output folder that is, contains, or sits inside one of the command's inputs.

    The rule every writing command follows (docs/getting-started.md, "What
    mxfp16 writes"): nothing it writes, and nothing ``--overwrite`` removes,
    can be an input.

    Parameters
    ----------
    out : str or Path
        The output folder (or a RecordIO prefix's folder).
    inputs : iterable of (str, str or Path)
        ``(what it is, path)`` of each input; ``None`` paths are ignored.
    flag : str

    Raises
    ------
    OutputFolderError
    """
    target = Path(os.path.realpath(out))
    for what, path in inputs:
        if path is None:
            continue
        source = Path(os.path.realpath(path))
        how = _overlap(target, source)
        if how:
            raise OutputFolderError(
                f"{flag} {shown(out)} {how} {what} {shown(path)}: the outputs would be written over (or "
                f"--overwrite would delete) an input. Choose an {flag} outside {shown(path)}, e.g. "
                f"{shown(source.parent / (source.name + '-out'))}")


def check_output_path(path, flag="--out", kind="folder"):
    """Refuse, before any work, an output the command could not create: the check every writing command runs first.

    Parameters
    ----------
    path : str or Path
        The output (a folder, a file, or a prefix whose folder is created).
    flag : str
        How the user named it.
    kind : {'folder', 'file', 'prefix'}
        What ``path`` must be when it exists (a prefix: anything).

    Raises
    ------
    OutputFolderError
        A name longer than the file system allows, a path longer than
        :data:`PATH_MAX`, a file where a folder belongs (or the reverse), or a
        folder this user cannot write to; one line naming it and the fix.
    """
    path = Path(path).absolute()
    existing = next(p for p in (path, *path.parents) if os.path.lexists(p))
    limit = _name_max(existing if os.path.isdir(existing) else existing.parent)
    long = next((part for part in path.parts if len(os.fsencode(part)) > limit), None)
    if long is not None:
        raise OutputFolderError(f"{flag} {_abridged(shown(path))}: the name {_abridged(shown(long), 60)} is "
                                f"{len(os.fsencode(long))} bytes, longer than the {limit} this file system allows "
                                "for one name; choose a shorter one")
    if len(os.fsencode(str(path))) > PATH_MAX:
        raise OutputFolderError(f"{flag} {_abridged(shown(path))} is {len(os.fsencode(str(path)))} bytes long, longer "
                                f"than the {PATH_MAX} a path may be; choose a shorter one")
    if existing == path and kind != "prefix" and os.path.isdir(path) != (kind == "folder"):
        what = "a file, not a folder" if kind == "folder" else "a folder, not a file"
        wanted = "a folder" if kind == "folder" else "a file name"
        raise OutputFolderError(f"{flag} {shown(path)} is {what}; choose {wanted} for the output")
    # Where the files go: inside a folder output, beside a file (its temporary name) or a prefix's files.
    folder = existing if existing != path else path if kind == "folder" else path.parent
    if not os.path.isdir(folder):
        raise OutputFolderError(f"{flag} {shown(path)}: {shown(folder)} is a file, so the folder cannot be made there; "
                                f"choose another {flag}")
    # As this process's effective user (a setuid or su'd process may differ from the real one); also false on a
    # read-only file system.
    if not os.access(folder, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        raise OutputFolderError(f"{flag} {shown(path)} cannot be written: this user may not write in {shown(folder)} "
                                "(permissions, or a read-only file system); choose a folder you can write to")


_AT_FDCWD = -100
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


def _renameat2(source, target, flags):
    """``renameat2(2)`` with ``flags``; ``False`` where the C library, the kernel or the file system lacks it."""
    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # a C library older than glibc 2.28, or none that ctypes can open
        return False
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if call(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # the flag is not supported here
        return False
    raise OSError(code, os.strerror(code), os.fsdecode(target))


def rename_noreplace(source, target):
    """Move ``source`` (a file or a folder) to ``target``, only if nothing is at ``target``.

    Raises
    ------
    FileExistsError
        Something is at ``target`` (put there by any process, however
        recently); ``source`` stays where it was.
    """
    if _renameat2(source, target, _RENAME_NOREPLACE):
        return
    if os.path.isdir(source) and not os.path.islink(source):
        # rename(2) fails over a non-empty folder; over an empty one it loses nothing
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(target))
        try:
            os.rename(source, target)
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(target)) from None
            raise
        return
    try:
        os.link(source, target)  # fails with EEXIST whatever is there
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links: the narrowest check POSIX leaves
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(target)) from None
        os.rename(source, target)
        return
    os.unlink(source)


def exchange(source, target):
    """Put the folder ``source`` at ``target`` and the folder that was there at ``source``, at once.

    Where the file system cannot swap in one step, ``target`` is first moved
    aside to a temporary name beside it (and moved back if ``source`` cannot
    take its place).

    Returns
    -------
    Path
        Where the replaced folder is now: remove it.
    """
    if _renameat2(source, target, _RENAME_EXCHANGE):
        return Path(source)
    aside = Path(temporary_folder(target, suffix=".old")) / "old"
    os.rename(target, aside)
    try:
        rename_noreplace(source, target)
    except BaseException:
        os.rename(aside, target)
        raise
    return aside.parent


def sha256_file(path, chunk=1 << 20):
    """Hex SHA-256 of a file, read in chunks (a checkpoint or an export may not fit in memory twice)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


#: Why an ``errno`` happens and what to do, for :func:`describe_os_error`.
_OS_ERROR_FIXES = {
    errno.EACCES: "this user may not read or write there: fix the permissions (ls -ld the folder) or choose a "
                  "location you own",
    errno.EPERM: "the operation is not permitted there: fix the permissions or choose a location you own",
    errno.EROFS: "it is on a read-only file system: choose a location on a writable disk",
    errno.ENAMETOOLONG: "a name in the path is longer than the file system allows ({name_max} bytes per name, "
                        "4096 per path): choose a shorter path",
    errno.ENOSPC: "the disk is full ({free} free there): free some space, or choose a location on another disk",
    errno.EDQUOT: "your disk quota is used up: free some space, or choose a location on another disk",
    errno.ENOTDIR: "a part of the path is a file, where a folder belongs: choose another path",
    errno.EEXIST: "it already exists: remove it or choose another name",
    errno.EISDIR: "it is a folder, where a file belongs: name a file",
    errno.ENOENT: "it does not exist: check the path",
    errno.ELOOP: "its symbolic links form a loop: fix or remove them",
    errno.EMFILE: "this process has too many files open: raise the limit (ulimit -n)",
    errno.EFBIG: "the file would be larger than this process may write (ulimit -f): raise the limit",
    errno.EIO: "the disk reported an input/output error: check the disk (dmesg) or choose another location",
    errno.EXDEV: "it would move a file across disks: keep the output on one disk",
}


def _shown_path(name):
    """The path to name in a message: for one of :func:`temporary_prefix`'s names, the folder it was made in."""
    name = os.fsdecode(name)
    base = os.path.basename(name)
    if base.startswith(".") and base.endswith((".tmp", ".staging", ".stale", ".old")):
        return os.path.dirname(name) or "."
    return name


def _abridged(text, keep=160):
    """``text``, its middle elided when longer than ``keep`` characters (a path that is too long, say)."""
    return text if len(text) <= keep else f"{text[:keep // 2]}...{text[-keep // 2 + 3:]}"


def describe_os_error(err):
    """One line for an ``OSError``: what failed, on which path, and the fix.

    Parameters
    ----------
    err : OSError

    Returns
    -------
    str
    """
    paths = [_shown_path(p) for p in (err.filename, err.filename2) if p is not None]
    where = " -> ".join(_abridged(shown(p)) for p in paths) or "a file"
    start = Path(paths[0]) if paths else Path(".")
    existing = next((p for p in (start, *start.parents) if os.path.exists(p)), Path("."))  # never raises
    try:
        free = f"{shutil.disk_usage(existing).free / 2 ** 20:.0f} MB"
    except OSError:
        free = "little"
    fix = _OS_ERROR_FIXES.get(err.errno, "check the path and its permissions").format(
        name_max=_name_max(existing if os.path.isdir(existing) else existing.parent), free=free)
    return f"{where}: {err.strerror or type(err).__name__}; {fix}"
