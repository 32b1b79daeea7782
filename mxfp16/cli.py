"""The ``mxfp16`` command: a thin dispatcher over ``mxfp16.commands``.

Each subcommand lives in its own module under ``mxfp16/commands/`` with a
``register(subparsers)`` function that adds its parser and sets ``func``, and
an optional ``ORDER`` number for its place in ``--help``. Modules are found by
scanning the folder, so adding a command touches no shared file. The library
does the work; commands only parse flags, call it and print. This module is
the top floor: it imports ``commands``, and nothing imports it.
"""
import argparse
import importlib
import pkgutil
import shlex
import sys

from . import commands as _commands
from ._version import __version__
from .commands import CommandError


def command_modules():
    """The subcommand modules, in ``--help`` order."""
    modules = [importlib.import_module(f"mxfp16.commands.{info.name}")
               for info in pkgutil.iter_modules(_commands.__path__) if not info.name.startswith("_")]
    return sorted(modules, key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


#: Commands that may run where MXNet is not installed: predict of an ONNX export needs onnxruntime alone.
WITHOUT_MXNET = ("predict",)


def build_parser(only=None):
    """The ``mxfp16`` parser with every subcommand, or with ``only`` that one (its module alone is imported)."""
    parser = argparse.ArgumentParser(
        prog="mxfp16",
        description="Mixed-precision (float16 / bfloat16) training with MXNet Gluon.",
    )
    parser.add_argument("--version", action="version", version=f"mxfp16 {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    if only is not None:
        importlib.import_module(f"mxfp16.commands.{only}").register(subparsers)
        return parser
    for module in command_modules():
        module.register(subparsers)
    return parser


def requested_threads(argv):
    """The value of ``--threads`` among a command's own flags (before any ``--``), or ``None``.

    It is read before the parser exists because building the parser loads
    MXNet, and MXNet fixes its thread count when it loads.
    """
    for index, token in enumerate(argv):
        if token == "--":  # what follows belongs to another command (mxfp16 launch -- ...)
            break
        if token == "--threads":
            return argv[index + 1] if index + 1 < len(argv) else None
        if token.startswith("--threads="):
            return token.split("=", 1)[1]
    return None


def _prepare(argv):
    """Apply ``--threads``, then load MXNet; return an exit status when that fails, else ``None``."""
    from .machine.stack import import_mxnet
    from .machine.environment import ThreadsError, mxnet_threads, plan_threads, set_threads

    requested = requested_threads(argv)
    if requested is not None:
        try:
            setting, applied = set_threads(plan_threads(requested))
        except ThreadsError as err:
            print(f"mxfp16: error: {err}", file=sys.stderr)
            return 2
        if setting.note:
            print(f"mxfp16: warning: {setting.note}", file=sys.stderr)
        if not applied and mxnet_threads() != setting.threads:
            print(f"mxfp16: warning: --threads {setting.threads}: MXNet was already loaded in this process with "
                  f"{mxnet_threads()} thread(s); the setting takes effect in a new process", file=sys.stderr)
    if argv[:1] and argv[0] in WITHOUT_MXNET:
        return None  # the command loads MXNet itself when the export needs it
    try:
        import_mxnet()
    except ImportError as err:
        if argv[:1] == ["info"]:  # info reports what it can of a broken install rather than only failing
            from .commands.info import report_broken_install

            return report_broken_install(err, as_json="--json" in argv)
        print(f"mxfp16: error: {err}", file=sys.stderr)
        return 2
    return None


def main(argv=None):
    """Entry point of the ``mxfp16`` console script and ``python -m mxfp16``."""
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    failed = _prepare(argv)
    if failed is not None:
        return failed
    parser = build_parser(argv[0] if argv[:1] and argv[0] in WITHOUT_MXNET else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse has printed the usage error (or --help); return its status
        return exit_.code
    if args.command is None:  # no subcommand
        parser.print_help()
        return 2
    args.command_line = "mxfp16 " + shlex.join(argv)  # recorded by commands that write results
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except KeyboardInterrupt as err:
        print("interrupted", file=sys.stderr)
        return getattr(err, "exit_status", 130)  # 143 after SIGTERM
    except CommandError as err:
        print(f"mxfp16 {args.command}: error: {err}", file=sys.stderr)
        return 2
