"""``mxfp16 compare``: float32 against mixed precision, from finished training runs.

``mxfp16 compare RUN_DIR ...`` reads each run's config.json, metrics.jsonl
and summary.json (what `mxfp16 train --out DIR` writes), prints a table of
final accuracy, img/s and the speedup against the float32 run, and writes
compare.json, compare.md and compare.png (loss and accuracy per epoch,
accuracy against wall time).

``mxfp16 compare --a RUN ... --b RUN ...`` compares two groups of runs
(several seeds each; quoted globs such as 'runs/f32-s*' work): each side's
mean and seed-to-seed spread, the gap, its 95% interval (Welch's t-test, and
paired by seed when both sides ran the same seeds), and whether the gap
exceeds the noise; it writes parity.json, parity.txt and parity.png (every
seed's curve).

The --out folder holds one comparison: an existing one is refused, and
--overwrite replaces it whole once the new one is written (a folder holding
anything else is refused). A second compare into the same --out meanwhile
is refused at once, naming the first.
"""
import os
from pathlib import Path

from ..plumbing.limits import number
from . import CommandError, add_overwrite_argument, open_output

ORDER = 45


def register(subparsers):
    parser = subparsers.add_parser("compare", help="compare training runs: accuracy, loss, img/s, speedup; or two "
                                                   "groups of seeds: the gap and whether it exceeds the noise",
                                   description=__doc__)
    parser.add_argument("runs", nargs="*", metavar="RUN_DIR", help="--out folders of mxfp16 train runs")
    groups = parser.add_argument_group("two groups of runs (several seeds per precision)")
    groups.add_argument("--a", nargs="+", metavar="RUN", default=None,
                        help="the reference side, usually float32: run folders or quoted globs (default: none)")
    groups.add_argument("--b", nargs="+", metavar="RUN", default=None,
                        help="the side compared with it, usually mixed precision (default: none)")
    groups.add_argument("--confidence", type=number(1e-6, 1 - 1e-9), default=0.95,
                        help="confidence level of the interval for the gap (default: 0.95)")
    groups.add_argument("--resolve", type=number(1e-6, 100), default=None, metavar="POINTS",
                        help="report how many seeds per side would narrow the interval to +-POINTS at the "
                             "spread measured (default: 0.3, the parity goal in docs/training.md)")
    groups.add_argument("--allow-differences", action="store_true",
                        help="pool runs whose settings differ in more than the seed (between the sides: the seed "
                             "and the precision), or that finished different numbers of epochs, and list the "
                             "differences in the report (default: off; such runs are refused, naming what differs)")
    output = parser.add_argument_group("output")
    output.add_argument("--out", default=None,
                        help="folder for the outputs (default: a 'compare' folder beside the first run)")
    add_overwrite_argument(output)
    parser.set_defaults(func=run)


def _default_out(first):
    return os.path.join(os.path.dirname(os.path.abspath(os.path.normpath(first))), "compare")


def _output(args, out, runs):
    """The comparison's folder, opened (:func:`open_output`): never a run folder, one writer at a time."""
    from ..plumbing.output import Contents

    contents = Contents("a comparison", ("compare.json", "compare.md", "compare.png", "parity.json", "parity.txt",
                                         "parity.png"))
    return open_output(out, "comparing runs", args.overwrite, [("the run folder", r) for r in runs],
                       contents=contents)


def _published(output, paths):
    """Where the staged files ``paths`` are now that ``output`` is published."""
    return [str(output.path / Path(path).name) for path in paths]


def run(args):
    from ..train.compare import RunDirError, compare, format_table

    if (args.a is None) != (args.b is None):
        raise CommandError("--a and --b go together: --a FLOAT32_RUNS ... --b MIXED_RUNS ...")
    if args.a is not None:
        if args.runs:
            raise CommandError("give runs either as RUN_DIR ... or with --a/--b, not both")
        return _run_groups(args)
    if not args.runs:
        raise CommandError("no runs given: mxfp16 compare RUN_DIR ... or mxfp16 compare --a RUN ... --b RUN ...")
    with _output(args, args.out or _default_out(args.runs[0]), args.runs) as output:
        staged = output.stage()
        try:
            rows, paths = compare(args.runs, staged)
        except RunDirError as err:
            raise CommandError(str(err)) from None
        output.publish(staged)
    print(format_table(rows))
    if not any(r["precision"] == "float32" for r in rows):
        print("(no float32 run among them: no speedup or accuracy difference to report)")
    print("wrote " + ", ".join(_published(output, paths)))


def _run_groups(args):
    from ..train.compare import RunDirError
    from ..train.parity import format_parity, parity, write_parity

    resolve = {} if args.resolve is None else {"resolve": args.resolve}
    try:
        report, a_runs, b_runs = parity(args.a, args.b, args.confidence, allow_differences=args.allow_differences,
                                        **resolve)
    except RunDirError as err:
        raise CommandError(str(err)) from None
    report["command"] = getattr(args, "command_line", None)  # how to reproduce a recorded result
    with _output(args, args.out or _default_out(a_runs[0].path), [r.path for r in a_runs + b_runs]) as output:
        staged = output.stage()
        paths = write_parity(report, a_runs, b_runs, staged)
        output.publish(staged)
    print(format_parity(report))
    print("wrote " + ", ".join(_published(output, paths)))
