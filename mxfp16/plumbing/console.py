"""A standard output that may close or fill up under a command: printing stops, the command goes on.

``mxfp16 info | head -1`` closes the pipe after one line; ``train ... | head
-1`` closes it after the first epoch; ``> /dev/full`` fails every write.
Python raises ``BrokenPipeError`` or ``OSError`` at the next write or flush
(which, with a pipe's block buffering, may be far from the ``print`` that
filled the buffer), and at exit prints "Exception ignored ... BrokenPipeError"
and exits 120. :func:`guarded_stdout` wraps ``sys.stdout`` for the length of
a command: the first failed write is kept, standard output is pointed at
``/dev/null`` so nothing later (nor the interpreter's last flush) fails
again, and the command runs to its end: a training run keeps training and
writing its files. :meth:`GuardedStdout.outcome` then says how the command
ends: a closed pipe quietly (the reader wanted no more), any other failure
with one line naming it.
"""
import contextlib
import errno
import os
import sys

__all__ = ["GuardedStdout", "guarded_stdout"]


class GuardedStdout:
    """``sys.stdout`` for one command: writes that fail are dropped from then on, and the failure kept.

    Parameters
    ----------
    stream : text stream
        The standard output to guard.

    Attributes
    ----------
    failure : OSError or None
        The first write or flush that failed.
    """

    def __init__(self, stream):
        self._stream = stream
        self.failure = None

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


@contextlib.contextmanager
def guarded_stdout():
    """Replace ``sys.stdout`` with a :class:`GuardedStdout` while the block runs; yield it."""
    original = sys.stdout
    guard = GuardedStdout(original)
    sys.stdout = guard
    try:
        yield guard
    finally:
        sys.stdout = original
