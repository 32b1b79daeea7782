"""Thin command-line front ends; each module registers one ``mxfp16`` subcommand.

A module here parses flags, calls the library and prints; it raises
:class:`CommandError` for anything the user can fix, and ``mxfp16.cli``
prints that without a traceback (exit status 2).
"""


class CommandError(Exception):
    """A user-facing failure: printed without a traceback, exit status 2."""


def add_threads_argument(group):
    """``--threads N`` for a command that computes (``mxfp16.cli`` applies it before MXNet loads)."""
    from ..environment import THREADS_DEFAULT, THREADS_HELP

    group.add_argument("--threads", type=int, default=None, metavar="N",
                       help=f"{THREADS_HELP} (default: {THREADS_DEFAULT})")
