"""``mxfp16 selftest``: check in about a minute that each precision that runs here trains like float32.

Trains a small convolutional network (Conv2D, BatchNorm, Dense) for a few
steps in every precision this machine can run (float16 and amp-float16 on a
GPU, amp-bfloat16 on a CPU with native bfloat16), each in its own process and
beside a float32 control from the same initial weights and batches, then
prints a pass/fail table. Exits with status 1 when any precision fails.
--json FILE also writes the table: a new file (--overwrite replaces one).
"""
import json

from ..plumbing.limits import MAX_STEPS, integer
from . import CommandError, add_overwrite_argument, add_threads_argument, open_output

ORDER = 5


def register(subparsers):
    parser = subparsers.add_parser("selftest", help="check that each precision that runs here trains like float32",
                                   description=__doc__)
    parser.add_argument("--steps", type=integer(1, MAX_STEPS), default=None,
                        help="training steps per run (default: 20)")
    parser.add_argument("--inject-fault", metavar="PRECISION", default=None,
                        help="corrupt one step of PRECISION (float16, amp-float16 or amp-bfloat16) to see what a "
                             "failure looks like; its verdict must be FAIL (default: none)")
    add_threads_argument(parser)
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="also write the table as JSON to FILE (default: none)")
    add_overwrite_argument(parser, "the --json file")
    parser.set_defaults(func=run)


def run(args):
    from ..plumbing.output import atomic_write
    from ..train import selftest

    with open_output(args.json, "running the self-test", args.overwrite, flag="--json", kind="file") as output:
        steps = selftest.STEPS if args.steps is None else args.steps
        if steps < 2 * selftest.WINDOW:
            raise CommandError(f"--steps {steps} is too few to see the loss fall; use {2 * selftest.WINDOW} or "
                               f"more (default {selftest.STEPS})")
        checked = [name for name, _ in selftest.CHECKED]
        if args.inject_fault is not None and args.inject_fault not in checked:
            raise CommandError(f"--inject-fault {args.inject_fault!r}: choose one of {', '.join(checked)}")
        print(selftest.tolerances_text(steps), flush=True)
        rows = selftest.run_selftest(steps=steps, inject_fault=args.inject_fault,
                                     progress=lambda line: print(f"running: {line}", flush=True))
        print(selftest.format_table(rows))
        if output is not None:
            staged = output.stage()
            with atomic_write(staged) as handle:
                json.dump(rows, handle, indent=2)
            output.publish(staged)
    ok = selftest.passed(rows)
    checked = [row["precision"] for row in rows if row["verdict"] not in ("control", "not run")]
    scope = "" if checked or not ok else " (float32 only: no mixed precision runs on this machine; the rows say why)"
    print("selftest: " + ("PASSED" if ok else "FAILED") + scope)
    return 0 if ok else 1
