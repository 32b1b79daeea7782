"""A standard output that may close or fill up under a command: printing stops, the command goes on.

After ``mxfp16 info | head -1`` or ``> /dev/full`` Python raises
``BrokenPipeError`` or ``OSError`` at the next write or flush (with a pipe's
block buffering, perhaps far from the ``print`` that filled the buffer), and
at exit prints "Exception ignored ... BrokenPipeError" and exits 120.
:func:`guarded_stdout` keeps the first failure, points standard output at
``/dev/null`` and lets the command run to its end (a training run keeps
training); :meth:`GuardedStdout.outcome` ends a closed pipe quietly, any
other failure with one line naming it.

A stream closed before the command started (``mxfp16 info >&-``) is ``None``
in :mod:`sys`, and the next file the process opens takes its descriptor, so
C code that prints (MXNet's log lines) would write into that file, a
checkpoint say: :func:`reopen_closed_streams` gives it ``/dev/null`` first.
"""
import contextlib
import errno
import os
import sys

__all__ = ["GuardedStdout", "guarded_stdout", "reopen_closed_streams"]


class GuardedStdout:
    """``sys.stdout`` for one command: writes that fail are dropped from then on, and the failure kept.

    Parameters
    ----------
    stream : text stream

    Attributes
    ----------
    failure : OSError or None
        The first write or flush that failed.
    """

    def __init__(self, stream):
        self._stream, self.failure = stream, None

    def write(self, text):
        if self.failure is None:
            try:
                return self._stream.write(text)
            except OSError as err:
                self._failed(err)
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        if self.failure is None:
            try:
                self._stream.flush()
            except OSError as err:
                self._failed(err)

    def __getattr__(self, name):  # encoding, isatty, fileno ...: what the stream says
        return getattr(self._stream, name)

    def _failed(self, err):
        self.failure = err
        with contextlib.suppress(OSError, ValueError, AttributeError):
            # Later writes of C code, and the interpreter's flush of what is still buffered, go nowhere.
            fd = self._stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)

    def outcome(self, status, command):
        """The command's exit status and the line to print on stderr (``None``), once it has finished.

        A closed pipe (``EPIPE``) ends the command quietly with its own
        status; any other failure (a full disk, an I/O error) is an error:
        status 2 unless the command failed already.
        """
        self.flush()
        err = self.failure
        if err is None or err.errno == errno.EPIPE:
            return status, None
        line = (f"mxfp16 {command}: error: standard output could not be written ({err.strerror or err}); what the "
                "command printed from then on was lost (its files, if it writes any, are complete). Send the "
                "output to a file on a disk with space, or to a terminal")
        return (status or 2), line


#: The standard streams: descriptor, name in :mod:`sys`, how each is opened.
_STREAMS = ((0, "stdin", os.O_RDONLY, "r"), (1, "stdout", os.O_WRONLY, "w"), (2, "stderr", os.O_WRONLY, "w"))


def reopen_closed_streams():
    """Give every standard stream that is closed ``/dev/null``: its descriptor, and its object in :mod:`sys`.

    Returns
    -------
    list of str
        The names of the streams reopened (``['stdout']`` under ``>&-``).
    """
    reopened = []
    for fd, name, flags, mode in _STREAMS:
        try:
            os.fstat(fd)
        except OSError:  # closed: the lowest free descriptor, so the streams are taken in order
            null = os.open(os.devnull, flags)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            # closefd=False: the descriptor is the process's standard stream, never this object's to close.
            setattr(sys, name, open(fd, mode, encoding="utf-8", errors="backslashreplace", closefd=False))
            reopened.append(name)
    return reopened


@contextlib.contextmanager
def guarded_stdout():
    """Replace ``sys.stdout`` with a :class:`GuardedStdout` while the block runs; yield it."""
    original = sys.stdout
    sys.stdout = guard = GuardedStdout(original)
    try:
        yield guard
    finally:
        sys.stdout = original
