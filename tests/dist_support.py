"""Helpers shared by the launcher and distributed tests: process liveness and CLI launches."""
import os
import re
import subprocess
import sys

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
        raise AssertionError(f"mxfp16 launch did not end within {timeout} s:\n{out}\n{err}")
    return proc.returncode, out, err
