"""What a command writes: one writer at a time, published whole, never over an input, its errors in one line.

docs/getting-started.md ("What mxfp16 writes") gives the rule every writing command follows (:class:`Output`).
"""
import contextlib
import datetime
import errno
import fcntl
import fnmatch
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

__all__ = ["shown", "default_mode", "NAME_MAX", "PATH_MAX", "temporary_prefix", "temporary_file", "temporary_folder",
           "atomic_write", "atomic_path", "naming", "failed_write", "describe_os_error", "OutputFolderError",
           "check_output_folder", "check_output_path", "rename_noreplace", "exchange", "PathBusyError", "PathLock",
           "lock_file", "read_lock", "Contents", "Output", "error_line", "refusals_as"]

#: The longest file name (in bytes) where the file system does not say (ext4, XFS, Btrfs, tmpfs: 255).
NAME_MAX = 255
#: The longest path (in bytes) Linux accepts.
PATH_MAX = 4095
#: What ``mkstemp``/``mkdtemp`` add between the prefix and the suffix.
_RANDOM_CHARS = 8


class OutputFolderError(ValueError):
    """An output that cannot be made, overlaps an input of the same command, or exists; one line with the fix."""


class PathBusyError(RuntimeError):
    """Another process holds the path; the message names the path, the holder and what it is doing."""


@contextlib.contextmanager
def refusals_as(kind):
    """Raise the output rules' refusals (:class:`OutputFolderError`, :class:`PathBusyError`) as ``kind``.

    A command's own error type carries the one-line message to its user, without the traceback of the rule.
    """
    try:
        yield
    except (OutputFolderError, PathBusyError) as err:
        raise kind(str(err)) from None


def shown(path):
    """``path`` as text that can always be printed: bytes that are not UTF-8 appear as ``\\xNN``."""
    return os.fsencode(os.fspath(path)).decode("utf-8", "backslashreplace")


def _abridged(text, keep=160):
    """``text``, its middle elided when longer than ``keep`` characters (a path that is too long, say)."""
    return text if len(text) <= keep else f"{text[:keep // 2]}...{text[-keep // 2 + 3:]}"


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
    """The prefix ``.<name>.`` of a temporary name beside ``path``, ``<name>`` cut (never mid-character) so that
    the prefix, ``mkstemp``'s 8 random characters and ``suffix`` fit in one name of the file system."""
    path = Path(path)
    room = _name_max(path.parent if path.parent.exists() else ".") - len(os.fsencode(suffix)) - _RANDOM_CHARS - 2
    name = path.name if len(os.fsencode(path.name)) <= room else \
        os.fsencode(path.name)[:max(1, room)].decode("utf-8", "ignore")
    return f".{name or 'x'}."


def temporary_file(path, suffix=".tmp"):
    """Create an empty temporary file beside ``path``, unique to this call, with ``open()``'s permissions; its name."""
    fd, tmp = tempfile.mkstemp(prefix=temporary_prefix(path, suffix), suffix=suffix, dir=Path(path).parent)
    os.close(fd)
    os.chmod(tmp, default_mode())  # mkstemp makes it private
    return tmp


def temporary_folder(path, suffix=".tmp"):
    """Create an empty temporary folder beside ``path``, with ``mkdir``'s permissions; return it as a Path."""
    folder = Path(tempfile.mkdtemp(prefix=temporary_prefix(path, suffix), suffix=suffix, dir=Path(path).parent))
    os.chmod(folder, default_mode(folder=True))
    return folder


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary name beside ``path`` for a writer that wants a filename; flushed and renamed over ``path``
    on success, removed on any exception (``path`` keeps its old content)."""
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


@contextlib.contextmanager
def atomic_write(path, mode="w", encoding="utf-8", errors="strict"):
    """:func:`atomic_path`, opened: yield a file object (``mode`` ``'w'`` or ``'wb'``) that replaces ``path`` whole.

    ``errors="surrogateescape"`` writes file names that are not UTF-8 as their original bytes.
    """
    with atomic_path(path) as tmp:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": encoding, "errors": errors})) as handle:
            yield handle


#: The errors a write meets that belong to the disk written to, whatever call raised them.
_DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})


@contextlib.contextmanager
def naming(path, *within):
    """Give an ``OSError`` raised in the block ``path`` as its file when it names none (``write``, ``fsync``, MXNet
    on a full disk) or one of ``within`` (a temporary name): :func:`describe_os_error` then measures its disk."""
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


def failed_write(path):
    """The ``OSError`` for a write to ``path`` that a library reports without its cause (MXNet's "FileStream.Write
    incomplete"): the file-size limit (``ulimit -f``) when one is set, else a full disk."""
    try:
        import resource

        limited = resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY
    except (ImportError, OSError, ValueError):
        limited = False
    code = errno.EFBIG if limited else errno.ENOSPC
    return OSError(code, os.strerror(code), os.fspath(path))


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
    if base.startswith(".") and base.endswith((".tmp", ".staging", ".old")):
        return os.path.dirname(name) or "."
    return name


def describe_os_error(err):
    """One line for the ``OSError`` ``err``: what failed, on which path, and the fix (a ``str``)."""
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


def error_line(err):
    """The last line of ``err``'s message, stripped (MXNet's carry a C++ stack trace above it), or its type's name."""
    lines = str(err).strip().splitlines()
    return lines[-1].strip() if lines else type(err).__name__


def check_output_folder(out, inputs, flag="--out"):
    """Refuse (:class:`OutputFolderError`) an ``out`` that is, contains, or sits inside one of ``inputs``
    (``(what it is, path or None)`` pairs), links resolved on both sides: nothing written or replaced is an input."""
    target = Path(os.path.realpath(out))
    for what, path in inputs:
        if path is None:
            continue
        source = Path(os.path.realpath(path))
        how = "is" if target == source else "contains" if target in source.parents else \
            "sits inside" if source in target.parents else None
        if how:
            raise OutputFolderError(
                f"{flag} {shown(out)} {how} {what} {shown(path)}: the outputs would be written over (or "
                f"--overwrite would delete) an input. Choose an {flag} outside {shown(path)}, e.g. "
                f"{shown(source.parent / (source.name + '-out'))}")


def check_output_path(path, flag="--out", kind="folder"):
    """Refuse (:class:`OutputFolderError`) an output that cannot be made: a name or path too long, a file where
    a folder belongs or the reverse (``kind``: ``'folder'``, ``'file'`` or ``'prefix'``), a folder not writable."""
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
    # As the effective user (a setuid or su'd process may differ from the real one); false on a read-only disk too.
    if not os.access(folder, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        raise OutputFolderError(f"{flag} {shown(path)} cannot be written: this user may not write in {shown(folder)} "
                                "(permissions, or a read-only file system); choose a folder you can write to")


def rename_noreplace(source, target):
    """Move the file or folder ``source`` to ``target``, or raise ``FileExistsError`` when something is there.

    Under the output's lock no mxfp16 command puts anything there meanwhile: the check is for other programs.
    """
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(target))
    os.rename(source, target)


def exchange(source, target):
    """Put the folder ``source`` at ``target``; return the temporary folder the old one was moved into (remove it)."""
    aside = temporary_folder(target, suffix=".old")
    os.rename(target, aside / "old")
    try:
        os.rename(source, target)
    except BaseException:
        os.rename(aside / "old", target)
        aside.rmdir()
        raise
    return aside


def _remove(path):
    """Remove a file or a folder (with everything in it) if it is there."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def lock_file(path):
    """The lock file of ``path``: ``.NAME.lock`` beside it, its links resolved; a name too long for the file
    system keeps its start and a digest of the whole, so the lock stays one per path."""
    target = Path(os.path.realpath(path))
    name = target.name or "root"
    if len(os.fsencode(name)) + len(".lock") + 1 > NAME_MAX:
        digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
        name = os.fsencode(name)[:NAME_MAX - 40].decode("utf-8", "ignore") + "." + digest
    return target.parent / f".{name}.lock"


def _holder(path):
    """What the lock file says about its holder, or ``{}`` (never written, or by a process that has ended)."""
    try:
        with open(path, "rb") as handle:
            facts = json.loads(handle.read(4096).decode("utf-8"))
        pid = int(facts.get("pid", 0))
        if pid > 0 and facts.get("host") == socket.gethostname():
            with contextlib.suppress(PermissionError):  # another user's process: it runs
                os.kill(pid, 0)  # a reader keeps the facts it found: they may be a killed writer's
        return facts
    except (OSError, ValueError, TypeError, AttributeError, UnicodeDecodeError):  # ProcessLookupError is an OSError
        return {}


class PathLock:
    """An exclusive (writing) or shared (reading) lock on ``path``, taken at once or refused; a context manager.

    Parameters
    ----------
    path : str or Path
        What is locked (it need not exist); a writer creates its folder when missing.
    doing : str
        For the message another command gets (``'training'``).
    exclusive : bool
    flag : str, optional
        How the user named ``path`` (``'--out'``), for the message.
    """

    def __init__(self, path, doing, exclusive=True, flag=None):
        self.target, self.path = Path(path), lock_file(path)
        self.doing, self.exclusive, self.flag = doing, exclusive, flag
        self._fd, self.created = None, []  # created: the folders acquire() made, deepest first

    @property
    def held(self):
        return self._fd is not None

    def acquire(self):
        """Take the lock now and return ``self``, or raise :class:`PathBusyError` naming the holder."""
        if self._fd is not None:
            return self
        folder = self.path.parent
        if not folder.exists():
            if not self.exclusive:
                return self  # nothing to read and nothing to protect: a reader of a missing path fails on its own
            self.created = [p for p in (folder, *folder.parents) if not p.exists()]
            folder.mkdir(parents=True, exist_ok=True)
        mode = (fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                fcntl.flock(fd, mode)
            except OSError as err:
                os.close(fd)
                if isinstance(err, BlockingIOError):
                    raise PathBusyError(self._busy_message()) from None
                raise
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                    self._fd = fd
                    self._write_facts()
                    return self
            os.close(fd)  # its last holder removed the file between our open and our lock: open the new one
        raise PathBusyError(self._busy_message())

    def _write_facts(self):
        """Who holds it, for a refused command: a writer always, a reader when no other reader wrote first."""
        if not self.exclusive and os.fstat(self._fd).st_size:
            return
        facts = {"pid": os.getpid(), "host": socket.gethostname(), "doing": self.doing,
                 "command": " ".join(sys.argv) or sys.executable,
                 "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        with contextlib.suppress(OSError):  # a full disk: the lock holds all the same, its message says less
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, (json.dumps(facts) + "\n").encode("utf-8"), 0)

    def holder(self):
        """Who holds the lock, as the holder wrote it: ``process 123 (training since ...: mxfp16 train ...)``."""
        for _ in range(10):  # a holder that has just taken it writes its facts a moment later
            facts = _holder(self.path)
            if facts.get("pid"):
                break
            time.sleep(0.05)
        else:
            return "another mxfp16 command"
        host = "" if facts.get("host") == socket.gethostname() else f" on {facts.get('host')}"
        return (f"process {facts['pid']}{host} ({facts.get('doing', 'using it')} since {facts.get('since', '?')}: "
                f"{str(facts.get('command', '?'))[:300]})")

    def _busy_message(self):
        named = f"{self.flag} {shown(self.target)}" if self.flag else shown(self.target)
        return (f"{named} is in use by {self.holder()}; this command would {'write to' if self.exclusive else 'read'} "
                f"it at the same time. Wait until that command ends (or stop it), or choose "
                f"{f'another {self.flag}' if self.flag else 'another path'}")

    def release(self):
        """Let go of the lock (the kernel does the same when the process ends); the last holder removes its file."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            # A reader is the last one when it can take the lock exclusively; it removes the file while it holds it.
            with contextlib.suppress(OSError):
                if not self.exclusive:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while other readers hold it
                if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                    os.unlink(self.path)
        finally:
            os.close(fd)

    def abandon(self):
        """:meth:`release`, and remove the folders :meth:`acquire` made where nothing was put in them."""
        self.release()
        for folder in self.created:  # deepest first; one that something else was put in stays
            try:
                folder.rmdir()
            except OSError:
                break
        self.created = []

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False

    def __del__(self):
        self.release()


def read_lock(path, doing, flag=None):
    """A :class:`PathLock` holding the input ``path`` shared while a command reads it (:class:`PathBusyError`
    while a writer holds it); unheld where no lock file can be made, where this user cannot write either."""
    lock = PathLock(path, doing, exclusive=False, flag=flag)
    with contextlib.suppress(OSError):
        lock.acquire()
    return lock


@dataclass(frozen=True)
class Contents:
    """What a command writes: ``what`` it is (``'an export'``), the ``names`` it writes (``fnmatch`` patterns of a
    folder's entries, or the ends of a prefix's names: ``'_train.rec'``) and ``is_one(folder)``, when a folder
    whose entries all match must say itself that it is one (a data set, by its manifest)."""

    what: str
    names: tuple
    is_one: Optional[Callable] = None

    def foreign(self, folder):
        """The entries of ``folder`` that are not this output's, sorted: all of them when it is not one."""
        entries = sorted(os.listdir(folder))
        if entries and self.is_one is not None and not self.is_one(Path(folder)):
            return entries
        return [e for e in entries if not any(fnmatch.fnmatchcase(e, pattern) for pattern in self.names)]


class Output:
    """One output of a command: written by one process at a time, published whole, never over anything unasked.

    After :meth:`open` the command writes into :meth:`stage` and :meth:`publish` moves that into place; closing
    removes what was not published and releases the lock, and an ``OSError`` raised in the ``with`` block names it.

    Parameters
    ----------
    path : str or Path
    doing : str
        For the message a second command gets (``'exporting runs/a'``).
    kind : {'folder', 'file', 'prefix'}
        A prefix's output is the files whose names start with it (``contents.names``).
    overwrite : bool
    inputs : iterable of (str, str or Path)
        ``(what it is, path)`` of each input; ``None`` paths are ignored.
    flag : str
        How the user named the output (``'--out'``).
    contents : Contents, optional
        Required for a prefix; ``overwrite`` refuses a folder holding anything else.
    reuse : callable, optional
        ``reuse(path) -> bool``: an existing output that is exactly the one asked for is kept.
    refusal : str or callable, optional
        What to do about an existing output; a callable is given the path, under the lock.
    in_place : bool
        The command writes into the output where it is (a training run): no reuse, refusal or publishing.
    wait : float
        With ``reuse``: seconds to wait for a command writing it (a job's workers making the demo set).
    """

    def __init__(self, path, doing, kind="folder", overwrite=False, inputs=(), flag="--out", contents=None,
                 reuse=None, refusal=None, in_place=False, wait=0):
        if kind == "prefix" and contents is None:
            raise ValueError("a prefix output needs the contents that name its files")
        self.path, self.doing, self.kind, self.overwrite = Path(path), doing, kind, overwrite
        self.real = Path(os.path.realpath(path))
        self.inputs, self.flag, self.contents, self.reuse = list(inputs), flag, contents, reuse
        self.refusal = refusal or f"replace it with --overwrite or choose another {flag}"
        self.in_place, self.wait = in_place, wait
        self.reused = self.published = False
        self._lock, self._staged = None, []

    def open(self):
        """Check, lock, and decide about an existing output; return ``self`` (``reused`` tells whether it is kept).

        Raises :class:`OutputFolderError` (cannot be made, overlaps an input, exists) or :class:`PathBusyError`.
        """
        if self._lock is not None:
            return self  # opened already (``with`` an output :meth:`open` returned)
        self.check()
        if self.reuse is not None and self._reusable_as_it_is():
            return self
        self._lock = PathLock(self.path, self.doing, flag=self.flag).acquire()
        try:
            if not self.in_place:
                self._decide()
        except BaseException:
            self.abandon()
            raise
        return self

    def check(self):
        """Step 1 alone: refuse an output that cannot be made or overlaps an input (:class:`OutputFolderError`)."""
        check_output_path(self.path, self.flag, self.kind)
        check_output_folder(self.path, self.inputs, self.flag)

    def _reusable_as_it_is(self):
        """Whether the output is the one asked for, checked under a shared lock (kept while the command reads it)."""
        lock = PathLock(self.path, self.doing, exclusive=False, flag=self.flag)
        deadline = time.monotonic() + self.wait
        while True:
            try:
                lock.acquire()
                break
            except PathBusyError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
            except OSError:  # a read-only place: it can only be reused
                break
        if self.occupied() and self.reuse(self.path):
            self._lock, self.reused = lock, True
            return True
        lock.release()
        return False

    def occupied(self):
        """Whether anything is at the output now: a non-empty folder, a file, any of a prefix's files."""
        if self.kind == "prefix":
            return any(os.path.lexists(f"{self.real}{name}") for name in self.contents.names)
        if self.kind == "folder" and os.path.isdir(self.real):
            with os.scandir(self.real) as entries:
                return next(entries, None) is not None
        return os.path.lexists(self.real)

    def _decide(self):
        if not self.occupied():
            return
        if self.reuse is not None and self.reuse(self.path):
            self.reused = True
            return
        if not self.overwrite:
            there = ""
            if self.kind == "prefix":
                first = next(n for n in self.contents.names if os.path.lexists(f"{self.real}{n}"))
                there = f" ({self.contents.what}: {shown(self.path)}{first} is there)"
            refusal = self.refusal(self.path) if callable(self.refusal) else self.refusal
            raise OutputFolderError(f"{self.flag} {shown(self.path)} already exists{there}; {refusal}")
        if self.kind == "folder" and self.contents is not None and os.path.isdir(self.real):
            foreign = self.contents.foreign(self.real)
            if foreign:
                listed = ", ".join(shown(name) for name in foreign[:3]) + (
                    f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
                one = len(foreign) == 1
                raise OutputFolderError(
                    f"{self.flag} {shown(self.path)} holds {listed}, which {'is' if one else 'are'} not part of "
                    f"{self.contents.what}: --overwrite replaces the whole folder, and would delete "
                    f"{'it' if one else 'them'}. Move {'it' if one else 'them'} out of {shown(self.path)}, or "
                    f"choose another {self.flag}")

    def stage(self, suffix=""):
        """A new staging folder (a folder output) or file (a prefix's ends in ``suffix``) beside the output."""
        target = Path(f"{self.real}{suffix}")
        staged = temporary_folder(target, ".staging") if self.kind == "folder" else Path(temporary_file(target))
        self._staged.append(staged)
        return staged

    def publish(self, staged):
        """Move the staged folder or file into place; without ``overwrite``, :class:`OutputFolderError` leaves what
        a program that takes no lock put there as it is."""
        if self.kind == "folder" and os.path.isdir(self.real) and not self.occupied():
            with contextlib.suppress(OSError):
                os.rmdir(self.real)  # an empty folder is nothing to replace
        with naming(self.path, *self._staged):
            if not (self.overwrite and os.path.lexists(self.real)):
                self._rename(staged, self.real)
            elif self.kind == "folder":
                _remove(exchange(staged, self.real))
            else:
                os.replace(staged, self.real)
        self.published = True

    def publish_files(self, staged, last=None):
        """Move a prefix output's ``staged`` files (``{end of the name: file}``) into place, ``last`` (the end of
        the file that marks it complete) after all others. With ``overwrite`` the old ``last`` goes first and
        every old file the new output lacks goes too: an interrupted publish never looks complete."""
        with naming(self.path, *self._staged):
            if self.overwrite:
                for suffix in sorted(self.contents.names, key=lambda suffix: suffix != last):
                    if suffix == last or suffix not in staged:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(f"{self.real}{suffix}")
            for suffix in sorted(staged, key=lambda suffix: suffix == last):
                (os.replace if self.overwrite else self._rename)(staged[suffix], f"{self.real}{suffix}")
        self.published = True

    def _rename(self, staged, target):
        try:
            rename_noreplace(staged, target)
        except FileExistsError:
            raise OutputFolderError(
                f"{self.flag} {shown(self.path)} appeared while this command ran, put there by a program that does "
                "not take mxfp16's lock; it was left as it is and this command's output was not kept. Choose "
                f"another {self.flag}, or run again with --overwrite") from None

    def release(self):
        """Remove what was staged and not published, and release the lock."""
        for staged in self._staged:
            _remove(staged)
        self._staged = []
        if self._lock is not None:
            self._lock.release()

    def abandon(self):
        """:meth:`release`, and remove the folders taking the lock made, where nothing was put in them."""
        self.release()
        if self._lock is not None:
            self._lock.abandon()

    def __enter__(self):
        return self.open()

    def __exit__(self, kind, err, traceback):
        staged = list(self._staged)
        if self.published or self.reused:
            self.release()
        else:
            self.abandon()
        if isinstance(err, OSError):
            with naming(self.path, *staged):
                raise err
        return False
