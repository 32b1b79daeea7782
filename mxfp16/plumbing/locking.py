"""One writer per run folder (and per pack prefix): an advisory lock the kernel releases when its process dies.

Two commands on one run folder lose a run: two ``train --out runs/x`` started
together write each other's config, metrics and checkpoints; ``--overwrite``
while the first still trains leaves a folder that mixes both; ``export``
while the run prunes its checkpoints reads a file that is gone. So every
command that writes into a run holds :class:`FolderLock` on it: ``train``
(start, ``--resume``, ``--overwrite``) exclusively for the whole run,
``export`` shared while it reads. ``data pack`` holds one on its prefix.

The lock is ``flock(2)`` on a file in the folder (``.mxfp16.lock``), so
the kernel drops it when the process ends, however it ends: ``kill -9``
leaves nothing stale to clean up. A holder writes into the file who it is
(PID, host, command line, what it is doing, since when), and a command that
cannot take the lock is refused at once with those facts; it never waits.
The file itself stays (deleting a lock file while another process may be
opening it lets two processes lock two different files).
"""
import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from .fileio import shown

__all__ = ["FolderLock", "FolderBusyError", "LOCK_FILE"]

#: The lock's file name inside a locked folder.
LOCK_FILE = ".mxfp16.lock"


class FolderBusyError(RuntimeError):
    """Another process holds the folder; the message names it and what it is doing."""


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


class FolderLock:
    """An exclusive (writing) or shared (reading) lock on a folder, taken at once or refused.

    Parameters
    ----------
    folder : str or Path
        Created when it does not exist and ``exclusive`` is set.
    doing : str
        What the holder does, for the message another command gets (``'training'``).
    exclusive : bool
        ``True`` for a writer (no other holder at all), ``False`` for a reader
        (other readers may hold it too, a writer may not).
    name : str
        The lock file's name in ``folder``.

    Use as a context manager, or :meth:`acquire` / :meth:`release`.
    """

    def __init__(self, folder, doing, exclusive=True, name=LOCK_FILE):
        self.folder = Path(folder)
        self.path = self.folder / name
        self.doing = doing
        self.exclusive = exclusive
        self._fd = None
        self.created = []  # the folders acquire() made, deepest first

    @property
    def held(self):
        return self._fd is not None

    def acquire(self):
        """Take the lock now, or raise :class:`FolderBusyError` naming the holder.

        Returns
        -------
        FolderLock
            ``self``.
        """
        if self._fd is not None:
            return self
        if not self.folder.exists():
            if not self.exclusive:
                return self  # nothing to read and nothing to protect: a reader of a missing folder fails on its own
            missing = [p for p in (self.folder, *self.folder.parents) if not p.exists()]
            self.folder.mkdir(parents=True)
            self.created = missing
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise FolderBusyError(self._busy_message()) from None
        self._fd = fd
        if self.exclusive:  # a reader's facts would overwrite a writer's, or another reader's
            facts = {"pid": os.getpid(), "host": socket.gethostname(), "doing": self.doing,
                     "command": " ".join(sys.argv) or sys.executable,
                     "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(facts) + "\n").encode("utf-8"), 0)
        return self

    def holder(self):
        """Who holds the lock, as the holder wrote it: ``process 123 (training since ...: mxfp16 train ...)``."""
        for _ in range(10):  # a writer that has just taken it writes its facts a moment later
            facts = _holder(self.path)
            if facts.get("pid"):
                break
            time.sleep(0.05)
        if not facts.get("pid"):
            return "another mxfp16 command (reading it)" if self.exclusive else "another mxfp16 command"
        host = "" if facts.get("host") == socket.gethostname() else f" on {facts.get('host')}"
        return (f"process {facts['pid']}{host} ({facts.get('doing', 'using it')} since {facts.get('since', '?')}: "
                f"{str(facts.get('command', '?'))[:300]})")

    def _busy_message(self):
        want = "write to" if self.exclusive else "read"
        return (f"{shown(self.folder)} is in use by {self.holder()}; this command would {want} it at the same time. "
                "Wait until that command ends (or stop it), or choose another folder")

    def release(self):
        """Let go of the lock (the kernel does the same when the process ends)."""
        if self._fd is not None:
            if self.exclusive:  # this process's facts no longer describe the holder (its PID may live on)
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None

    def forget_created_folder(self):
        """Remove the folders :meth:`acquire` created, when nothing but the lock file is in them, and release.

        For a command refused after taking the lock: it leaves no empty folder behind. The file goes
        while the lock is still held, so no other process can be holding it.
        """
        if self.created and self._fd is not None:
            with contextlib.suppress(OSError):
                if [p.name for p in self.folder.iterdir()] == [self.path.name]:
                    self.path.unlink()
                    for folder in self.created:  # deepest first; one that something else was put in stays
                        folder.rmdir()
        self.release()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False

    def __del__(self):
        self.release()
