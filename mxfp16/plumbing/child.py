"""Run a function in a fresh Python process and read back what it returned: mxfp16's one child protocol.

AMP patches MXNet once per process and cannot be undone, and an MXNet error is
asynchronous and can leave the process that met it unusable; so every
comparison of precisions (the benchmark, ``mxfp16 selftest``, the AMP tables)
and every probe of what MXNet does on this CPU runs in a child of its own:

* the parent calls :func:`call_in_child` with a function (or
  ``'module:function'``) and its spec: a dataclass (sent as JSON and rebuilt
  as its class, by its ``from_json`` where it has one), any JSON value, or none;
* the child is ``python -m mxfp16.plumbing.child module:function [--spec JSON
  [--spec-type module:Class]] --result FILE``: :func:`main` imports the
  function, calls it with the spec, and writes ``{"result": value}`` to
  ``FILE``, or ``{"error": traceback}`` when it raised;
* the parent gets ``(value, None)`` or ``(None, why)``: it never raises for a
  child that fails, so a benchmark or a self-test records the failure and goes on.

:func:`run_json_child` is the layer below, for a module with a main of its
own: ``python -m module ARGS --result FILE``, the record read back.
"""
import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from dataclasses import asdict, is_dataclass

from .fileio import read_json, write_json

__all__ = ["call_in_child", "run_json_child", "main"]


def call_in_child(function, spec=None, timeout=None, env=None, python=None, tail_lines=12):
    """Call ``function(spec)`` (``function()`` without a spec) in a fresh process and return what it returned.

    Parameters
    ----------
    function : callable or str
        A module-level function, or ``'module:function'`` (a tool's, run from
        a script whose functions name ``__main__`` as their module).
    spec : dataclass, JSON value or None
        The one argument; a dataclass arrives as its class, anything else as JSON gives it back.
    timeout, env, python, tail_lines
        As :func:`run_json_child`.

    Returns
    -------
    (object or None, str or None)
        The value and ``None``; or ``None`` and why there is none: the
        child's traceback when the function raised, else what
        :func:`run_json_child` says (a timeout, or the exit status and the end of its error output).
    """
    args = [function if isinstance(function, str) else f"{function.__module__}:{function.__qualname__}"]
    if is_dataclass(spec):
        kind = type(spec)
        args += ["--spec", spec.to_json() if hasattr(spec, "to_json") else json.dumps(asdict(spec)),
                 "--spec-type", f"{kind.__module__}:{kind.__qualname__}"]
    elif spec is not None:
        args += ["--spec", json.dumps(spec)]
    record, problem = run_json_child(__name__, args, timeout=timeout, env=env, python=python, tail_lines=tail_lines)
    if record is None or "error" in record:
        return None, problem or record["error"]
    return record["result"], None


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
    full = dict(os.environ)
    for name, value in env.items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    return full


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
    parser.add_argument("--spec", help="the function's argument, as JSON")
    parser.add_argument("--spec-type", help="module:Class the spec is rebuilt as (default: the JSON value)")
    parser.add_argument("--result", required=True, help="the JSON file {'result': ...} or {'error': ...} goes to")
    args = parser.parse_args(argv)
    try:
        function = _named(args.function)
        if args.spec is None:
            value = function()
        else:
            kind = _named(args.spec_type) if args.spec_type else None
            spec = json.loads(args.spec) if kind is None else (
                kind.from_json(args.spec) if hasattr(kind, "from_json") else kind(**json.loads(args.spec)))
            value = function(spec)
    except Exception:  # the parent reports it (a failed row, a failed run) and carries on
        write_json(args.result, {"error": traceback.format_exc(limit=8).strip()})
        return 1
    write_json(args.result, {"result": value})
    return 0


if __name__ == "__main__":
    sys.exit(main())
