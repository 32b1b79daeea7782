"""Thin command-line front ends; each module registers one ``mxfp16`` subcommand.

A module here parses flags, calls the library and prints; it raises
:class:`CommandError` for anything the user can fix, and ``mxfp16.cli``
prints that without a traceback (exit status 2).
"""
import contextlib


class CommandError(Exception):
    """A user-facing failure: printed without a traceback, exit status 2."""


def add_threads_argument(group):
    """``--threads N`` for a command that computes (``mxfp16.cli`` applies it before MXNet loads)."""
    from ..machine.environment import THREADS_DEFAULT, THREADS_HELP, threads_argument

    group.add_argument("--threads", type=threads_argument, default=None, metavar="N",
                       help=f"{THREADS_HELP} (default: {THREADS_DEFAULT})")


def add_ctx_argument(group, one=False, where=None):
    """``--ctx`` with the one help text every command shares; ``one``: the command runs on one device; ``where``:
    what runs there, e.g. ``'the agreement check'``."""
    from ..devices import CTX_HELP, ONE_DEVICE_HELP

    text = (ONE_DEVICE_HELP if one else CTX_HELP) + (f"; {where} runs there" if where else "")
    group.add_argument("--ctx", default="auto", help=f"{text} (default: auto)")


@contextlib.contextmanager
def open_output(path, doing, overwrite, inputs=(), flag="--out", kind="folder", contents=None, refusal=None):
    """The command's output (:class:`mxfp16.plumbing.output.Output`, which says what it checks and refuses), opened
    before any work; its refusals as a CommandError. ``None`` for an optional output not asked for."""
    from ..plumbing.output import Output, OutputFolderError, PathBusyError

    if path is None:
        yield None
        return
    try:
        with Output(path, doing, kind=kind, overwrite=overwrite, inputs=inputs, flag=flag, contents=contents,
                    refusal=refusal) as output:
            yield output
    except (OutputFolderError, PathBusyError) as err:
        raise CommandError(str(err)) from None


def add_overwrite_argument(group, what="--out"):
    """``--overwrite`` with the one help text every writing command shares."""
    group.add_argument("--overwrite", action="store_true",
                       help=f"replace {what} when it exists, whole, once the new output is complete (default: off: "
                            "refused when it exists)")
