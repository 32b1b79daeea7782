"""Measure this CPU: docs/benchmarks.md's table of families, its PyTorch peer, AMX check and kernel census, in one go.

    make measure                                        # 180 minutes at most, into docs/results/measure-<class>-<cpu>/
    python tools/measure.py --record                    # and the figures, into docs/results/figures.json
    python tools/measure.py --quick --budget 3 --out /tmp/m   # tiny sizes: proves it runs, measures nothing
    python tools/measure.py --plan                      # the steps it would run, and why some are left out

Runs, in order, each step a child process with its share of the budget (``--budget`` minutes; what a step
leaves unused goes to the later ones, and a step whose share is too small is skipped with the reason
recorded): ``mxfp16 info --json`` (the CPU class, AMX's state), ``tools/amx_check.py`` where the class is
AMX, then ``mxfp16 bench`` of ResNet-50 v2 224 px batch 16, the word LM (LSTM), the BERT encoder, DCGAN and
MobileNet v2 224 px batch 16, each in float32, amp-bfloat16 and (the image classifiers) auto, ``--rounds 3``,
``--peer pytorch`` where torch is installed, and the kernel census ``mxfp16 bench`` takes of every row. On a CPU
where bfloat16 does not run (class AVX2) it says so in one line and runs the float32 rows.

Writes one folder, whole or not at all (the steps write into a temporary folder beside it, which then takes
its place): each step's output and log, ``lscpu.txt``, ``measure.json`` (the machine, each step's status and
seconds, the summary table) and ``measure.md`` (the same, for reading). ``--record`` adds the figures to
``docs/results/figures.json`` under ``measure.<folder>.*`` and refreshes every figure the docs quote.

It needs MXNet's wheel and this checkout, nothing else: no pip, no network (the networks are built from
code; see :mod:`mxfp16.bench.measure_plan`). The planning, budget and summary live in that module.
"""
import argparse
import os
import platform
import shutil
import subprocess
import sys
import time

TOOLS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TOOLS)
RESULTS = os.path.join(REPO, "docs", "results")


def _parser():
    parser = argparse.ArgumentParser(prog="python tools/measure.py", description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=210.0,
                        help="minutes the whole measurement may take at most; a step that ends early leaves its "
                             "time to the later ones (default: 210; about 200 are needed on a 2-core AMX VM)")
    parser.add_argument("--rounds", type=int, default=3, help="mxfp16 bench --rounds (default: 3; --quick: 1)")
    parser.add_argument("--threads", type=int, default=None, help="mxfp16 bench --threads (default: every core)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, one step per row, one round: that every step runs, not a measurement")
    parser.add_argument("--out", default=None,
                        help="the folder to write (default: docs/results/<slug>, with --quick runs/<slug>-quick)")
    parser.add_argument("--record", action="store_true",
                        help="add the figures to docs/results/figures.json and refresh the docs' figures")
    parser.add_argument("--plan", action="store_true", help="print the steps and exit without running them")
    return parser


def _read_json(path):
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _lscpu(folder):
    """``lscpu.txt`` where there is an lscpu: what the CPU says of itself, beside mxfp16's reading of it."""
    if shutil.which("lscpu"):
        proc = subprocess.run(["lscpu"], capture_output=True, text=True)
        with open(os.path.join(folder, "lscpu.txt"), "w", encoding="utf-8") as handle:
            handle.write(proc.stdout)


def _commit():
    """The checkout's commit (``+`` where files differ from it), or ``None`` where git or its history is missing."""
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True)
    except OSError:
        return None
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "") if head.returncode == 0 else None


def _document(args, facts, notes, records, stage, seconds):
    """``measure.json``'s contents: the machine, the request, each step, the summary."""
    from mxfp16.bench import measure_plan

    info = _read_json(os.path.join(stage, "info.json")) or {}
    machine, stack = info.get("machine", {}), info.get("stack", {})
    return dict(
        command="python tools/measure.py " + " ".join(sys.argv[1:]) if args.command is None else args.command,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), commit=_commit(), slug=facts["slug"],
        cpu_class=facts["cpu_class"], cpu_class_meaning=facts["cpu_class_meaning"], cpu=facts["cpu"],
        bfloat16=facts["bfloat16"], amx=machine.get("amx"), cpu_cores=machine.get("cpu_cores"),
        threads=(info.get("threads") or {}).get("planned") if args.threads is None else args.threads,
        python=platform.python_version(), numpy=stack.get("numpy"), mxnet=machine.get("mxnet_version"),
        budget_minutes=args.budget, quick=args.quick, rounds=1 if args.quick else args.rounds,
        seconds=round(seconds, 1), notes=notes, steps=records,
        summary=measure_plan.summarise(stage, records),
        amx_check=_read_json(os.path.join(stage, "amx-check", "amx-check.json")))


def _publish(stage, out):
    """Put the finished ``stage`` at ``out``, replacing an earlier measurement there whole."""
    from mxfp16.plumbing.output import exchange, rename_noreplace

    if os.path.exists(out):
        shutil.rmtree(exchange(stage, out))
    else:
        rename_noreplace(stage, out)


def _record(out, summary):
    """Add ``out``'s figures to docs/results/figures.json and refresh every figure span of the docs from it."""
    import importlib.util

    from mxfp16.bench.measure_plan import figure_entries, update_registry

    slug = os.path.basename(out)
    update_registry(os.path.join(RESULTS, "figures.json"), slug, figure_entries(slug, summary))
    spec = importlib.util.spec_from_file_location("figures", os.path.join(REPO, "docs", "hooks", "figures.py"))
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    print(f"recorded the figures of {slug} in docs/results/figures.json (measure.{slug}.*)")
    try:
        changed = figures.write_all()
    except (KeyError, IndexError, FileNotFoundError) as err:
        print(f"the docs were not refreshed: a page quotes a figure with no source ({type(err).__name__}: {err}); "
              "python docs/hooks/figures.py lists each one", file=sys.stderr)
        return 1
    for path in changed:
        print(f"updated {os.path.relpath(path, REPO)}")
    return 0


def _check_request(parser, args, out):
    if args.budget <= 0 or args.rounds < 1:
        parser.error("--budget takes minutes above 0 and --rounds a count of at least 1")
    if args.record and args.quick:
        parser.error("--record records a measurement's figures; a --quick run measures nothing: drop one of them")
    if args.record and os.path.dirname(os.path.abspath(out)) != RESULTS:
        parser.error(f"--record quotes figures from docs/results/: --out must be a folder there, not {out}")


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    args.command = None if argv is None else "python tools/measure.py " + " ".join(argv)
    sys.path.insert(0, REPO)  # a checkout with nothing installed: mxfp16 is this folder's
    from mxfp16.bench import measure_plan
    from mxfp16.machine.hardware import describe_cpu
    from mxfp16.plumbing.fileio import write_json
    from mxfp16.plumbing.output import temporary_folder

    facts = measure_plan.machine_facts()
    out = os.path.abspath(args.out or (os.path.join(REPO, "runs", facts["slug"] + "-quick") if args.quick
                                       else os.path.join(RESULTS, facts["slug"])))
    _check_request(parser, args, out)
    print(f"CPU class {facts['cpu_class']} ({facts['cpu_class_meaning']}): {describe_cpu(facts['cpu'])}")
    if args.plan:
        steps, notes = measure_plan.plan_steps(facts, args.quick, args.rounds, args.threads)
        print("\n".join(notes + [f"{s.name}: " + (f"skipped: {s.skip}" if s.skip else " ".join(s.argv))
                                 for s in steps]))
        return 0
    os.makedirs(os.path.dirname(out), exist_ok=True)
    stage = str(temporary_folder(out))
    try:
        steps, notes = measure_plan.plan_steps(facts, args.quick, args.rounds, args.threads)
        for note in notes:
            print(note)
        start = time.monotonic()
        records = measure_plan.run_steps(steps, args.budget * 60.0, stage)
        _lscpu(stage)
        document = _document(args, facts, notes, records, stage, time.monotonic() - start)
        write_json(os.path.join(stage, "measure.json"), document, indent=1)
        with open(os.path.join(stage, "measure.md"), "w", encoding="utf-8") as handle:
            handle.write(measure_plan.markdown(document))
        _publish(stage, out)
    except KeyboardInterrupt:
        shutil.rmtree(stage, ignore_errors=True)  # whole or not at all: nothing half-written stays
        print(f"interrupted: the running step was stopped and nothing was written to {out}", file=sys.stderr)
        return 130
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    print("\n".join(measure_plan.table_lines(document["summary"])))
    print(f"wrote {out} (measure.json, measure.md) in {document['seconds'] / 60:.1f} min")
    recorded = _record(out, document["summary"]) if args.record else 0
    return 1 if recorded or any(r["status"] == "failed" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
