"""Run an mxfp16 module in a fresh Python process and read the JSON record it writes.

AMP patches MXNet once per process and cannot be undone, so every comparison
of precisions (the benchmark, ``mxfp16 selftest``) runs each precision in its
own child. The child is ``python -m <module> <args> --result FILE`` and writes
one JSON record to ``FILE``; this function never raises for a child that
crashes or hangs, it says what happened.
"""
import os
import subprocess
import sys
import tempfile

from .fileio import read_json

__all__ = ["run_json_child"]


def run_json_child(module, args, timeout=None, env=None, python=None, tail_lines=12):
    """Run ``python -m module *args --result FILE`` and return what it wrote.

    Parameters
    ----------
    module : str
        E.g. ``'mxfp16.bench.runner'``.
    args : list of str
        Arguments before ``--result``.
    timeout : float, optional
        Seconds before the child is stopped.
    env : dict, optional
        Variables added to this process's environment for the child; a value
        of ``None`` removes that variable instead.
    python : str, optional
        The interpreter (default: this one).
    tail_lines : int
        How much of the child's error output a failure keeps.

    Returns
    -------
    (dict or None, str or None)
        The record, or ``None`` and why there is none (a timeout, or the exit
        status and the end of the child's output).
    """
    with tempfile.TemporaryDirectory(prefix="mxfp16-child-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        cmd = [python or sys.executable, "-m", module, *args, "--result", result_path]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_child_env(env))
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout:g} s"
        if os.path.exists(result_path):
            return read_json(result_path, fix=f"the child process {module} wrote it"), None
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-tail_lines:]
        return None, f"exit status {proc.returncode}: " + "\n".join(tail)


def _child_env(env):
    """This process's environment with ``env``'s variables set (``None``: removed), or ``None`` to inherit it."""
    if env is None:
        return None
    full = dict(os.environ)
    for name, value in env.items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    return full
