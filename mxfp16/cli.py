"""The ``mxfp16`` command: a thin dispatcher over ``mxfp16.commands``.

Each subcommand lives in its own module under ``mxfp16/commands/`` with a
``register(subparsers)`` function and an optional ``ORDER`` for its place in
``--help``; modules are found by scanning the folder, so adding a command
touches no shared file. This module is the top floor: nothing imports it.

Building the parsers imports nothing of MXNet, so ``--help`` answers at once
whatever the environment holds.
"""
import argparse
import importlib
import os
import shlex
import sys

from . import commands as _commands
from ._version import __version__
from .commands import CommandError
from .plumbing.child import end_process
from .plumbing.console import guarded_stdout, reopen_closed_streams


class CommandsUnavailable(Exception):
    """The folder of subcommand modules cannot be listed: no command can be offered at all."""


def _command_names():
    """The names of the subcommand modules, read from their folder.

    Not ``pkgutil.iter_modules``, which answers an unreadable folder with an
    empty list: the reason must reach the user.
    """
    folder = _commands.__path__[0]
    try:
        entries = os.listdir(folder)
    except OSError as err:
        raise CommandsUnavailable(
            f"cannot list mxfp16's commands in {folder}: {err.strerror}; this user cannot read the installed "
            "package (a checkout inside a private folder, such as another user's home?): install mxfp16 where "
            "this user may read it, or run it as the user who installed it") from err
    names = {name[:-3] if name.endswith(".py") else name for name in entries
             if (name.endswith(".py") or os.path.isfile(os.path.join(folder, name, "__init__.py")))}
    return sorted(name for name in names if not name.startswith("_"))


class BrokenCommand:
    """Command ``name``, whose module under ``mxfp16.commands`` raised ``error`` on import: offered, and says why."""

    ORDER = 1000

    def __init__(self, name, error):
        self.__name__ = f"mxfp16.commands.{name}"
        self.name = name
        self.error = error

    def message(self):
        return (f"its module {self.__name__} could not be imported: {type(self.error).__name__}: {self.error}; "
                "reinstall mxfp16 (`pip install -e .` in a checkout) or fix what the error names")

    def register(self, subparsers):
        parser = subparsers.add_parser(self.name, help=f"(unavailable: {self.__name__} failed to import)",
                                       add_help=False, prefix_chars="\0")  # every argument is its own
        parser.add_argument("rest", nargs="*")
        parser.set_defaults(func=self.run, broken=self)

    def run(self, args):
        raise CommandError(self.message())


def command_modules():
    """The subcommand modules, in ``--help`` order; a module that fails to import is a :class:`BrokenCommand`."""
    modules = []
    for name in _command_names():
        try:
            modules.append(importlib.import_module(f"mxfp16.commands.{name}"))
        except (ImportError, OSError) as err:  # a missing dependency, an unreadable file: say which and why
            modules.append(BrokenCommand(name, err))
    return sorted(modules, key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


#: Commands that may run where MXNet is not installed: predict of an ONNX export needs onnxruntime alone.
WITHOUT_MXNET = ("predict",)


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


def _utf8_command_line():
    """The command line that restarts this process in Python's UTF-8 mode, or ``None`` when it runs in it.

    Under ``LC_ALL=C`` with ``PYTHONUTF8=0`` Python decodes file names as
    ASCII: a class folder named in UTF-8 would look undecodable and a label
    could not be printed (plain ``LANG=C`` gets UTF-8 from Python itself, PEP 538, 540).
    """
    if sys.flags.utf8_mode or sys.getfilesystemencoding().lower().replace("-", "") == "utf8":
        return None
    return [sys.executable, "-X", "utf8", *(["-m", "mxfp16"] if sys.argv[0].endswith("__main__.py")
                                            else [sys.argv[0]]), *sys.argv[1:]]


def _error(message, command=None):
    """Print ``message`` as the command's one-line error on stderr; return the exit status 2."""
    print(f"mxfp16{' ' + command if command else ''}: error: {message}", file=sys.stderr)
    return 2


def _prepare(args):
    """Apply ``--threads``, check the environment MXNet reads, load MXNet; an exit status when that fails."""
    from .machine import environment
    from .machine.stack import import_mxnet

    threads = getattr(args, "threads", None)
    if threads is not None:
        try:
            setting, applied = environment.set_threads(environment.plan_threads(threads))
        except environment.ThreadsError as err:  # train's --threads comes from its configuration: any integer
            return _error(err)
        if setting.note:
            print(f"mxfp16: warning: {setting.note}", file=sys.stderr)
        if not applied and environment.mxnet_threads() != setting.threads:
            print(f"mxfp16: warning: --threads {setting.threads}: MXNet was already loaded in this process with "
                  f"{environment.mxnet_threads()} thread(s); the setting takes effect in a new process",
                  file=sys.stderr)
    check = environment.check_environment()
    for note in dict.fromkeys(environment.PREPARED["check"].notes + check.notes):
        print(f"mxfp16: warning: {note}", file=sys.stderr)
    if check.errors:
        for error in check.errors:
            print(f"mxfp16: error: {error}", file=sys.stderr)
        return 2
    if args.command in WITHOUT_MXNET:
        return None  # the command loads MXNet itself when the export needs it
    try:
        import_mxnet()
    except ImportError as err:
        if args.command == "info":  # info reports what it can of a broken install rather than only failing
            from .commands.info import report_broken_install

            return report_broken_install(err, as_json=getattr(args, "json", False))
        return _error(err)
    return None


def _run(args):
    """Run the parsed command; every failure the user can act on becomes one line on stderr."""
    broken = getattr(args, "broken", None)
    if broken is not None:  # nothing to prepare for a command that cannot run
        return _error(broken.message(), args.command)
    failed = _prepare(args)
    if failed is not None:
        return failed
    try:
        return args.func(args) or 0
    except KeyboardInterrupt as err:
        print("interrupted", file=sys.stderr)
        return getattr(err, "exit_status", 130)  # 143 after SIGTERM
    except CommandError as err:
        return _error(err, args.command)
    except OSError as err:  # no permission, a name too long, a full disk, a file where a folder belongs ...
        from .plumbing.output import describe_os_error

        return _error(describe_os_error(err), args.command)
    except Exception as err:  # only a failed allocation is turned into a message here
        from .plumbing.limits import allocation_message, is_allocation_failure

        if not is_allocation_failure(err):
            raise
        return _error(allocation_message(getattr(args, "batch_size", None), getattr(args, "image_size", None)),
                      args.command)


def main(argv=None):
    """:func:`console` without ending the process; MXNet loads only when a command runs."""
    reopen_closed_streams()  # `mxfp16 info >&-`: a closed stream is /dev/null, before any file is opened
    if argv is None:
        restart = _utf8_command_line()
        if restart:
            os.execv(restart[0], restart)
        argv = sys.argv[1:]
    argv = [str(a) for a in argv]
    try:
        parser = build_parser()
    except CommandsUnavailable as err:
        return _error(err)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse has printed the usage error (or --help); return its status
        return exit_.code
    if args.command is None or not getattr(args, "func", None):
        parser.print_help()
        return 2
    args.command_line = "mxfp16 " + shlex.join(argv)  # recorded by commands that write results
    with guarded_stdout() as stdout:
        status = _run(args)
    status, line = stdout.outcome(status, args.command)
    if line:
        print(line, file=sys.stderr)
    return status


def console():
    """The ``mxfp16`` console script and ``python -m mxfp16``: :func:`main`, then the process ends with its status.

    Through :func:`mxfp16.plumbing.child.end_process`: MXNet can abort a
    process in its C++ static destructors after the command has done its work.
    """
    end_process(main())
