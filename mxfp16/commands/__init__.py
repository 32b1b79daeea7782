"""Thin command-line front ends; each module registers one ``mxfp16`` subcommand.

A module here parses flags, calls the library and prints; it raises
:class:`CommandError` for anything the user can fix, and ``mxfp16.cli``
prints that without a traceback (exit status 2).
"""


class CommandError(Exception):
    """A user-facing failure: printed without a traceback, exit status 2."""


def add_threads_argument(group):
    """``--threads N`` for a command that computes (``mxfp16.cli`` applies it before MXNet loads)."""
    from ..machine.environment import THREADS_DEFAULT, THREADS_HELP, threads_argument

    group.add_argument("--threads", type=threads_argument, default=None, metavar="N",
                       help=f"{THREADS_HELP} (default: {THREADS_DEFAULT})")


def add_ctx_argument(group, one=False, where=None):
    """``--ctx`` with the one help text every command shares (:data:`mxfp16.devices.CTX_HELP`).

    Parameters
    ----------
    group : argparse parser or argument group
    one : bool
        The command runs on one device: ``auto`` means the first GPU MXNet sees, else the CPU.
    where : str, optional
        What runs there, e.g. ``'the agreement check'``.
    """
    from ..devices import CTX_HELP, ONE_DEVICE_HELP

    text = ONE_DEVICE_HELP if one else CTX_HELP
    if where:
        text = f"{text}; {where} runs there"
    group.add_argument("--ctx", default="auto", help=f"{text} (default: auto)")


def check_out(out, inputs, flag="--out", kind="folder"):
    """The writing rule for a command's output (``mxfp16.plumbing.fileio``), as a CommandError, before any work.

    ``out`` must be creatable (:func:`~mxfp16.plumbing.fileio.check_output_path`: no
    name too long, no file where a folder belongs, a folder this user may
    write to), and must not be, contain or sit inside any of ``inputs``
    (``(what, path)`` pairs; ``None`` paths are ignored), links resolved.
    """
    from ..plumbing.fileio import OutputFolderError, check_output_folder, check_output_path

    try:
        check_output_path(out, flag, kind)
        check_output_folder(out, inputs, flag)
    except OutputFolderError as err:
        raise CommandError(str(err)) from None
    return out
