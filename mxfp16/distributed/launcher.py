"""Run the processes of a parameter-server job and never leave one behind.

docs/distributed.md says when the launcher stops a job, how, and what it
cleans up. A process that ends early (status 0 while a worker still runs)
stops the job too: every process passes the kvstore's last barrier
together, so the workers would wait for it forever.
"""
import atexit
import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from . import heartbeat

__all__ = ["launch", "LaunchResult", "LaunchError", "DEFAULT_GRACE", "JOB_VARIABLE"]

DEFAULT_GRACE = 10.0
_POLL = 0.05
_TIMEOUT_STATUS = 124  # what coreutils `timeout` returns
# Inherited by every process of a job: "<token>", or "<outer token>:<token>" in a job started inside another.
JOB_VARIABLE = "MXFP16_LAUNCH_JOB"
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class LaunchError(RuntimeError):
    """A process of the job could not be started at all."""


@dataclass
class LaunchResult:
    """How a launched job ended.

    Attributes
    ----------
    returncode : int
        The exit status ``mxfp16 launch`` gives (docs/distributed.md lists them).
    reason : str
        ``'ok'``, ``'failed'``, ``'timeout'``, ``'stalled'`` or ``'interrupted'``.
    message : str
        One line for the user, naming the process that failed.
    failed : str or None
        Name of the failed process (``'worker 1'``), or of the worker that ended early.
    pids : dict
        Process name to PID, for every process started.
    """

    returncode: int
    reason: str
    message: str
    failed: object = None
    pids: dict = field(default_factory=dict)


def _describe(code):
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _die_with_parent():
    """In the child, before exec: get SIGKILL if the launcher dies (Linux's PR_SET_PDEATHSIG)."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _set_subreaper(on):
    """Make this process adopt its orphaned descendants (Linux 3.4+); whether it worked."""
    return _LIBC is not None and _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0


try:  # loaded here, not in the child between fork and exec
    _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:
    _LIBC = None


def _process_table():
    """``(pid, ppid, pgid, zombie)`` of every process, from /proc; ``None`` without /proc.

    Callers count a zombie as gone: it holds nothing, and some container
    inits are slow to reap one.
    """
    if not os.path.isdir("/proc/self"):
        return None
    table = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue  # ended while we looked
            table.append((int(entry), int(fields[1]), int(fields[2]), fields[0] == b"Z"))
    return table


def _in_job(pid, token):
    """Whether process ``pid`` inherited ``token`` in :data:`JOB_VARIABLE`."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            variables = handle.read().split(b"\0")
    except OSError:  # ended, or another user's
        return False
    prefix = JOB_VARIABLE.encode() + b"="
    return any(v.startswith(prefix) and token.encode() in v[len(prefix):].split(b":") for v in variables)


def _group_alive(pgid, table=None):
    """Whether any live (non-zombie) process is in group ``pgid`` (``table``: a :func:`_process_table`)."""
    table = _process_table() if table is None else table
    if table is not None:
        return any(group == pgid and not zombie for _, _, group, zombie in table)
    try:
        with contextlib.suppress(PermissionError):  # another user's process: alive
            os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _send(send, target, signum):
    """``send(target, signum)`` (``os.kill`` or ``os.killpg``), to a process or group that may be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        send(target, signum)


def _pump(pipe, stream, prefix, lock):
    """Copy one pipe to a stream, line by line, with a prefix."""
    with pipe:
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            with lock:
                stream.write(f"{prefix}{line}\n")
                stream.flush()


class _EarlyExit:
    """Whether a process that ended with status 0 left the workers waiting (see the module docstring)."""

    def __init__(self):
        self.name = None  # the first process that ended while a worker ran
        self._pid = self._at = self._wall = None
        self._told = False

    def check(self, procs, grace, stall, log):
        """The message that stops the job, or ``None``; ``procs``: ``(slot, Popen)`` pairs, ``stall``: a ``Watch``."""
        running = [slot.name for slot, proc in procs if slot.role == "worker" and proc.returncode is None]
        if not running:
            return None  # the workers are done: servers and the scheduler follow (watch gives them grace)
        if self.name is None:
            ended = [(slot, proc) for slot, proc in procs if proc.returncode == 0]
            if not ended:
                return None
            self.name, self._pid = ended[0][0].name, ended[0][1].pid
            self._at, self._wall = time.monotonic(), time.time()
        waited = time.monotonic() - self._at
        if waited <= grace:
            return None
        others = ", ".join(running)
        left = (f"{self.name} (pid {self._pid}) exited with status 0 {waited:.0f} s ago while {others} still "
                "ran: the processes of a parameter-server job end together, at the kvstore's last barrier, so "
                f"{others} would wait for it forever")
        latest = stall.latest() if stall is not None else None
        if latest is None or latest <= self._wall:
            return (f"{left}; none of them ended or made progress within {grace:g} s (--grace). Stopping every "
                    "process")
        if time.time() - latest > stall.stall:
            return (f"{left}; they made progress after it, then none for {stall.stall:g} s (--stall-timeout). "
                    "Stopping every process")
        if not self._told:
            self._told = True
            log(f"{self.name} (pid {self._pid}) exited with status 0 while {others} still run(s); they are making "
                f"progress without it (an asynchronous job?), so the job goes on while they do (--stall-timeout "
                f"{stall.stall:g} s)")
        return None


class _Job:
    def __init__(self, slots, grace, stdout, stderr, env, log, adopt_orphans=False, stall=0):
        self.slots, self.grace = list(slots), float(grace)
        self.stdout, self.stderr = stdout, stderr
        self.env = dict(os.environ if env is None else env)
        # Python buffers a pipe's output in blocks: lines would come late, and be lost when the process is stopped.
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.token = f"{os.getpid()}-{secrets.token_hex(6)}"
        outer = self.env.get(JOB_VARIABLE)
        self.env[JOB_VARIABLE] = f"{outer}:{self.token}" if outer else self.token
        self.adopt_orphans, self.log = adopt_orphans, log
        self.beats = self.watch_stall = None
        if stall:
            self.beats = self.env[heartbeat.VARIABLE] = tempfile.mkdtemp(prefix="mxfp16-heartbeat-")
            self.watch_stall = heartbeat.Watch(self.beats, sum(1 for s in self.slots if s.role == "worker"), stall)
        self.procs, self.pumps = [], []  # procs: (slot, Popen)
        self._lock, self._signal = threading.Lock(), None

    def start(self):
        width = max(len(s.name) for s in self.slots)
        # preexec_fn can deadlock the child when other threads exist, so it
        # is only used in a single-threaded launcher (the command line); the
        # children start before any pump thread does.
        preexec = _die_with_parent if _LIBC is not None and threading.active_count() == 1 else None
        for slot in self.slots:
            try:
                proc = subprocess.Popen(
                    list(slot.argv), env={**self.env, **slot.env}, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, preexec_fn=preexec)
            except OSError as err:
                raise LaunchError(f"cannot start {slot.name} ({' '.join(slot.argv)}): {err}; "
                                  "check the command after `--`") from err
            self.procs.append((slot, proc))
            self.log(f"started {slot.name} (pid {proc.pid})")
        for slot, proc in self.procs:
            prefix = f"{'[' + slot.name + ']':<{width + 2}} "  # aligned: "[worker 0]  ", "[scheduler] "
            for pipe, stream in ((proc.stdout, self.stdout), (proc.stderr, self.stderr)):
                pump = threading.Thread(target=_pump, args=(pipe, stream, prefix, self._lock), daemon=True)
                pump.start()
                self.pumps.append(pump)

    def _on_signal(self, signum, frame):
        self._signal = signum

    def watch(self, timeout):
        """Wait until the job ends; return ``(reason, returncode, failed, message)``."""
        deadline = None if not timeout else time.monotonic() + float(timeout)
        workers_done_at = None
        stall_checked = time.monotonic()
        early = _EarlyExit()
        while True:
            if self._signal is not None:
                name = signal.Signals(self._signal).name
                return "interrupted", 128 + self._signal, None, f"got {name}; stopping every process"
            for slot, proc in self.procs:
                code = proc.poll()
                if code not in (None, 0):
                    return "failed", (128 - code if code < 0 else code), slot.name, \
                        f"{slot.name} (pid {proc.pid}) {_describe(code)}; stopping the others"
            running = [slot for slot, proc in self.procs if proc.returncode is None]
            if not running:
                return "ok", 0, None, "every process finished"
            names = ", ".join(slot.name for slot in running)
            if stopped := early.check(self.procs, self.grace, self.watch_stall, self.log):
                return "failed", 1, early.name, stopped
            if not any(slot.role == "worker" for slot in running):
                # Servers and the scheduler end on their own once the workers
                # finalise the kvstore; do not wait forever for one that does not.
                workers_done_at = workers_done_at or time.monotonic()
                if time.monotonic() - workers_done_at > self.grace:
                    return "ok", 0, None, (f"{names} still running {self.grace:g} s after "
                                           "the workers finished; stopping them")
            if deadline is not None and time.monotonic() > deadline:
                return "timeout", _TIMEOUT_STATUS, None, (f"timed out after {float(timeout):g} s; "
                                                          f"stopping {names}")
            if self.watch_stall is not None and time.monotonic() - stall_checked > 1.0:
                stall_checked = time.monotonic()
                if stalled := self.watch_stall.stalled():
                    return "stalled", _TIMEOUT_STATUS, None, stalled
            time.sleep(_POLL)

    def _strays(self, table=None):
        """PIDs of the job's live processes outside the process groups it started (``setsid``, double forks).

        Found by the inherited :data:`JOB_VARIABLE`, and, when this process
        adopts orphans, as any other child of it outside its own process group
        (a child there was started by whatever else runs here: ``launch``
        called as a library, a notebook pool beside it).
        """
        groups = {proc.pid for _, proc in self.procs}
        me = os.getpid()
        return [pid for pid, ppid, pgid, zombie in (_process_table() if table is None else table) or []
                if not zombie and pgid not in groups and pid != me
                and ((self.adopt_orphans and ppid == me and pgid != os.getpgrp()) or _in_job(pid, self.token))]

    def _poll_all(self):
        """Update every Popen's status, and reap dead adopted orphans (only those: ``waitpid(-1)`` could take a Popen
        child's status from under it)."""
        for _, proc in self.procs:
            proc.poll()
        if self.adopt_orphans:
            ours, me = {proc.pid for _, proc in self.procs}, os.getpid()
            for pid, ppid, pgid, zombie in _process_table() or []:
                if zombie and ppid == me and pid not in ours and pgid != os.getpgrp():
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)

    def _wait_gone(self, procs, strays):
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline:
            self._poll_all()
            table = _process_table()
            if all(proc.returncode is not None and not _group_alive(proc.pid, table) for _, proc in procs) \
                    and not (strays and self._strays(table)):
                return
            time.sleep(_POLL)

    def stop(self, first_signal=signal.SIGTERM, workers_first=False):
        """Signal every process group and stray, wait ``grace`` seconds, then SIGKILL what is left.

        With ``workers_first``, the workers before the others, so that they
        can write a checkpoint: the step's gradient exchange and the kvstore's
        shutdown still need the servers and the scheduler (whose C++ loop
        ignores SIGINT).
        """
        phases = [(self.procs, first_signal, True)]
        if workers_first:
            workers = [(slot, proc) for slot, proc in self.procs if slot.role == "worker"]
            others = [(slot, proc) for slot, proc in self.procs if slot.role != "worker"]
            phases = [(workers, first_signal, False), (others, signal.SIGTERM, True)]
        for procs, signum, strays in phases:
            self._poll_all()
            for _, proc in procs:
                _send(os.killpg, proc.pid, signum)
            for pid in self._strays() if strays else ():
                _send(os.kill, pid, signum)
            self._wait_gone(procs, strays)
        for _, proc in self.procs:
            if proc.poll() is None or _group_alive(proc.pid):
                _send(os.killpg, proc.pid, signal.SIGKILL)
            proc.wait()
        # A stray may fork while we look: repeat until none is left (for at most `grace` seconds).
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline:
            self._poll_all()
            strays = self._strays()
            if not strays:
                break
            for pid in strays:
                _send(os.kill, pid, signal.SIGKILL)
            time.sleep(_POLL)
        self._poll_all()
        for pump in self.pumps:
            pump.join(timeout=self.grace)
        if self.beats:
            shutil.rmtree(self.beats, ignore_errors=True)


def launch(slots, timeout=None, grace=DEFAULT_GRACE, stdout=None, stderr=None, env=None, log=None,
           adopt_orphans=False, stall=0):
    """Start ``slots``, relay their output, and stop them all when the job ends.

    Parameters
    ----------
    slots : list of Slot
        From :func:`mxfp16.distributed.plan.local_plan` or ``host_plan`` (with ``ssh_argv``).
    timeout : float, optional
        Seconds before the job is stopped (status 124); ``None`` or 0: never.
    stall : float
        Seconds with no progress from a worker before the job is stopped (status 124; :mod:`.heartbeat`); 0: never.
    grace : float
        Seconds a signalled process gets before SIGKILL, and the servers after the last worker finished.
    stdout, stderr : text stream, optional
    env : dict, optional
        Base environment (default ``os.environ``).
    log : callable, optional
        Gets the launcher's own lines (default: ``mxfp16 launch: ...`` on stderr).
    adopt_orphans : bool
        Also stop every child of this process (a child subreaper, Linux): only
        for a process that runs nothing but the job (``mxfp16 launch``).

    Returns
    -------
    LaunchResult

    Raises
    ------
    LaunchError
        When a process cannot be started (the ones already started are stopped).
    """
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    if log is None:
        def log(text):
            stderr.write(f"mxfp16 launch: {text}\n")
            stderr.flush()
    job = _Job(slots, grace, stdout, stderr, env, log, adopt_orphans and _set_subreaper(True), stall)
    atexit.register(job.stop, signal.SIGKILL)
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, job._on_signal) for s in handled}
    stop = {}
    try:
        job.start()
        reason, code, failed, message = job.watch(timeout)
        if reason == "interrupted":
            # Forward Ctrl-C as Ctrl-C; SIGTERM, SIGHUP as SIGTERM (sent by schedulers; `mxfp16 train` checkpoints).
            stop = {"first_signal": signal.SIGINT if job._signal == signal.SIGINT else signal.SIGTERM,
                    "workers_first": True}
        log(message)
        return LaunchResult(code, reason, message, failed, {slot.name: p.pid for slot, p in job.procs})
    finally:
        job.stop(**stop)
        atexit.unregister(job.stop)
        if job.adopt_orphans:
            _set_subreaper(False)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
