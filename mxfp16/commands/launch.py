"""``mxfp16 launch``: run a command as the workers of a dist_sync kvstore job.

On this machine it starts MXNet's scheduler, the servers and the workers on
127.0.0.1, prefixes their output with role and index, forwards Ctrl-C and
SIGTERM (workers first), and stops everything -- including what the workers
started in sessions of their own -- when one process fails or ends early
(even with status 0), the timeout passes or the launcher is stopped. With
``--hostfile`` it prints the per-host ssh commands (``--ssh`` runs them).
"""
import argparse
import dataclasses

from ..distributed.heartbeat import DEFAULT_STALL
from ..distributed.launcher import DEFAULT_GRACE, LaunchError, launch
from ..distributed.plan import (
    DEFAULT_HOSTFILE_PORT,
    LaunchPlanError,
    format_plan,
    host_plan,
    local_plan,
    read_hostfile,
    ssh_argv,
)
from ..plumbing.limits import MAX_SECONDS, integer, number
from . import CommandError

ORDER = 60


def register(subparsers):
    parser = subparsers.add_parser(
        "launch", help="run COMMAND as W workers of a dist_sync job, with S servers and a scheduler",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="mxfp16 launch --workers W --servers S [options] -- COMMAND ...")
    job = parser.add_argument_group("job")
    job.add_argument("--workers", "-n", type=integer(1, 4096), required=True, metavar="W",
                     help="number of worker processes, each running COMMAND (required)")
    job.add_argument("--servers", "-s", type=integer(1, 4096), required=True, metavar="S",
                     help="number of parameter servers (required)")
    job.add_argument("--port", type=integer(1, 65535), default=None, metavar="P",
                     help="scheduler port (default: a free port in local mode, "
                          f"{DEFAULT_HOSTFILE_PORT} with --hostfile)")
    job.add_argument("--python", default=None, metavar="PATH",
                     help="interpreter for the scheduler and servers (default: the one running mxfp16)")
    stop = parser.add_argument_group("stopping")
    stop.add_argument("--timeout", type=number(0, MAX_SECONDS), default=0, metavar="SEC",
                      help="stop every process after SEC seconds and exit 124 (default: 0, no limit on the whole "
                           "job; --stall-timeout still stops a job that hangs)")
    stop.add_argument("--stall-timeout", type=number(0, MAX_SECONDS), default=DEFAULT_STALL, metavar="SEC",
                      help="stop every process and exit 124 when no worker of `mxfp16 train` has finished a step or "
                           "an evaluation batch for SEC seconds, once all of them have started; a synchronous job "
                           "whose worker stopped would otherwise wait forever. 0: never. On this machine only, not "
                           f"with --hostfile (default: {DEFAULT_STALL:g})")
    stop.add_argument("--grace", type=number(0, 3600), default=DEFAULT_GRACE, metavar="SEC",
                      help="seconds a stopped process gets before SIGKILL, that servers get to exit after the "
                           "workers finish, and that the workers get to end after a process of the job exited "
                           "early with status 0 (it is then stopped with exit 1, naming that process, unless the "
                           f"workers still make progress) (default: {DEFAULT_GRACE:g})")
    hosts = parser.add_argument_group("several machines")
    hosts.add_argument("--hostfile", default=None, metavar="FILE",
                       help="one host per line; print the ssh command of every process (default: "
                            "none, run everything on 127.0.0.1)")
    hosts.add_argument("--ssh", action="store_true",
                       help="with --hostfile, run the commands over ssh instead of printing them (default: off)")
    # Not dest="command": `mxfp16` keeps the subcommand's name there for its error prefix.
    parser.add_argument("worker_command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="what each worker runs, after `--`")
    parser.set_defaults(func=run)


def run(args):
    command = args.worker_command[1:] if args.worker_command[:1] == ["--"] else args.worker_command
    if args.timeout < 0:
        raise CommandError(f"--timeout must be >= 0 seconds (got {args.timeout:g}); 0 means no limit")
    if args.ssh and not args.hostfile:
        raise CommandError("--ssh needs --hostfile FILE (the hosts to run on)")
    try:
        if args.hostfile:
            slots = host_plan(command, args.workers, args.servers, read_hostfile(args.hostfile),
                              args.port, args.python)
            if not args.ssh:
                print(format_plan(slots))
                return 0
            # ssh carries the DMLC_* variables inside the remote command.
            slots = [dataclasses.replace(slot, argv=ssh_argv(slot), env={}) for slot in slots]
        else:
            slots = local_plan(command, args.workers, args.servers, args.port, args.python)
        # This process runs nothing but the job, so it may adopt and stop every orphan.
        result = launch(slots, timeout=args.timeout, grace=args.grace, adopt_orphans=True,
                        stall=0 if args.hostfile else args.stall_timeout)
    except (LaunchPlanError, LaunchError) as err:
        raise CommandError(str(err)) from err
    return result.returncode
