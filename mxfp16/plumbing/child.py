"""Run a function in a fresh Python process and read back what it returned: mxfp16's one child protocol.

AMP patches MXNet once per process and cannot be undone, and an MXNet error is
asynchronous and can leave the process that met it unusable; so every
comparison of precisions (the benchmark, ``mxfp16 selftest``, the AMP tables)
and every probe of what MXNet does on this CPU runs in a child of its own,
through :func:`call_in_child` (a function, run by this module's :func:`main`)
or :func:`run_json_child` (a module with a main of its own). The child writes
``{"result": value}`` or ``{"error": traceback}``; the parent never raises for
a child that fails, so a benchmark or a self-test records the failure and
goes on. :func:`end_process` is how that child, and every ``mxfp16`` command,
ends.
"""
import argparse
import atexit
import contextlib
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, is_dataclass
from pathlib import Path

from .fileio import read_json, write_json

__all__ = ["call_in_child", "run_json_child", "main", "end_process"]


def call_in_child(function, spec=None, timeout=None, env=None, python=None, tail_lines=12, fork=False):
    """Call ``function(spec)`` (``function()`` without a spec) in a fresh process and return what it returned.

    Parameters
    ----------
    function : callable or str
        A module-level function, or ``'module:function'`` (a tool's, run from
        a script whose functions name ``__main__`` as their module); with
        ``fork``, any callable.
    spec : dataclass, JSON value or None
        The one argument; a dataclass arrives as its class, anything else as JSON gives it back.
        With ``fork``, any object: the child has this process's memory.
    timeout, env, python, tail_lines
        As :func:`run_json_child` (``env`` and ``python`` do not apply to a fork).
    fork : bool
        Run it in a forked copy of this process rather than a new interpreter.
        The caller makes sure the fork is safe (MXNet: its engine drained first).

    Returns
    -------
    (object or None, str or None)
        The value and ``None``; or ``None`` and why there is none: the
        child's traceback when the function raised, else what
        :func:`run_json_child` says (a timeout, or the exit status and the end of its error output).
    """
    if fork:
        record, problem = _run_forked(function, spec, timeout)
    else:
        args = [function if isinstance(function, str) else f"{function.__module__}:{function.__qualname__}"]
        with tempfile.TemporaryDirectory(prefix="mxfp16-spec-") as tmp:
            if spec is not None:  # in a file: a long spec (a network's layers) would pass the length of one argument
                spec_path = os.path.join(tmp, "spec.json")
                args += ["--spec-file", spec_path]
                if is_dataclass(spec):
                    args += ["--spec-type", f"{type(spec).__module__}:{type(spec).__qualname__}"]
                Path(spec_path).write_text(json.dumps(asdict(spec) if is_dataclass(spec) else spec), encoding="utf-8")
            record, problem = run_json_child(__name__, args, timeout=timeout, env=env, python=python,
                                             tail_lines=tail_lines)
    if record is None or "error" in record:
        return None, problem or record["error"]
    return record["result"], None


def _record_of(function, spec):
    """``{"result": function(spec)}``, or ``{"error": traceback}`` when it raised: what a child sends back."""
    try:
        return {"result": function() if spec is None else function(spec)}
    except Exception:  # the parent reports it (a failed row, a failed run) and carries on
        return {"error": traceback.format_exc(limit=8).strip()}


def _run_forked(function, spec, timeout):
    """:func:`call_in_child` in a forked copy of this process: the record comes back as one JSON line on a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: call, send one line, leave without the parent's exit handlers
        os.close(read_end)
        try:
            line = json.dumps(_record_of(function, spec))
        except BaseException:  # noqa: B036 -- a value JSON cannot hold, or an exit: reported, never raised here
            line = json.dumps({"error": traceback.format_exc(limit=4).strip()})
        os.write(write_end, (line + "\n").encode())
        os._exit(0)
    os.close(write_end)
    chunks, deadline = [], None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and (left <= 0 or not select.select([read_end], [], [], left)[0]):
                os.kill(pid, signal.SIGKILL)
                return None, f"timed out after {timeout:g} s"
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    try:
        return json.loads(b"".join(chunks).decode(errors="replace")), None
    except ValueError:
        code = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status  # 3.9+
        return None, f"the forked process ended (status {code}) with no record"


def run_json_child(module, args, timeout=None, env=None, python=None, tail_lines=12):
    """Run ``python -m module *args --result FILE`` and return what it wrote.

    Parameters
    ----------
    module : str
        E.g. ``'mxfp16.per_layer'``.
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
    return {name: value for name, value in {**os.environ, **env}.items() if value is not None}


def _named(text):
    """The object ``'module:qualified.name'`` names."""
    module, _, name = text.partition(":")
    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def main(argv=None):
    """The child's side of :func:`call_in_child`: call the function named, write its value or its traceback."""
    parser = argparse.ArgumentParser(prog="python -m mxfp16.plumbing.child")
    parser.add_argument("function", help="module:function")
    given = parser.add_mutually_exclusive_group()
    given.add_argument("--spec", help="the function's argument, as JSON")
    given.add_argument("--spec-file", help="a file holding the function's argument as JSON")
    parser.add_argument("--spec-type", help="module:Class the spec is rebuilt as (default: the JSON value)")
    parser.add_argument("--result", required=True, help="the JSON file {'result': ...} or {'error': ...} goes to")
    args = parser.parse_args(argv)
    text = Path(args.spec_file).read_text(encoding="utf-8") if args.spec_file else args.spec
    try:
        function = _named(args.function)
        kind = _named(args.spec_type) if args.spec_type else None
        spec = None if text is None else json.loads(text) if kind is None else (
            kind.from_json(text) if hasattr(kind, "from_json") else kind(**json.loads(text)))
    except Exception:  # a function or spec that does not load: reported as the function's own failure
        record = {"error": traceback.format_exc(limit=8).strip()}
    else:
        record = _record_of(function, spec)
    write_json(args.result, record)
    return 1 if "error" in record else 0


def end_process(code=0):
    """End this process with exit status ``code`` as Python would, short of the C++ runtime's static destructors.

    MXNet 1.9.1's engine threads still run when the C++ runtime destroys
    static objects at exit (apache/mxnet#17653, #19379), and now and then
    the process aborts there, its work done and its output written:
    "terminate called without an active exception", exit status 134
    (docs/getting-started.md, "MXNet's abort at exit", says how often).
    So mxfp16's commands and children end here: what Python's own shutdown
    runs first runs (the ``atexit`` handlers: MXNet's ``MXNotifyShutdown``,
    logging's flush ...), the standard streams are flushed, and the process
    leaves with ``os._exit``.
    A library user's process ends as Python and MXNet end it: only
    mxfp16's entry points call this.

    Parameters
    ----------
    code : int or None
        The exit status (``None``: 0, as ``sys.exit`` reads it).
    """
    # CPython's own shutdown, in its order: threading's (its exit hooks, concurrent.futures stopping idle workers,
    # then every non-daemon thread joined), then the atexit handlers.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # closed, None or a broken pipe
            stream.flush()
    os._exit(0 if code is None else int(code))


if __name__ == "__main__":
    end_process(main())
