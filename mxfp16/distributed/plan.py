"""Who runs where: the processes of a parameter-server job and their environment.

MXNet's distributed kvstore (ps-lite) needs one scheduler, S servers and W workers, each told its part by ``DMLC_*``
environment variables (listed in docs/distributed.md). :mod:`mxfp16.distributed.launcher` runs what is planned here.
"""
import dataclasses
import errno
import os
import shlex
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Slot", "LaunchPlanError", "free_port", "check_port_free", "local_plan", "read_hostfile",
           "host_plan", "ssh_argv", "format_plan", "SERVER_CODE", "DEFAULT_HOSTFILE_PORT"]

LOOPBACK = "127.0.0.1"
# Importing MXNet with DMLC_ROLE=scheduler|server runs that role's loop; mxfp16 first supplies the
# numpy names MXNet 1.9.1 needs on numpy 1.24+ (mxfp16.machine.stack) and loads nothing of MXNet itself.
SERVER_CODE = "import mxfp16; import mxnet"
# A fixed default for several machines: remote ports cannot be probed from here.
DEFAULT_HOSTFILE_PORT = 9091


class LaunchPlanError(ValueError):
    """Bad launch settings: a count, a port or a hostfile that cannot work."""


@dataclass(frozen=True)
class Slot:
    """One process of the job.

    Attributes
    ----------
    role : str
        ``'scheduler'``, ``'server'`` or ``'worker'``.
    index : int
        Position among the processes of that role, from 0. It names the
        process in the launcher's output; a worker's kvstore rank
        (``kv.rank``) is assigned by the scheduler and may differ.
    host : str
        Where it runs (``127.0.0.1`` in local mode, a hostfile entry otherwise).
    argv : tuple of str
        The command, without the environment.
    env : dict
        The ``DMLC_*`` variables this process needs (added to the launcher's own).
    """

    role: str
    index: int
    host: str
    argv: tuple
    env: dict = field(default_factory=dict)

    @property
    def name(self):
        """``'scheduler'``, ``'server 0'``, ``'worker 1'`` ..."""
        return self.role if self.role == "scheduler" else f"{self.role} {self.index}"


#: Where a local job's scheduler port is drawn from: below the kernel's ephemeral range (:func:`free_port`).
PORT_FLOOR = 20000
_HANDED_OUT = set()
_HANDED_OUT_LOCK = threading.Lock()


def ephemeral_range(path="/proc/sys/net/ipv4/ip_local_port_range"):
    """``(low, high)``: the ports the kernel gives to port-0 binds and outgoing connections (Linux's default)."""
    try:
        with open(path, encoding="ascii") as handle:
            low, high = (int(v) for v in handle.read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bind_error(port, host):
    """The ``OSError`` a bind to ``host:port`` raises (``None`` when it binds), as the scheduler binds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the scheduler binds: a port left in TIME_WAIT by an ended job is free, a listening one is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            return err
    return None


def free_port(host=LOOPBACK, rng=None):
    """A TCP port that is free on ``host`` now, for a local job's scheduler.

    The scheduler binds it seconds later, once it has imported MXNet; a port
    of the kernel's ephemeral range (a port-0 bind, as every ps-lite process
    and outgoing connection takes) could be taken by then: with several jobs
    starting at once, one job's workers joined another job's scheduler. So it
    is drawn at random below that range (from :data:`PORT_FLOOR`), checked
    free, and never handed out twice by this process.
    """
    import random

    rng = rng or random.SystemRandom()
    low = ephemeral_range()[0]
    if low - PORT_FLOOR < 1000:  # a widened ephemeral range: the kernel's pick is all that is left
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return sock.getsockname()[1]
    with _HANDED_OUT_LOCK:
        for _ in range(200):
            port = rng.randrange(PORT_FLOOR, low)
            if port not in _HANDED_OUT and _bind_error(port, host) is None:
                _HANDED_OUT.add(port)
                return port
    raise LaunchPlanError(f"no free TCP port found on {host} in {PORT_FLOOR}..{low - 1} after 200 tries; "
                          "name one with --port")


def check_port_free(port, host=LOOPBACK):
    """Refuse (:class:`LaunchPlanError`) a scheduler port another process already listens on, before any starts.

    The scheduler would otherwise fail in ps-lite with a "bind failed" traceback that never says the port is taken.
    """
    err = _bind_error(int(port), host)
    if err is not None and err.errno == errno.EADDRINUSE:
        raise LaunchPlanError(f"--port {port} is taken: another process listens on {host}:{port} "
                              f"(`ss -ltnp 'sport = :{port}'` names it). Choose another --port, or leave "
                              "--port out to take a free one")
    if err is not None:
        raise LaunchPlanError(f"--port {port} cannot be used on {host} ({err.strerror}); choose another "
                              "--port, or leave it out to take a free one")


def _check_counts(workers, servers, port):
    if int(workers) < 1:
        raise LaunchPlanError(f"--workers must be at least 1 (got {workers})")
    if int(servers) < 1:
        raise LaunchPlanError(f"--servers must be at least 1 (got {servers}); the dist kvstore "
                              "keeps parameters on servers")
    if port is not None and not 1 <= int(port) <= 65535:
        raise LaunchPlanError(f"--port must be in 1..65535 (got {port})")


def _role_env(role, root_uri, root_port, workers, servers, node_host):
    """The ``DMLC_*`` variables for one process; the scheduler listens at ``root_uri:root_port``.

    ``node_host``: the address it advertises (``DMLC_NODE_HOST``); without it
    ps-lite picks the first non-loopback interface, even in local mode.
    """
    return {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": str(root_uri), "DMLC_PS_ROOT_PORT": str(int(root_port)),
            "DMLC_NUM_WORKER": str(int(workers)), "DMLC_NUM_SERVER": str(int(servers)),
            "DMLC_NODE_HOST": str(node_host)}


def _slots(command, workers, servers, port, hosts, addresses, python):
    """Scheduler on ``hosts[0]``, then servers and workers dealt to the hosts; ``addresses`` maps host to IP."""
    command = tuple(command)
    if not command:
        raise LaunchPlanError("no worker command; put it after `--`, e.g. "
                              "`mxfp16 launch --workers 2 --servers 1 -- python train.py`")
    server_argv = (python or sys.executable, "-c", SERVER_CODE)
    root = addresses[hosts[0]]
    slots = [Slot("scheduler", 0, hosts[0], server_argv, _role_env("scheduler", root, port, workers, servers, root))]
    for role, count, argv in (("server", servers, server_argv), ("worker", workers, command)):
        for i in range(count):
            host = hosts[i % len(hosts)]
            slots.append(Slot(role, i, host, argv, _role_env(role, root, port, workers, servers, addresses[host])))
    return slots


def local_plan(command, workers, servers, port=None, python=None):
    """The processes of a job on this machine, all on loopback.

    Parameters
    ----------
    command : sequence of str
        What each worker runs.
    workers, servers : int
    port : int, optional
        The scheduler's port; a free one is picked when ``None``.
    python : str, optional
        Interpreter for the scheduler and servers (default: this one).

    Returns
    -------
    list of Slot
        Scheduler first, then servers, then workers.
    """
    _check_counts(workers, servers, port)
    if port is not None:
        check_port_free(port)
    port = free_port() if port is None else int(port)
    return _share_cores(_slots(command, int(workers), int(servers), port, [LOOPBACK], {LOOPBACK: LOOPBACK}, python))


def _share_cores(slots):
    """Split this machine's cores between the workers of a local job (``OMP_NUM_THREADS`` per process).

    Else W workers on C cores would run W x C threads. The scheduler and the
    servers move bytes, not tensors: one thread each. A count the user chose
    (``OMP_NUM_THREADS`` or ``MXNET_OMP_MAX_THREADS``) is left as it is.
    """
    from ..machine.environment import available_cores, thread_report

    if thread_report()["source"] in ("OMP_NUM_THREADS", "MXNET_OMP_MAX_THREADS"):
        return slots
    workers = sum(1 for s in slots if s.role == "worker")
    per_worker = max(1, available_cores() // max(workers, 1))
    shared = []
    for slot in slots:
        threads = per_worker if slot.role == "worker" else 1
        env = dict(slot.env, OMP_NUM_THREADS=str(threads), MXFP16_THREADS_SET=f"{threads}:mxfp16 launch")
        shared.append(dataclasses.replace(slot, env=env))
    return shared


def read_hostfile(path):
    """Hosts from a hostfile: one ``host`` or ``user@host`` per line, ``#`` comments.

    A missing or empty file, or a line of more than one word, raises :class:`LaunchPlanError`.
    """
    path = Path(path)
    if not path.is_file():
        raise LaunchPlanError(f"hostfile {str(path)!r} does not exist; write one host per line")
    hosts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) > 1:
            raise LaunchPlanError(f"{path}:{number}: expected one host per line, got {line.strip()!r}")
        hosts.append(words[0])
    if not hosts:
        raise LaunchPlanError(f"hostfile {str(path)!r} lists no hosts; write one host per line")
    return hosts


def _address(host):
    return host.rsplit("@", 1)[-1]


def _ip_addresses(hosts, resolve):
    """Each host's IP address: ps-lite binds to the address a process advertises, and ZeroMQ binds IPs only."""
    addresses = {}
    for host in hosts:
        try:
            addresses[host] = resolve(_address(host))
        except OSError as err:
            raise LaunchPlanError(f"cannot resolve host {_address(host)!r} here ({err}); list IP addresses "
                                  "in the hostfile, or names this machine resolves") from err
    if len(set(addresses.values())) > 1:
        for host, ip in addresses.items():
            if ip.startswith("127."):
                raise LaunchPlanError(f"host {_address(host)!r} resolves to the loopback address {ip} here, "
                                      "which the other hosts cannot reach; list its network address in the hostfile")
    return addresses


def host_plan(command, workers, servers, hosts, port=None, python=None, resolve=socket.gethostbyname):
    """The processes of a job spread over ``hosts``: the scheduler on the first, servers and workers dealt in turn.

    A host that does not resolve, or resolves to loopback in a job of several machines, raises :class:`LaunchPlanError`.

    Parameters
    ----------
    command : sequence of str
    workers, servers : int
    hosts : list of str
        From :func:`read_hostfile`.
    port : int, optional
        The scheduler's port (default :data:`DEFAULT_HOSTFILE_PORT`): free on
        the first host, reachable from the others.
    python : str, optional
        Interpreter for the scheduler and servers (default: this one's path,
        on every host).
    resolve : callable
        Host name to the IP address each process advertises (``DMLC_NODE_HOST``).

    Returns
    -------
    list of Slot
    """
    _check_counts(workers, servers, port)
    port = DEFAULT_HOSTFILE_PORT if port is None else int(port)
    addresses = _ip_addresses(hosts, resolve)
    return _slots(command, int(workers), int(servers), port, list(hosts), addresses, python)


def ssh_argv(slot, cwd=None):
    """The ``ssh`` command that runs ``slot`` on its host, in ``cwd`` (default: this folder).

    ``-tt`` gives the remote command a terminal, so stopping the local ssh
    (Ctrl-C, a failure elsewhere) hangs up and ends the remote process too.
    """
    cwd = os.getcwd() if cwd is None else cwd
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(slot.env.items()))
    remote = f"cd {shlex.quote(str(cwd))} && env {assignments} {shlex.join(slot.argv)}"
    return ("ssh", "-tt", "-o", "BatchMode=yes", slot.host, remote)


def format_plan(slots, cwd=None):
    """One line per process, ``<name> on <host>: <ssh command>``, ready to paste."""
    width = max(len(s.name) for s in slots)
    return "\n".join(f"{s.name:<{width}} on {s.host}: {shlex.join(ssh_argv(s, cwd))}" for s in slots)
