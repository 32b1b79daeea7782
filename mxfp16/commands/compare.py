"""``mxfp16 compare RUN_DIR ...``: float32 against mixed precision, from finished training runs.

Reads each run's config.json, metrics.jsonl and summary.json (what `mxfp16
train --out DIR` writes), prints a table of final accuracy, img/s and the
speedup against the float32 run, and writes compare.json, compare.md and
compare.png (loss and accuracy per epoch, accuracy against wall time).
"""
import os

from . import CommandError

ORDER = 45


def register(subparsers):
    parser = subparsers.add_parser("compare", help="compare training runs: accuracy, loss, img/s, speedup",
                                   description=__doc__)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="--out folders of mxfp16 train runs")
    parser.add_argument("--out", default=None,
                        help="folder for compare.json, compare.md and compare.png "
                             "(default: a 'compare' folder beside the first run)")
    parser.set_defaults(func=run)


def run(args):
    from ..train.compare import RunDirError, compare, format_table

    out = args.out or os.path.join(os.path.dirname(os.path.abspath(os.path.normpath(args.runs[0]))), "compare")
    try:
        rows, paths = compare(args.runs, out)
    except RunDirError as err:
        raise CommandError(str(err)) from None
    print(format_table(rows))
    if not any(r["precision"] == "float32" for r in rows):
        print("(no float32 run among them: no speedup or accuracy difference to report)")
    print("wrote " + ", ".join(paths))
