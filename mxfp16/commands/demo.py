"""``mxfp16 demo``: the main job. float32 against what ``auto`` trains in here, on the demo set, then the comparison.

Its first line says what ``auto`` resolves to on this machine and why: on a
GPU float16; on a CPU with native bfloat16 the faster of float32 and
amp-bfloat16 for the demo model, timed once and cached
(:mod:`mxfp16.measure.auto`); on a CPU that cannot run bfloat16 (no AVX-512),
float32, naming what the CPU lacks. Then it trains float32 and, when ``auto``
is something else, that precision, each in its own process (AMP is
process-global), and compares the two. Where ``auto`` is float32 there is
nothing to compare: a run measured against its own precision shows the
run-to-run spread, not a speedup, so the demo trains float32 once and says so.
"""
import os
import subprocess
import sys
import time

from . import add_threads_argument, open_output

ORDER = 1


def register(subparsers):
    parser = subparsers.add_parser("demo", help="the main job: float32 against auto on the demo set, then the "
                                                "comparison (what make demo runs)", description=__doc__)
    parser.add_argument("--out", default=None,
                        help="folder for the runs and the comparison (default: runs/demo-<date>-<time>)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs per run (default: the demo profile's, see mxfp16 train --help)")
    add_threads_argument(parser)
    parser.set_defaults(func=run)


def resolve_auto(log=print):
    """``(precision name, reason)`` of ``auto`` for the demo profile's model, shape and batch on this machine."""
    from ..data.synth import DEMO_SETTINGS
    from ..devices import resolve_devices
    from ..train.config import PROFILES
    from ..train.parts import PartsSpec, auto_verdict

    demo = PROFILES["demo"]
    spec = PartsSpec(model=demo["model"], classes=DEMO_SETTINGS["classes"], image_size=demo["image_size"],
                     batch_size=demo["batch_size"], seed=0)
    verdict = auto_verdict(spec, resolve_devices("auto"), log=log)
    return verdict.precision, verdict.reason


def _mxfp16(*args):
    """Run ``mxfp16 ARGS`` in its own process, its output streaming here; True when it succeeded."""
    # The commands the demo shows a user typing, their output live: not plumbing.child's call_in_child.
    return subprocess.run([sys.executable, "-m", "mxfp16", *args]).returncode == 0


def run(args):
    out = args.out or os.path.join("runs", time.strftime("demo-%Y%m%d-%H%M%S"))
    # Its runs and comparison are outputs of their own commands; the demo holds the folder they go in.
    with open_output(out, "running the demo", False, refusal="the demo writes new runs: choose another --out"):
        name, reason = resolve_auto()
        print(f"demo: auto trains in {name} here: {reason}", flush=True)
        extra = ["--epochs", str(args.epochs)] if args.epochs is not None else []
        if args.threads is not None:
            extra += ["--threads", str(args.threads)]
        runs = [os.path.join(out, "float32")]
        if not _mxfp16("train", "--precision", "float32", "--out", runs[0], *extra):
            return 1
        if name == "float32":
            print(f"demo: auto is float32 here, so there is no second precision to train; a float32 run compared with "
                  f"another would show the run-to-run spread, not a speedup. The float32 run is in {runs[0]}.")
            return 0
        runs.append(os.path.join(out, name))
        if not _mxfp16("train", "--precision", name, "--out", runs[1], *extra):
            return 1
        return 0 if _mxfp16("compare", *runs, "--out", os.path.join(out, "compare")) else 1
