"""Helpers shared by the launcher and distributed tests: process liveness and launches.

Jobs run through the launcher library in threads of the test process
(:func:`launch_jobs`) rather than through ``python -m mxfp16 launch``: each
command-line launcher would import MXNet once more, a few CPU-seconds per job
on a 2-core machine. ``start_launch`` keeps one job on the command line.
"""
import io
import os
import re
import subprocess
import sys
import threading

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STARTED = re.compile(r"^mxfp16 launch: started (.+?) \(pid (\d+)\)$", re.M)


def alive(pid):
    """True while ``pid`` exists and is not a zombie (read from /proc, no psutil)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def started_pids(launcher_stderr):
    """Process name to PID, from the launcher's ``started ... (pid N)`` lines."""
    return {name: int(pid) for name, pid in _STARTED.findall(launcher_stderr)}


def start_launch(workers, servers, command, timeout):
    """Start ``python -m mxfp16 launch`` in the background; ``finish`` collects it."""
    argv = [sys.executable, "-m", "mxfp16", "launch", "--workers", str(workers), "--servers", str(servers),
            "--timeout", str(timeout), "--grace", "3", "--", *command]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout):
    """Wait for a :func:`start_launch` process (killing it past ``timeout``); return (code, out, err)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"mxfp16 launch did not end within {timeout} s:\n{out}\n{err}") from None
    return proc.returncode, out, err


def launch_jobs(commands, workers, servers, timeout, grace=3):
    """Run several launcher jobs at once, each in a thread; return {name: result dict}.

    Each result has ``code``, ``out``, ``err`` (the prefixed output and the
    launcher's messages) and ``pids`` (process name to PID).
    """
    from mxfp16.distributed import launch, local_plan

    results = {}

    def run(name, command):
        out, err = io.StringIO(), io.StringIO()
        result = launch(local_plan([str(a) for a in command], workers, servers), timeout=timeout, grace=grace,
                        stdout=out, stderr=err)
        results[name] = {"code": result.returncode, "out": out.getvalue(), "err": err.getvalue(),
                         "pids": result.pids, "failed": result.failed}

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in commands.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 60)  # the launcher's own timeout ends every job before this
    missing = set(commands) - set(results)
    assert not missing, f"launcher thread for {sorted(missing)} did not return"
    return results
