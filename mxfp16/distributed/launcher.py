"""Run the processes of a parameter-server job and never leave one behind.

Every process starts in its own session (its own process group), so a
signal sent to the group also reaches whatever it spawned, and a Ctrl-C in
the terminal reaches only the launcher, which forwards it. The launcher
stops the whole job when any process fails, when the run outlasts its
timeout, or on Ctrl-C / SIGTERM: first a signal (SIGTERM; after a Ctrl-C,
SIGINT to the workers so they can write a checkpoint, and SIGTERM to the
scheduler and servers once the workers are gone), then SIGKILL after a
grace period. A ``finally`` block and an ``atexit`` hook do the same on any
other way out, and on Linux each child is also told to die with the launcher.
"""
import atexit
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

__all__ = ["launch", "LaunchResult", "LaunchError", "DEFAULT_GRACE"]

DEFAULT_GRACE = 10.0
_POLL = 0.05
_TIMEOUT_STATUS = 124  # what coreutils `timeout` returns


class LaunchError(RuntimeError):
    """A process of the job could not be started at all."""


@dataclass
class LaunchResult:
    """How a launched job ended.

    Attributes
    ----------
    returncode : int
        0 when every process succeeded; the failed process's status (128 +
        signal number when a signal killed it); 124 on timeout; 128 + signal
        number when the launcher was interrupted.
    reason : str
        ``'ok'``, ``'failed'``, ``'timeout'`` or ``'interrupted'``.
    message : str
        One line for the user, naming the process that failed.
    failed : str or None
        Name of the failed process (``'worker 1'``).
    pids : dict
        Process name to PID, for every process started.
    """

    returncode: int
    reason: str
    message: str
    failed: object = None
    pids: dict = field(default_factory=dict)


def _exit_status(code):
    return 128 - code if code < 0 else code


def _describe(code):
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _die_with_parent():
    """In the child, before exec: get SIGKILL if the launcher dies (Linux's PR_SET_PDEATHSIG)."""
    _LIBC.prctl(1, signal.SIGKILL)


try:  # loaded here, not in the child between fork and exec
    _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:
    _LIBC = None


def _group_alive(pgid):
    """Whether any live (non-zombie) process is in group ``pgid``.

    A killed grandchild stays a zombie until init reaps it, and some
    container inits are slow at that; a zombie holds nothing, so on Linux
    /proc is read and zombies are ignored.
    """
    if os.path.isdir("/proc/self"):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as handle:
                        fields = handle.read().rsplit(b")", 1)[1].split()
                except OSError:
                    continue  # ended while we looked
                if int(fields[2]) == pgid and fields[0] != b"Z":
                    return True
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid, signum):
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class _Pump(threading.Thread):
    """Copy one pipe to a stream, line by line, with a prefix."""

    def __init__(self, pipe, stream, prefix, lock):
        super().__init__(daemon=True)
        self.pipe, self.stream, self.prefix, self.lock = pipe, stream, prefix, lock

    def run(self):
        with self.pipe:
            for raw in iter(self.pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                with self.lock:
                    self.stream.write(f"{self.prefix}{line}\n")
                    self.stream.flush()


class _Job:
    def __init__(self, slots, grace, stdout, stderr, env, log):
        self.slots = list(slots)
        self.grace = float(grace)
        self.stdout, self.stderr = stdout, stderr
        self.env = dict(os.environ if env is None else env)
        # Python buffers a pipe's output in blocks: lines would come late, and
        # be lost when the process is stopped. Unless the user chose otherwise.
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.log = log
        self.procs = []      # (slot, Popen)
        self.pumps = []
        self._lock = threading.Lock()
        self._signal = None

    # -- starting ---------------------------------------------------------
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
                pump = _Pump(pipe, stream, prefix, self._lock)
                pump.start()
                self.pumps.append(pump)

    # -- watching ---------------------------------------------------------
    def _on_signal(self, signum, frame):
        self._signal = signum

    def watch(self, timeout):
        """Wait until the job ends; return (reason, returncode, failed, message)."""
        deadline = None if not timeout else time.monotonic() + float(timeout)
        workers_done_at = None
        while True:
            if self._signal is not None:
                name = signal.Signals(self._signal).name
                return "interrupted", 128 + self._signal, None, f"got {name}; stopping every process"
            for slot, proc in self.procs:
                code = proc.poll()
                if code not in (None, 0):
                    return "failed", _exit_status(code), slot.name, \
                        f"{slot.name} (pid {proc.pid}) {_describe(code)}; stopping the others"
            running = [slot for slot, proc in self.procs if proc.returncode is None]
            if not running:
                return "ok", 0, None, "every process finished"
            names = ", ".join(slot.name for slot in running)
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
            time.sleep(_POLL)

    # -- stopping ---------------------------------------------------------
    def _wait_gone(self, procs):
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline:
            if all(proc.poll() is not None and not _group_alive(proc.pid) for _, proc in procs):
                return
            time.sleep(_POLL)

    def stop(self, first_signal=signal.SIGTERM):
        """Signal every process group, wait ``grace`` seconds, then SIGKILL what is left.

        After a Ctrl-C (``first_signal`` SIGINT) the workers go first and get
        up to ``grace`` seconds to finish the step and write a checkpoint: the
        step's gradient exchange and the kvstore's shutdown still need the
        servers and the scheduler, which are stopped afterwards. They run
        MXNet's C++ loop, which ignores SIGINT, so they always get SIGTERM.
        """
        workers = [(slot, proc) for slot, proc in self.procs if slot.role == "worker"]
        others = [(slot, proc) for slot, proc in self.procs if slot.role != "worker"]
        if first_signal == signal.SIGINT:
            phases = [(workers, signal.SIGINT), (others, signal.SIGTERM)]
        else:
            phases = [(self.procs, first_signal)]
        for procs, signum in phases:
            for slot, proc in procs:
                proc.poll()
                _signal_group(proc.pid, signum)
            self._wait_gone(procs)
        for slot, proc in self.procs:
            if proc.poll() is None or _group_alive(proc.pid):
                _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        for pump in self.pumps:
            pump.join(timeout=self.grace)


def launch(slots, timeout=None, grace=DEFAULT_GRACE, stdout=None, stderr=None, env=None, log=None):
    """Start ``slots``, relay their output, and stop them all when the job ends.

    Parameters
    ----------
    slots : list of Slot
        From :func:`mxfp16.distributed.plan.local_plan` (or ssh commands built from
        :func:`mxfp16.distributed.plan.host_plan`).
    timeout : float, optional
        Stop the job after this many seconds (status 124). ``None`` or 0:
        no limit.
    grace : float
        Seconds a signalled process gets before SIGKILL, and that servers get
        to exit after the last worker finished.
    stdout, stderr : text stream, optional
        Where prefixed output goes (default ``sys.stdout`` / ``sys.stderr``).
    env : dict, optional
        Base environment (default ``os.environ``); each slot adds its ``DMLC_*``.
    log : callable, optional
        Receives the launcher's own messages (default: ``stderr`` with a
        ``mxfp16 launch:`` prefix).

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
    job = _Job(slots, grace, stdout, stderr, env, log)
    atexit.register(job.stop, signal.SIGKILL)
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, job._on_signal) for s in handled}
    first_signal = signal.SIGTERM
    try:
        job.start()
        reason, code, failed, message = job.watch(timeout)
        if reason == "interrupted":
            first_signal = job._signal  # forward Ctrl-C as Ctrl-C
        log(message)
        return LaunchResult(code, reason, message, failed, {slot.name: p.pid for slot, p in job.procs})
    finally:
        job.stop(first_signal)
        atexit.unregister(job.stop)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
