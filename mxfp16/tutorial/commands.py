"""Running an ``mxfp16`` command from a notebook, in its own process, as a user would type it.

AMP patches MXNet for the whole process for good, so a notebook runs each precision as a fresh command.
"""
import os
import subprocess
import sys
import time
from typing import NamedTuple

__all__ = ["CommandResult", "mxfp16_command"]


class CommandResult(NamedTuple):
    """What one ``mxfp16`` command printed, and how long it took."""

    stdout: str
    stderr: str
    seconds: float

    def lines(self):
        """The non-blank lines of ``stdout``."""
        return [line for line in self.stdout.splitlines() if line.strip()]

    def __repr__(self):
        # A notebook cell that ends with the call shows this: mxfp16_command already printed the output,
        # so the repr says what is there instead of printing it all a second time.
        return f"CommandResult({len(self.lines())} lines of output, {self.seconds:.1f} s)"


def mxfp16_command(*args, show=None, env=None, echo=True, timeout=3600):
    """Run ``mxfp16 ARGS...`` in a fresh Python process and print what it printed.

    Parameters
    ----------
    *args : str
        The command line after ``mxfp16``, e.g. ``"bench", "--out", folder``.
    show : int or None
        Print only the last ``show`` non-blank lines of its output (all when ``None``; ``0``: none).
    env : dict or None
        Variables to set for the command, on top of this process's.
    echo : bool
        Print the command line first, as ``$ mxfp16 ...``.
    timeout : float

    Returns
    -------
    CommandResult

    Raises
    ------
    RuntimeError
        When the command fails: the message holds the exit status and the end of its standard error.
    """
    args = [str(a) for a in args]
    if echo:
        print("$ mxfp16", " ".join(args))
    start = time.monotonic()
    # The command line a reader would type, not a function: hence not plumbing.child's call_in_child.
    # MXNet 1.9.1 prints numpy deprecation warnings on import; they are not the command's output.
    proc = subprocess.run([sys.executable, "-m", "mxfp16", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONWARNINGS="ignore", **(env or {})))
    result = CommandResult(proc.stdout, proc.stderr, time.monotonic() - start)
    if proc.returncode != 0:
        raise RuntimeError(f"mxfp16 {' '.join(args[:1])} exited with status {proc.returncode}:\n"
                           f"{proc.stderr[-3000:]}")
    lines = result.lines()
    if show is None or show > 0:
        print("\n".join(lines if show is None else lines[-show:]))
    return result
