"""The local launcher: environment per role, prefixed output, failure, timeout, Ctrl-C, hostfile plans.

The processes here are stand-ins (``tests/dist_dummy.py``, no MXNet) so each
case takes about a second; ``test_distributed.py`` runs the real kvstore.
"""
import dataclasses
import io
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time

from mxfp16 import cli
from mxfp16.distributed import LaunchError, LaunchPlanError, format_plan, host_plan, launch, local_plan, read_hostfile
from mxfp16.distributed.plan import DEFAULT_HOSTFILE_PORT, SERVER_CODE

import pytest
from conftest import REPO
from dist_support import alive

pytestmark = pytest.mark.slow

DUMMY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_dummy.py")
LIMIT = 60  # seconds; a launcher that ignores a failure would end by this timeout instead


def dummy(action, *args, folder="."):
    return (sys.executable, DUMMY, action, *map(str, args), "--dir", str(folder))


def plan(workers, servers, worker_argv, server_argv):
    """A local plan whose scheduler and servers run ``server_argv`` instead of MXNet."""
    slots = local_plan(worker_argv, workers, servers)
    return [s if s.role == "worker" else dataclasses.replace(s, argv=server_argv) for s in slots]


def with_argv(slots, name, argv):
    return [dataclasses.replace(s, argv=argv) if s.name == name else s for s in slots]


def recorded(folder, kind):
    return [int(name.split(".")[0]) for name in os.listdir(folder) if name.endswith("." + kind)]


def wait_for_files(folder, kind, count, limit=30.0):
    end = time.monotonic() + limit
    while len(recorded(folder, kind)) < count and time.monotonic() < end:
        time.sleep(0.05)
    return recorded(folder, kind)


def run_quietly(slots, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    result = launch(slots, stdout=out, stderr=err, **kwargs)
    return result, out.getvalue(), err.getvalue()


def test_local_plan_gives_each_role_its_dmlc_environment():
    slots = local_plan(["python", "train.py"], workers=3, servers=2)
    assert [s.name for s in slots] == ["scheduler", "server 0", "server 1", "worker 0", "worker 1", "worker 2"]
    port = slots[0].env["DMLC_PS_ROOT_PORT"]
    assert 1 <= int(port) <= 65535
    for s in slots:
        assert {k: v for k, v in s.env.items() if k.startswith("DMLC_")} == {"DMLC_ROLE": s.role,
                         "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": port,
                         "DMLC_NUM_WORKER": "3", "DMLC_NUM_SERVER": "2", "DMLC_NODE_HOST": "127.0.0.1"}
        assert s.argv == (("python", "train.py") if s.role == "worker" else (sys.executable, "-c", SERVER_CODE))
    assert local_plan(["x"], 1, 1, port=7000)[0].env["DMLC_PS_ROOT_PORT"] == "7000"


def test_a_local_jobs_port_is_free_below_the_ephemeral_range_and_never_given_twice():
    """Port-0 binds (every ps-lite process's own port) and outgoing connections take ephemeral ports: a scheduler
    port drawn there could be taken before the scheduler binds it, and jobs started at once collided so."""
    import random
    import socket

    from mxfp16.distributed import plan as launch_plan

    low = launch_plan.ephemeral_range()[0]
    if low - launch_plan.PORT_FLOOR < 1000:
        pytest.skip(f"this kernel's ephemeral range starts at {low}: free_port takes the kernel's pick there")
    ports = []
    threads = [threading.Thread(target=lambda: ports.extend(launch_plan.free_port() for _ in range(20)))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ports) == len(set(ports)) == 80 and all(launch_plan.PORT_FLOOR <= p < low for p in ports)
    # A port another process listens on is passed over.
    with socket.socket() as taken:
        while True:
            try:
                taken.bind(("127.0.0.1", random.randrange(launch_plan.PORT_FLOOR, low)))
                break
            except OSError:
                continue
        taken.listen()
        busy = taken.getsockname()[1]

        class Draws:
            """The listening port first, then random ones."""
            calls = 0

            def randrange(self, first, stop):
                self.calls += 1
                return busy if self.calls == 1 else random.randrange(first, stop)

        draws = Draws()
        assert launch_plan.free_port(rng=draws) not in (busy, *ports) and draws.calls >= 2


@pytest.mark.parametrize("workers, servers, port, words", [
    (0, 1, None, "--workers"), (1, 0, None, "--servers"), (1, 1, 70000, "--port")])
def test_bad_counts_are_refused(workers, servers, port, words):
    with pytest.raises(LaunchPlanError, match=words):
        local_plan(["x"], workers, servers, port)
    with pytest.raises(LaunchPlanError, match="after `--`"):
        local_plan([], 1, 1)


def test_output_is_prefixed_and_each_process_sees_its_environment(monkeypatch):
    # What each process sees is its slot's: a thread count this process was given (a shell's, an earlier
    # in-process command's) would reach the roles that set none, the scheduler among them.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    slots = plan(2, 1, dummy("env"), dummy("env"))
    result, out, err = run_quietly(slots, timeout=LIMIT)
    assert (result.returncode, result.reason) == (0, "ok")
    for s in slots:
        prefix = f"{'[' + s.name + ']':<11} "  # padded to the longest name, "[scheduler]"
        seen = dict(line[len(prefix):].split("=", 1) for line in out.splitlines() if line.startswith(prefix))
        assert seen == {k: v for k, v in s.env.items() if k.startswith("DMLC_") or k == "OMP_NUM_THREADS"}, s.name
        assert "OMP_NUM_THREADS" in seen  # the process's share of the cores reached it
        assert f"{prefix}to stderr" in err.splitlines()
    assert all(line.startswith("[") for line in out.splitlines())


def test_failed_worker_stops_everything_and_is_named(tmp_path):
    slots = plan(2, 1, dummy("spawn", folder=tmp_path), dummy("sleep", folder=tmp_path))
    slots = with_argv(slots, "worker 1", dummy("fail", 3))
    result, out, err = run_quietly(slots, timeout=LIMIT, grace=2)
    assert (result.returncode, result.reason, result.failed) == (3, "failed", "worker 1")
    assert "worker 1" in err and "status 3" in err
    # Its last words were never flushed (it died at once): the launcher made Python unbuffered.
    assert "[worker 1]  failing with status 3" in out.splitlines()
    pids = list(result.pids.values()) + recorded(tmp_path, "grandchild")
    assert len(pids) == 5
    assert not [pid for pid in pids if alive(pid)]


def test_killed_worker_fails_the_launch(tmp_path):
    slots = plan(2, 1, dummy("sleep", folder=tmp_path), dummy("sleep", folder=tmp_path))

    def kill_worker_0():
        wait_for_files(tmp_path, "pid", 4)
        os.kill(result_pids["worker 0"], signal.SIGKILL)

    result_pids = {}
    log_lines = []

    def log(text):
        log_lines.append(text)
        if text.startswith("started worker 0"):
            result_pids["worker 0"] = int(text.split("pid ")[1].rstrip(")"))
            threading.Thread(target=kill_worker_0, daemon=True).start()

    result = launch(slots, timeout=LIMIT, grace=2, stdout=io.StringIO(), stderr=io.StringIO(), log=log)
    assert (result.returncode, result.reason, result.failed) == (128 + signal.SIGKILL, "failed", "worker 0")
    assert "SIGKILL" in result.message
    assert not [pid for pid in result.pids.values() if alive(pid)]


# ---- issue 42, case 11: a process that ends early, with status 0 ----------------------------------
@pytest.mark.parametrize("leaver", ["worker 1", "server 0"])
def test_a_process_that_exits_0_early_stops_the_job_naming_it(tmp_path, leaver):
    slots = with_argv(plan(2, 1, dummy("sleep", folder=tmp_path), dummy("sleep", folder=tmp_path)), leaver,
                      dummy("fail", 0))
    start = time.monotonic()
    result, _, err = run_quietly(slots, timeout=LIMIT, grace=1)
    assert (result.returncode, result.reason, result.failed) == (1, "failed", leaver)
    assert time.monotonic() - start < LIMIT / 2  # stopped for the early exit, not by the timeout
    assert f"{leaver} (pid {result.pids[leaver]}) exited with status 0" in err and "(--grace)" in err
    assert not [pid for pid in result.pids.values() if alive(pid)]


def test_after_an_early_exit_the_stall_timeout_stops_workers_that_stop_making_progress(tmp_path):
    slots = with_argv(plan(2, 1, dummy("beat", 3, folder=tmp_path), dummy("sleep", folder=tmp_path)), "worker 1",
                      dummy("fail", 0))
    start = time.monotonic()
    result, _, err = run_quietly(slots, timeout=LIMIT, grace=1, stall=2)
    seconds = time.monotonic() - start
    # Worker 0 beats every 0.2 s for 3 s, so its last beat can come up to 0.2 s before those 3 s end; the stall
    # timeout then waits 2 s more.
    assert (result.returncode, result.failed) == (1, "worker 1") and 3 - 0.2 + 2 <= seconds < LIMIT / 2
    assert "making progress without it" in err  # told once, when the grace ran out and worker 0 still beat
    assert "then none for 2 s (--stall-timeout)" in result.message
    assert not [pid for pid in result.pids.values() if alive(pid)]


def test_workers_that_end_together_are_a_normal_end(tmp_path):
    slots = plan(2, 1, dummy("fail", 0), dummy("sleep", folder=tmp_path))  # both workers exit 0 after 0.3 s
    result, _, err = run_quietly(slots, timeout=LIMIT, grace=2)
    assert (result.returncode, result.reason) == (0, "ok") and "exited with status 0" not in err


def test_timeout_stops_a_hung_job(tmp_path):
    slots = plan(1, 1, dummy("spawn", folder=tmp_path), dummy("sleep", folder=tmp_path))
    result, _, err = run_quietly(slots, timeout=1.5, grace=2)
    assert (result.returncode, result.reason) == (124, "timeout")
    assert "timed out" in err and "worker 0" in err
    pids = list(result.pids.values()) + recorded(tmp_path, "grandchild")
    assert len(pids) == 4
    assert not [pid for pid in pids if alive(pid)]


@pytest.mark.parametrize("signum, forwarded", [(signal.SIGINT, "sigint"), (signal.SIGTERM, "sigterm"),
                                               (signal.SIGHUP, "sigterm")])
def test_a_signal_to_the_launcher_reaches_the_workers_first(tmp_path, signum, forwarded):
    """Ctrl-C is forwarded as SIGINT, SIGTERM and SIGHUP as SIGTERM (what `mxfp16 train` checkpoints on)."""
    slots = plan(2, 1, dummy("sleep", folder=tmp_path), dummy("sleep", folder=tmp_path))

    def send():
        wait_for_files(tmp_path, "pid", len(slots))
        os.kill(os.getpid(), signum)

    threading.Thread(target=send, daemon=True).start()
    result, _, err = run_quietly(slots, timeout=LIMIT, grace=3)
    assert (result.returncode, result.reason) == (128 + signum, "interrupted")
    assert f"got {signal.Signals(signum).name}" in err
    workers = {pid for name, pid in result.pids.items() if name.startswith("worker")}
    others = set(result.pids.values()) - workers
    assert set(recorded(tmp_path, "sigint")) == (workers if signum == signal.SIGINT else set())
    # The scheduler and servers ignore SIGINT; they get SIGTERM, and only once the workers are gone
    # (a worker finishing its step or shutting down its kvstore still needs them).
    first = [float((tmp_path / f"{pid}.{forwarded}").read_text()) for pid in workers]
    then = [float((tmp_path / f"{pid}.sigterm").read_text()) for pid in others]
    assert max(first) <= min(then)
    assert not [pid for pid in result.pids.values() if alive(pid)]


def test_a_grandchild_in_a_session_of_its_own_is_stopped_too(tmp_path):
    slots = plan(2, 1, dummy("setsid", folder=tmp_path), dummy("sleep", folder=tmp_path))
    slots = with_argv(slots, "worker 1", dummy("fail", 3))
    result, _, _ = run_quietly(slots, timeout=LIMIT, grace=2)
    assert (result.returncode, result.failed) == (3, "worker 1")
    grandchildren = wait_for_files(tmp_path, "grandchild", 1, limit=0)
    assert len(grandchildren) == 1
    assert not [pid for pid in list(result.pids.values()) + grandchildren if alive(pid)]


def test_the_command_line_launcher_stops_escaped_processes_on_sigterm(tmp_path):
    """``setsid`` and ``env -i setsid`` grandchildren are gone once ``mxfp16 launch`` exits 143 after SIGTERM."""
    fake_python = tmp_path / "python"  # the scheduler and server: sleepers instead of MXNet
    fake_python.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(DUMMY)} sleep "
                           f"--dir {shlex.quote(str(tmp_path))}\n")
    fake_python.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-m", "mxfp16", "launch", "--workers", "2", "--servers", "1",
                             "--python", str(fake_python), "--grace", "3", "--timeout", str(LIMIT), "--",
                             sys.executable, DUMMY, "setsid", "--dir", str(tmp_path)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Both workers and the scheduler and server sleep, and so do the two grandchildren.
        assert len(wait_for_files(tmp_path, "pid", 6, limit=LIMIT)) == 6
        grandchildren = recorded(tmp_path, "grandchild")
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=LIMIT)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    started = {name: int(pid) for name, pid in re.findall(r"started (.+?) \(pid (\d+)\)", err)}
    workers = {pid for name, pid in started.items() if name.startswith("worker")}
    assert workers <= set(recorded(tmp_path, "sigterm"))
    assert len(grandchildren) == 2
    assert not [pid for pid in list(started.values()) + grandchildren if alive(pid)]


def test_a_grandchild_that_cleared_its_environment_is_adopted_and_stopped(tmp_path):
    """Only the subreaper finds it: no job variable, no process group of the job."""
    slots = plan(1, 1, dummy("escape", folder=tmp_path), dummy("sleep", folder=tmp_path))
    # Orphans are adopted only by a process that runs nothing but the job: not this test process.
    code = f"""
        import io
        from mxfp16.distributed import launch
        from mxfp16.distributed.plan import Slot
        slots = {slots!r}
        result = launch(slots, timeout={LIMIT}, grace=2, stdout=io.StringIO(), stderr=io.StringIO(),
                        adopt_orphans=True)
        print(result.returncode)
    """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=REPO))
    try:
        # The worker, the scheduler, the server and the grandchild sleep.
        assert len(wait_for_files(tmp_path, "pid", 4, limit=LIMIT)) == 4
        grandchild, = recorded(tmp_path, "grandchild")
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=LIMIT)
    finally:
        proc.kill()
    assert out.strip() == str(128 + signal.SIGTERM), err
    assert not alive(grandchild)


def test_a_command_that_cannot_start_leaves_nothing(tmp_path):
    slots = plan(1, 1, ("/nonexistent/python",), dummy("sleep", folder=tmp_path))
    with pytest.raises(LaunchError, match="worker 0.*after `--`"):
        run_quietly(slots, timeout=LIMIT, grace=2)
    started = wait_for_files(tmp_path, "pid", 0)
    assert not [pid for pid in started if alive(pid)]


def write_hostfile(tmp_path, text):
    path = tmp_path / "hosts"
    path.write_text(text)
    return path


def test_hostfile_plan_deals_processes_to_hosts(tmp_path):
    hosts = read_hostfile(write_hostfile(tmp_path, "# cluster\nnode-a\n\nalice@node-b  # second\n"))
    assert hosts == ["node-a", "alice@node-b"]
    ips = {"node-a": "10.0.0.1", "node-b": "10.0.0.2"}
    slots = host_plan(["python", "train.py", "--epochs", "2"], workers=3, servers=2, hosts=hosts,
                      resolve=ips.__getitem__)
    lines = format_plan(slots, cwd="/data/my run").splitlines()
    expected_hosts = {"scheduler": "node-a", "server 0": "node-a", "server 1": "alice@node-b",
                      "worker 0": "node-a", "worker 1": "alice@node-b", "worker 2": "node-a"}
    assert len(lines) == 6
    for line in lines:
        name, rest = line.split(" on ", 1)
        host, command = rest.split(": ", 1)
        name = name.strip()
        assert host == expected_hosts[name]
        ssh = shlex.split(command)
        assert ssh[:4] == ["ssh", "-tt", "-o", "BatchMode=yes"] and ssh[4] == host
        remote = shlex.split(ssh[5])
        assert remote[:4] == ["cd", "/data/my run", "&&", "env"]
        env = dict(word.split("=", 1) for word in remote[4:] if "=" in word and word.startswith("DMLC_"))
        role = name.split()[0]
        # ZeroMQ binds IP addresses only: names are resolved into the plan.
        assert env == {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": "10.0.0.1",
                       "DMLC_PS_ROOT_PORT": str(DEFAULT_HOSTFILE_PORT), "DMLC_NUM_WORKER": "3",
                       "DMLC_NUM_SERVER": "2", "DMLC_NODE_HOST": ips[host.split("@")[-1]]}
        argv = remote[4 + len(env):]
        assert argv == (["python", "train.py", "--epochs", "2"] if role == "worker"
                        else [sys.executable, "-c", SERVER_CODE])


def test_launch_command_prints_the_hostfile_plan(tmp_path, capsys):
    hostfile = write_hostfile(tmp_path, "10.0.0.1\n10.0.0.2\n")
    code = cli.main(["launch", "--workers", "2", "--servers", "1", "--port", "9500", "--hostfile", str(hostfile),
                     "--", "python", "train.py"])
    assert code == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" on ")[0].strip() for line in out] == ["scheduler", "server 0", "worker 0", "worker 1"]
    assert all("DMLC_PS_ROOT_URI=10.0.0.1" in line and "DMLC_PS_ROOT_PORT=9500" in line for line in out)
    assert out[3].split(" on ")[1].startswith("10.0.0.2:")


@pytest.mark.parametrize("argv, words", [
    (["--workers", "2", "--servers", "1", "--hostfile", "/nonexistent/hosts", "--", "x"], "does not exist"),
    (["--workers", "2", "--servers", "1", "--ssh", "--", "x"], "--ssh needs --hostfile"),
    (["--workers", "0", "--servers", "1", "--", "x"], "0: must be between 1 and 4096"),
    (["--workers", "1", "--servers", "1"], "after `--`"),
    (["--workers", "1", "--servers", "1", "--timeout", "-1", "--", "x"], "--timeout"),
    # The scheduler and server start (as /bin/true), then the worker cannot.
    (["--workers", "1", "--servers", "1", "--python", "/bin/true", "--", "/nonexistent/cmd"],
     "cannot start worker 0 (/nonexistent/cmd)"),
])
def test_launch_command_refuses_bad_settings(argv, words, capsys):
    assert cli.main(["launch", *argv]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("mxfp16 launch: error: ") and words in error


def test_hosts_must_resolve_to_addresses_the_others_can_reach():
    def resolve(name):
        table = {"node-a": "10.0.0.1", "laptop": "127.0.1.1", "localhost": "127.0.0.1"}
        if name not in table:
            raise OSError("Name or service not known")
        return table[name]

    with pytest.raises(LaunchPlanError, match="cannot resolve host 'node-x'.*IP addresses"):
        host_plan(["x"], 2, 1, ["node-a", "node-x"], resolve=resolve)
    with pytest.raises(LaunchPlanError, match="'laptop' resolves to the loopback address 127.0.1.1"):
        host_plan(["x"], 2, 1, ["node-a", "laptop"], resolve=resolve)
    # One machine under two names is fine on loopback.
    assert {s.env["DMLC_NODE_HOST"] for s in host_plan(["x"], 2, 1, ["localhost"], resolve=resolve)} == {"127.0.0.1"}


def test_hostfile_errors_name_the_line(tmp_path):
    with pytest.raises(LaunchPlanError, match="lists no hosts"):
        read_hostfile(write_hostfile(tmp_path, "# nothing\n\n"))
    with pytest.raises(LaunchPlanError, match=r"hosts:2: expected one host per line"):
        read_hostfile(write_hostfile(tmp_path, "a\nb slots=2\n"))


def test_flags_after_the_separator_belong_to_the_worker_command():
    args = cli.build_parser().parse_args(["launch", "--workers", "2", "--servers", "1", "--timeout", "9", "--",
                                          "mxfp16", "train", "--workers", "0", "--timeout", "3"])
    assert (args.workers, args.servers, args.timeout) == (2, 1, 9)
    assert args.worker_command[-6:] == ["mxfp16", "train", "--workers", "0", "--timeout", "3"]
    assert args.command == "launch"  # what error messages are prefixed with


def test_local_workers_share_the_cores_unless_the_user_chose(monkeypatch):
    from mxfp16.distributed.plan import local_plan
    from mxfp16.machine.environment import available_cores

    monkeypatch.delenv("MXNET_OMP_MAX_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", str(available_cores()))
    monkeypatch.setenv("MXFP16_THREADS_SET", f"{available_cores()}:default")  # what `import mxfp16` sets
    slots = local_plan(["true"], workers=2, servers=1, port=9000)
    threads = {s.name: s.env["OMP_NUM_THREADS"] for s in slots}
    assert threads == {"scheduler": "1", "server 0": "1", "worker 0": str(max(1, available_cores() // 2)),
                       "worker 1": str(max(1, available_cores() // 2))}
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own choice reaches every process unchanged
    monkeypatch.delenv("MXFP16_THREADS_SET")
    assert all("OMP_NUM_THREADS" not in s.env for s in local_plan(["true"], workers=2, servers=1, port=9000))


def test_launch_as_a_library_leaves_the_hosts_own_children_alone(tmp_path):
    """Adopting orphans (what `mxfp16 launch` does) must not take the calling process's other children for the job's.

    A notebook pool, or any subprocess a host started beside ``launch``, sits in the host's process group;
    the job's processes and their descendants never do. In a child: adopting orphans makes it a subreaper.
    """
    slots = plan(1, 1, dummy("fail", 0), dummy("sleep", folder=tmp_path))
    code = f"""
        import io, os, subprocess, sys
        from mxfp16.distributed import launch
        from mxfp16.distributed.plan import Slot
        bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        slots = {slots!r}
        result = launch(slots, timeout={LIMIT}, grace=1, stdout=io.StringIO(), stderr=io.StringIO(),
                        adopt_orphans=True)
        alive = bystander.poll() is None
        bystander.kill()
        bystander.wait()
        print(result.returncode, alive, bystander.returncode)
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO), timeout=LIMIT * 2)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "True", str(-signal.SIGKILL)], proc.stdout + proc.stderr
