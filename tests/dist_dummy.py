"""Stand-in processes for the launcher tests (no MXNet, so they start fast).

``python tests/dist_dummy.py ACTION [ARG] [--dir DIR]``:

env        print every DMLC_* variable and OMP_NUM_THREADS, one ``NAME=VALUE`` per line, and exit 0
fail N     print a line, then exit with status N at once (no flush) after a short pause
beat S     record the PID, beat like a training worker (mxfp16.distributed.heartbeat's file) for S seconds, then
           sleep like ``sleep`` (a worker that stopped making progress)
sleep      record PIDs in DIR and sleep until signalled; SIGINT or SIGTERM writes the time it
           arrived to DIR/<pid>.sigint or DIR/<pid>.sigterm, then exits
spawn      like sleep, but first start a grandchild that sleeps too (its PID is recorded)
setsid     like spawn, but the grandchild runs in a session of its own (out of the worker's process group)
escape     like setsid, and the grandchild also gets an empty environment (as `env -i setsid ...`)
"""
import argparse
import os
import signal
import subprocess
import sys
import time


def _record(folder, pid, kind):
    with open(os.path.join(folder, f"{pid}.{kind}"), "w") as handle:
        handle.write(repr(time.time()))


def _sleep_forever(folder):
    def on_signal(signum, frame):
        _record(folder, os.getpid(), signal.Signals(signum).name.lower())
        sys.exit(128 + signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    _record(folder, os.getpid(), "pid")
    while True:
        time.sleep(0.1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["env", "fail", "beat", "sleep", "spawn", "setsid", "escape"])
    parser.add_argument("arg", nargs="?", default="1")
    parser.add_argument("--dir", default=".")
    args = parser.parse_args()
    if args.action == "env":
        for name in sorted(k for k in os.environ if k.startswith("DMLC_") or k == "OMP_NUM_THREADS"):
            print(f"{name}={os.environ[name]}")
        print("to stderr", file=sys.stderr)
        return 0
    if args.action == "fail":
        time.sleep(0.3)
        print(f"failing with status {args.arg}")
        os._exit(int(args.arg))  # like a crash: no flush, so only unbuffered output survives
    if args.action == "beat":
        beats = os.path.join(os.environ["MXFP16_LAUNCH_HEARTBEAT"], f"worker-{os.getpid()}")
        end = time.monotonic() + float(args.arg)
        while time.monotonic() < end:
            with open(beats, "w") as handle:
                handle.write("step\n")
            time.sleep(0.2)
    if args.action in ("spawn", "setsid", "escape"):
        child = subprocess.Popen([sys.executable, __file__, "sleep", "--dir", args.dir],
                                 start_new_session=args.action != "spawn", env={} if args.action == "escape" else None)
        _record(args.dir, child.pid, "grandchild")
    _sleep_forever(args.dir)


if __name__ == "__main__":
    sys.exit(main())
