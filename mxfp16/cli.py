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
import sys

from . import commands as _commands
from ._version import __version__
from .commands import CommandError


def command_modules():
    """The subcommand modules, in ``--help`` order."""
    modules = [importlib.import_module(f"mxfp16.commands.{info.name}")
               for info in pkgutil.iter_modules(_commands.__path__) if not info.name.startswith("_")]
    return sorted(modules, key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


def build_parser():
    parser = argparse.ArgumentParser(
        prog="mxfp16",
        description="Mixed-precision (float16 / bfloat16) training with MXNet Gluon.",
    )
    parser.add_argument("--version", action="version", version=f"mxfp16 {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in command_modules():
        module.register(subparsers)
    return parser


def main(argv=None):
    """Entry point of the ``mxfp16`` console script and ``python -m mxfp16``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except CommandError as err:
        print(f"mxfp16 {args.command}: error: {err}", file=sys.stderr)
        return 2
