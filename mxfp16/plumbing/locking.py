"""One writer per output: a lock the kernel releases when its process dies, and the rule every output follows.

Two commands on one output lose one of them: two ``export --out E`` started
together both report success and E holds the second; two ``train --out
runs/x`` write each other's checkpoints; ``data pack`` over the pack a
running ``train`` reads changes its data under it. So every command locks
what it writes, and what it must not see change while it reads:

- :class:`PathLock` is the lock of one path (a folder, a file, or a pack's
  prefix): ``flock(2)`` on the file ``.NAME.lock`` beside it, the path's
  symbolic links resolved first (one lock per thing, however it is named).
  A writer holds it exclusively, a reader shared. A command that cannot
  take it is refused at once, naming the path and its holder (PID, host,
  command line, what it is doing, since when, as the holder wrote them
  into the file); it never waits. The kernel drops the lock when its
  process ends, however it ends, so ``kill -9`` leaves nothing held. The
  last holder removes the file while it still holds the lock, and a taker
  checks that the file it locked is still the one at the path, so no two
  processes ever hold two different files.
- :class:`Output` is the rule for everything a command writes (a run
  folder, an export, a pack, a split, predictions, a comparison, a
  benchmark): checked before any work, locked before anything decides
  whether it exists, refused when it exists (without ``--overwrite``) or
  holds what the command does not write (with it), staged beside its
  place and published in one step that never replaces what appeared
  meanwhile, ``--overwrite`` replacing the old output whole.
- :func:`read_lock` holds an input shared while a command reads it: a
  ``train`` holds its data set (a folder or a pack), ``export`` the run,
  ``predict`` the export, so none of them is replaced under its reader.
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .fileio import (
    NAME_MAX,
    OutputFolderError,
    check_output_folder,
    check_output_path,
    exchange,
    naming,
    rename_noreplace,
    shown,
    temporary_file,
    temporary_folder,
)

__all__ = ["PathLock", "PathBusyError", "Output", "Contents", "read_lock", "lock_file"]

#: How often :meth:`PathLock.acquire` opens the lock file again when its holder removed it meanwhile.
_ATTEMPTS = 20


class PathBusyError(RuntimeError):
    """Another process holds the path; the message names the path, the holder and what it is doing."""


def lock_file(path):
    """The lock file of ``path``: ``.NAME.lock`` beside it, its links resolved.

    A name too long for the file system keeps its start and gets a digest
    of the whole in place of the rest, so the lock's name stays one per path.
    """
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
        if not isinstance(facts, dict):
            return {}
        pid = int(facts.get("pid", 0))
        if pid > 0 and facts.get("host") == socket.gethostname():
            with contextlib.suppress(PermissionError):  # another user's process: it runs
                os.kill(pid, 0)  # a PID that no longer runs wrote it: stale facts
        return facts
    except ProcessLookupError:
        return {}
    except (OSError, ValueError, TypeError, UnicodeDecodeError):
        return {}


class PathLock:
    """An exclusive (writing) or shared (reading) lock on one path, taken at once or refused.

    Parameters
    ----------
    path : str or Path
        What is locked: a folder, a file or a prefix (it need not exist).
        The folder it is in is created when missing and ``exclusive`` is set.
    doing : str
        What the holder does, for the message another command gets (``'training'``).
    exclusive : bool
        ``True`` for a writer (no other holder at all), ``False`` for a reader
        (other readers may hold it too, a writer may not).
    flag : str, optional
        How the command's user named ``path`` (``'--out'``), for the message.

    Use as a context manager, or :meth:`acquire` / :meth:`release`.
    """

    def __init__(self, path, doing, exclusive=True, flag=None):
        self.target = Path(path)
        self.path = lock_file(path)
        self.doing = doing
        self.exclusive = exclusive
        self.flag = flag
        self._fd = None
        self.created = []  # the folders acquire() made, deepest first

    @property
    def held(self):
        return self._fd is not None

    def acquire(self):
        """Take the lock now, or raise :class:`PathBusyError` naming the holder.

        Returns
        -------
        PathLock
            ``self``.
        """
        if self._fd is not None:
            return self
        folder = self.path.parent
        if not folder.exists():
            if not self.exclusive:
                return self  # nothing to read and nothing to protect: a reader of a missing path fails on its own
            missing = [p for p in (folder, *folder.parents) if not p.exists()]
            folder.mkdir(parents=True, exist_ok=True)
            self.created = missing
        self._fd = self._open_locked()
        self._write_facts()
        return self

    def _open_locked(self):
        """The lock file, opened and locked; the one at the path (its last holder may have just removed it)."""
        mode = (fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        for _ in range(_ATTEMPTS):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                fcntl.flock(fd, mode)
            except OSError as err:
                os.close(fd)
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise PathBusyError(self._busy_message()) from None
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                    return fd
            os.close(fd)  # the file was removed (and maybe made again) between our open and our lock
        raise PathBusyError(self._busy_message())

    def _write_facts(self):
        """Who holds it, for a refused command: a writer always, a reader when no other reader wrote first."""
        if not self.exclusive and os.fstat(self._fd).st_size:
            return  # another reader's facts stand (a reader never truncates what a reader wrote)
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
        if not facts.get("pid"):
            return "another mxfp16 command"
        host = "" if facts.get("host") == socket.gethostname() else f" on {facts.get('host')}"
        return (f"process {facts['pid']}{host} ({facts.get('doing', 'using it')} since {facts.get('since', '?')}: "
                f"{str(facts.get('command', '?'))[:300]})")

    def _busy_message(self):
        want = "write to" if self.exclusive else "read"
        named = f"{self.flag} {shown(self.target)}" if self.flag else shown(self.target)
        other = f"another {self.flag}" if self.flag else "another path"
        return (f"{named} is in use by {self.holder()}; this command would {want} it at the same time. Wait until "
                f"that command ends (or stop it), or choose {other}")

    def release(self):
        """Let go of the lock (the kernel does the same when the process ends); the last holder removes its file."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            # A reader is the last one when it can take the lock exclusively; it removes the file while it holds it.
            last = self.exclusive or _try_flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if last:
                with contextlib.suppress(OSError):
                    if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                        os.unlink(self.path)
        finally:
            os.close(fd)

    def abandon(self):
        """Release, and remove the folders :meth:`acquire` created when nothing was put in them.

        For a command refused after taking the lock: it leaves no empty folder behind.
        """
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


def _try_flock(fd, mode):
    try:
        fcntl.flock(fd, mode)
        return True
    except OSError:
        return False


def read_lock(path, doing, flag=None):
    """Hold ``path`` shared for as long as a command reads it, so no writer replaces it meanwhile.

    Parameters
    ----------
    path : str or Path
        An input: a data set (a folder or a pack's prefix), a run, an export.
    doing : str
        What the reader does (``'training on it'``), for a writer's message.
    flag : str, optional

    Returns
    -------
    PathLock
        Held; unheld where ``path``'s folder cannot hold a lock file (a
        read-only disk, another user's folder): nothing of this user's can
        write there either.

    Raises
    ------
    PathBusyError
        A writer holds it now: the input is being written.
    """
    lock = PathLock(path, doing, exclusive=False, flag=flag)
    with contextlib.suppress(OSError):
        lock.acquire()
    return lock


@dataclass(frozen=True)
class Contents:
    """What a command writes as its output: how to tell a previous output of it from anything else.

    Attributes
    ----------
    what : str
        What such an output is, for messages (``'an export'``).
    names : tuple of str
        Everything it writes: ``fnmatch`` patterns of a folder's entries, or
        the ends of a prefix's file names (``'_train.rec'``).
    is_one : callable, optional
        ``is_one(folder) -> bool``: whether a folder whose entries all match
        is one (a data set tells its own kind by its manifest).
    """

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

    The rule every writing command follows (docs/getting-started.md, "What mxfp16 writes"):

    1. before any work, :meth:`open` checks that the output can be made
       (:func:`~mxfp16.plumbing.fileio.check_output_path`) and that it is,
       contains and sits inside none of the command's ``inputs``
       (:func:`~mxfp16.plumbing.fileio.check_output_folder`);
    2. it takes the output's :class:`PathLock` before anything decides
       whether the output exists: a second command on it is refused at once,
       naming the output and the holder;
    3. under the lock, an output already there is reused when ``reuse`` says
       it is the one asked for (under a shared lock first, so readers of it
       are not refused), refused without ``overwrite``, and refused with it
       when it holds anything ``contents`` does not name: ``--overwrite``
       replaces the whole output, and would lose that;
    4. the command writes into a staging folder or file beside the output
       (:meth:`stage`), and :meth:`publish` moves it into place in one step:
       where nothing is (:func:`~mxfp16.plumbing.fileio.rename_noreplace`),
       or, with ``overwrite``, swapped with the old output
       (:func:`~mxfp16.plumbing.fileio.exchange`), which is then removed
       whole: nothing of it stays. What a program that takes no lock put
       there meanwhile is never replaced;
    5. closing removes what was staged and not published, releases the lock
       and removes the folders made for it that stayed empty. An ``OSError``
       that names no file, or a staged one (a full disk), is raised again
       naming the output, so its message measures the output's own disk.

    Parameters
    ----------
    path : str or Path
    doing : str
        What the command does, for the message a second command gets (``'exporting runs/a'``).
    kind : {'folder', 'file', 'prefix'}
        A prefix's output is the files whose names start with it (``contents.names``).
    overwrite : bool
    inputs : iterable of (str, str or Path)
        ``(what it is, path)`` of each input; ``None`` paths are ignored.
    flag : str
        How the user named the output (``'--out'``).
    contents : Contents, optional
        What the command writes (required for a prefix).
    reuse : callable, optional
        ``reuse(path) -> bool``: an existing output that is exactly the one
        asked for (the same data set, settings and files) is kept as it is.
    refusal : str or callable, optional
        What to do about an existing output (default: replace it with
        ``--overwrite`` or choose another path); a callable is given the
        path, under the lock.
    in_place : bool
        The command writes into the output where it is, over time (a
        training run), and decides under the lock what an existing one
        means (continue it, replace it): steps 3 and 4 are its own.
    wait : float
        With ``reuse``: the seconds to wait for another command that is
        writing the output (it may be writing the one asked for, as the
        workers of one job all making the demo set) before refusing.

    Attributes
    ----------
    reused : bool
        The output was already there and is kept (:meth:`stage` is not needed).
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
        self._lock = None
        self._staged = []

    # ---- 1-3: checks, the lock, what is there -------------------------------------------------------
    def open(self):
        """Check, lock, and decide about an existing output (steps 1-3); return ``self``.

        Raises
        ------
        OutputFolderError
            The output cannot be made, overlaps an input, or exists (see the class).
        PathBusyError
            Another command holds it.
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
        self._refuse_foreign()

    def _refuse_foreign(self):
        """With ``overwrite``: refuse a folder holding anything the command does not write (it would be lost)."""
        if self.kind != "folder" or self.contents is None or not os.path.isdir(self.real):
            return
        foreign = self.contents.foreign(self.real)
        if foreign:
            listed = ", ".join(shown(name) for name in foreign[:3]) + (
                f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise OutputFolderError(
                f"{self.flag} {shown(self.path)} holds {listed}, which {'is' if len(foreign) == 1 else 'are'} not "
                f"part of {self.contents.what}: --overwrite replaces the whole folder, and would delete "
                f"{'it' if len(foreign) == 1 else 'them'}. Move {'it' if len(foreign) == 1 else 'them'} out of "
                f"{shown(self.path)}, or choose another {self.flag}")

    # ---- 4: staging and publishing ------------------------------------------------------------------
    def stage(self, suffix=""):
        """A new staging folder (a folder output) or file beside the output, removed on closing unless published.

        Parameters
        ----------
        suffix : str
            For a prefix output: the end of the file's name (``'_train.rec'``).
        """
        target = Path(f"{self.real}{suffix}")
        staged = temporary_folder(target, ".staging") if self.kind == "folder" else Path(temporary_file(target))
        self._staged.append(staged)
        return staged

    def publish(self, staged):
        """Move the staged folder or file into place (step 4), under the lock.

        Raises
        ------
        OutputFolderError
            Something appeared at the output meanwhile (from a program that
            takes no lock) and ``overwrite`` is off: it is left as it is, and
            nothing of this command's is kept.
        """
        if self.kind == "folder" and os.path.isdir(self.real) and not self.occupied():
            with contextlib.suppress(OSError):
                os.rmdir(self.real)  # an empty folder is nothing to replace
        with naming(self.path, *self._staged):
            try:
                if self.overwrite and os.path.lexists(self.real):
                    self._refuse_foreign()  # again: it may have changed while the command worked
                    if self.kind == "folder":
                        _remove(exchange(staged, self.real))
                    else:
                        os.replace(staged, self.real)
                else:
                    rename_noreplace(staged, self.real)
            except FileExistsError:
                raise OutputFolderError(self._appeared()) from None
        self.published = True

    def publish_files(self, staged, last=None):
        """Move a prefix output's staged files into place, ``last`` after all others (step 4), under the lock.

        With ``overwrite``, the old output's ``last`` goes first and every old
        file the new output lacks goes too: an interrupted publish never
        looks complete, and nothing of the old output stays.

        Parameters
        ----------
        staged : dict
            ``{end of the name: staged file}``.
        last : str, optional
            The end of the name of the file that marks the output complete.
        """
        finals = {suffix: Path(f"{self.real}{suffix}") for suffix in staged}
        order = sorted(staged, key=lambda suffix: suffix == last)
        with naming(self.path, *self._staged):
            if self.overwrite:
                old = sorted(self.contents.names, key=lambda suffix: suffix != last)
                for suffix in [s for s in old if s == last or s not in staged]:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{self.real}{suffix}")
            elif self.occupied():
                raise OutputFolderError(self._appeared())
            try:
                for suffix in order:
                    (os.replace if self.overwrite else rename_noreplace)(staged[suffix], finals[suffix])
            except FileExistsError:
                raise OutputFolderError(self._appeared()) from None
        self.published = True

    def _appeared(self):
        return (f"{self.flag} {shown(self.path)} appeared while this command ran, put there by a program that does "
                "not take mxfp16's lock; it was left as it is and this command's output was not kept. Choose "
                f"another {self.flag}, or run again with --overwrite")

    # ---- 5: closing ---------------------------------------------------------------------------------
    def release(self):
        """Remove what was staged and not published, and release the lock (the output stays as it is)."""
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


def _remove(path):
    """Remove a file or a folder (with everything in it) if it is there."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
