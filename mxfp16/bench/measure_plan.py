"""One measurement of this CPU: docs/benchmarks.md's table of families, planned, run in budgeted steps, summarised.

``make measure`` (``tools/measure.py``) is a thin command over this module; docs/benchmarks.md, "One command for the
whole table", lists its steps. Importing it loads neither MXNet nor torch, and needs only MXNet's wheel and a checkout.
"""
import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from ..plumbing.output import atomic_write
from .families import FAMILIES

__all__ = ["Measured", "MODELS", "Step", "ALLOWANCE", "machine_facts", "cpu_slug", "plan_steps", "run_steps",
           "run_child", "summary_row", "summarise", "table_lines", "markdown", "figure_entries", "update_registry"]

#: Stands in a step's argv for its share of the budget in whole seconds (``mxfp16 bench --timeout``), known only
#: when the step starts: what earlier steps left over goes to the later ones.
ALLOWANCE = "{allowance}"
#: Classes where MXNet 1.9.1's bfloat16 has no path at all (:func:`mxfp16.machine.hardware.bfloat16_support`).
NO_BFLOAT16_CLASSES = ("AVX2",)
#: ``--quick``: one step of each row after one warm-up step (an auto row's first step is its timing, never timed:
#: without a warm-up the other rows would time their graph's building against it), one repeat, one round.
QUICK_TIMING = ("--iters", "1", "--warmup", "1", "--repeats", "1")
#: What a full step needs at least, and a quick one: below it a step is skipped rather than started to be stopped.
FLOOR_SECONDS = {"info": 5.0, "full": 120.0, "quick": 20.0}
#: ``mxfp16 info --json``'s allowance: it takes seconds (MXNet's import), and it comes before any share.
INFO_SECONDS = 60.0
#: The checkout this module is in.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The oneDNN census classes the summary keeps, as :mod:`mxfp16.bench.census` names them.
CENSUS_KEPT = ("amx", "avx512_bf16", "bf16_other", "float32", "reference", "reorder")


@dataclass(frozen=True)
class Measured:
    """One model of the table: its ``--model`` name, its ``weight`` (share of the budget against the others'), an
    image classifier's ``image_size`` and ``batch_size``, the ``quick`` flags that make it tiny for ``--quick``, the
    module it ``needs`` (MobileNet v2: gluoncv's zoo only), and the ``route`` flags of a second run of a model by
    another route, with the ``label`` its row is named by, and whether ``auto`` is timed beside float32 and
    amp-bfloat16 (a route's run leaves it to the model's own)."""

    model: str
    weight: float
    image_size: int = None
    batch_size: int = None
    quick: tuple = ("--image-size", "32", "--batch-sizes", "2")
    needs: str = None
    route: tuple = ()
    label: str = None
    auto: bool = True

    @property
    def image_classifier(self):
        return self.model not in FAMILIES

    @property
    def name(self):
        """The row's name in the summary, and its step's (``bench-<name>``)."""
        return self.label or self.model


def _tiny(*pairs):
    """A family's ``--quick`` flags: its sizes as tests/test_bench_families.py's tiny steps take them, batch 2."""
    return tuple(arg for pair in pairs for arg in ("--model-option", pair)) + ("--batch-sizes", "2")


#: The table's models, in its order (docs/benchmarks.md). Each weight is about the minutes its step needs on a
#: 2-core AMX VM with the peer, 3 rounds (docs/results/bench-families-amx-emerald-rapids: ms per step times the
#: rows' 33 steps, plus each row's process start and model build, auto's timing and torch.compile's rows): about 200
#: of the default 210-minute budget (the DCGAN route's 20 estimated from DCGAN's own 28 less auto's timing), so a
#: step is cut only on a slower machine.
MODELS = (
    Measured("resnet50_v2", 53.0, 224, 16),
    Measured("word-lm-lstm", 14.0, quick=_tiny("vocab=40", "embed=8", "hidden=8", "seq_len=5")),
    # The route for what the AMX profile shows (the fused RNN, in float32): its bfloat16 rows unfused.
    Measured("word-lm-lstm", 10.0, quick=_tiny("vocab=40", "embed=8", "hidden=8", "seq_len=5"),
             route=("--model-option", "unfused_bf16=1"), label="word-lm-lstm-unfused", auto=False),
    Measured("bert-encoder", 14.0,
             quick=_tiny("vocab=50", "units=16", "heads=2", "ffn=32", "seq_len=6", "max_length=8")),
    Measured("dcgan", 28.0, quick=_tiny("nz=10", "ngf=4", "ndf=4")),
    # The route for DCGAN's float32 share (AMP keeps Deconvolution float32): bfloat16 weights in the generator's
    # transposed convolutions, float32 masters in the optimizer.
    Measured("dcgan", 20.0, quick=_tiny("nz=10", "ngf=4", "ndf=4"), route=("--model-option", "bf16_deconv=1"),
             label="dcgan-bf16-deconv", auto=False),
    # Two more amp-bfloat16 rows, for the reorders and reference BatchNorm kernels its AMX profile shows: BatchNorm in
    # float32, and the convolutions whose channels oneDNN cannot block in float32.
    Measured("mobilenetv2_1.0", 50.0, 224, 16, needs="gluoncv",
             route=("--amp-lists", "mxfp16,mxfp16+batchnorm32,mxfp16+unaligned32")),
)


@dataclass
class Step:
    """One child process of the measurement: its ``name`` (also its log's, ``<name>.log``, and a benchmark's folder),
    ``argv``, ``weight`` (its share of the budget against the later steps'), ``floor`` (the seconds below which it is
    skipped), ``seconds`` (a fixed allowance instead of a share), ``stdout`` (its output's file, else the log),
    ``skip`` (why it is not run), ``model`` (its row in the summary) and ``notes`` (what its record says beside its
    status)."""

    name: str
    argv: list
    weight: float
    floor: float
    stdout: str = None
    seconds: float = None
    skip: str = None
    model: str = None
    notes: list = field(default_factory=list)


def module_missing(name):
    """Whether ``name`` cannot be imported here, found without importing it (torch takes seconds to load)."""
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def machine_facts():
    """What the plan depends on: the CPU's class and identity, whether bfloat16 runs, the folder's name.

    Returns
    -------
    dict
        ``cpu_class`` and ``cpu_class_meaning`` (:data:`mxfp16.machine.hardware.CPU_CLASSES`), ``cpu``
        (:func:`mxfp16.machine.hardware.cpu_identity`), ``bfloat16`` (``kind``, ``runs``, ``reason``; ``runs`` is
        false on a class of :data:`NO_BFLOAT16_CLASSES` whatever the flags say), ``slug`` (:func:`cpu_slug`).
    """
    from ..machine import hardware

    cls, identity, support = hardware.cpu_class(), hardware.cpu_identity(), hardware.bfloat16_support()
    if support.runs and cls in NO_BFLOAT16_CLASSES:  # the class decides where it and the flags disagree
        kind, runs, reason = "none", False, hardware.CPU_CLASSES[cls]
    else:
        kind, runs, reason = support.kind, support.runs, support.reason
    return {"cpu_class": cls, "cpu_class_meaning": hardware.CPU_CLASSES[cls], "cpu": identity,
            "bfloat16": {"kind": kind, "runs": runs, "reason": reason}, "slug": cpu_slug(cls, identity)}


def _slug_part(text):
    return re.sub(r"[^a-z0-9_]+", "-", str(text).lower()).strip("-")


def cpu_slug(cls, identity):
    """The folder's name: ``measure-<class>-<microarchitecture>``, e.g. ``measure-amx-emerald-rapids``. Where
    :func:`mxfp16.machine.hardware.microarchitecture` does not know the CPU, its vendor, family and model name it
    (``measure-amx-intel-f6-m167``); where not even those are known, its class alone."""
    arch = identity.get("microarchitecture")
    if arch:
        where = _slug_part(re.sub(r" (?=\d)", "", arch))  # Zen 4 -> zen4, Emerald Rapids -> emerald-rapids
    else:
        vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(identity.get("vendor"),
                                                                      _slug_part(identity.get("vendor") or ""))
        parts = [vendor] + [f"{p[0]}{identity[name]}" for name, p in (("family", "f"), ("model", "m"))
                            if identity.get(name) is not None]
        where = "-".join(part for part in parts if part)
    return "-".join(part for part in ("measure", _slug_part(cls), where) if part)


def _bench_argv(python, measured, precisions, quick, rounds, threads, peer, out):
    """``python -m mxfp16 bench ...`` of one model into ``out``."""
    argv = [python, "-m", "mxfp16", "bench", "--model", measured.model, *measured.route]
    if quick:
        argv += [*measured.quick, *QUICK_TIMING]
    elif measured.image_classifier:
        argv += ["--image-size", str(measured.image_size), "--batch-sizes", str(measured.batch_size)]
    argv += ["--precisions", precisions, "--rounds", "1" if quick else str(rounds), "--timeout", ALLOWANCE,
             "--no-plots", "--out", out]
    return argv + (["--peer", "pytorch"] if peer else []) + (["--threads", str(threads)] if threads else [])


def plan_steps(facts, quick=False, rounds=3, threads=None, missing=module_missing):
    """The measurement's steps, in order, and the lines that say what it leaves out and why.

    Parameters
    ----------
    facts : dict
        :func:`machine_facts`.
    quick : bool
        Tiny sizes (:attr:`Measured.quick`), one step per row, one round: a check that everything runs, not a
        measurement.
    rounds, threads : int
        ``mxfp16 bench --rounds`` of a full run, and ``--threads`` (``None``: the bench's default, every core).
    missing : callable
        ``missing(module) -> bool``; torch and gluoncv are looked for with it.

    Returns
    -------
    (list of Step, list of str)
        Each step names its outputs relative to the measurement's folder, where it runs
        (:func:`run_child`): the commands recorded read the same wherever that folder is made.
    """
    python, floor = sys.executable, FLOOR_SECONDS["quick" if quick else "full"]
    notes, bf16 = [], facts["bfloat16"]
    if not bf16["runs"]:
        notes.append(f"bfloat16 does not run on this CPU ({facts['cpu_class']}: {bf16['reason']}): float32 rows only")
    no_torch = missing("torch")
    if no_torch:
        notes.append("PyTorch peer: skipped: torch not installed (pip install -c constraints.txt 'mxfp16[peer]')")
    steps = [Step("info", [python, "-m", "mxfp16", "info", "--json"], 0.0, FLOOR_SECONDS["info"],
                  stdout="info.json", seconds=INFO_SECONDS)]
    amx = [python, os.path.join(REPO, "tools", "amx_check.py"), "--out", "amx-check",
           "--steps", "2" if quick else "50"] + (["--models", "lstm-classifier"] if quick else [])
    steps.append(Step("amx-check", amx, 1.0 if quick else 8.0, floor,
                      skip=None if facts["cpu_class"] == "AMX" else
                      f"the CPU's class is {facts['cpu_class']}, not AMX: no AMX kernels to check"))
    for measured in MODELS:
        precisions = ("float32,amp-bfloat16,auto" if measured.auto else "float32,amp-bfloat16") \
            if bf16["runs"] else "float32"
        name = f"bench-{measured.name}"
        argv = _bench_argv(python, measured, precisions, quick, rounds, threads, not no_torch, name)
        skip = (f"{measured.needs} not installed: {measured.model} is built from its model zoo "
                f"(pip install -c constraints.txt {measured.needs}==0.10.5.post0)"
                if measured.needs and missing(measured.needs) else None)
        # Tiny sizes take seconds but for auto's timing of the image classifiers (ResNet-50: 38 of 48 s on Zen 5).
        weight = (3.0 if measured.image_classifier else 1.0) if quick else measured.weight
        steps.append(Step(name, argv, weight, floor, skip=skip, model=measured.name,
                          notes=["peer skipped: torch not installed"] if no_torch else []))
    return steps, notes


def _tail(path, lines=3):
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = [line.rstrip() for line in handle.read().splitlines() if line.strip()]
        return " / ".join(text[-lines:])
    return ""


def _stop(proc, grace=10.0):
    """End ``proc`` and everything it started (its own session: ``mxfp16 bench``'s row processes too)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
            return


def run_child(step, argv, allowance, folder):
    """Run ``argv`` in ``folder`` for at most ``allowance`` seconds; its output goes to ``<step.name>.log`` there.

    The child runs in a session of its own, so a step stopped at its allowance takes the processes it started with
    it; ``PYTHONPATH`` names the checkout, so ``python -m mxfp16`` needs no install.

    Returns
    -------
    (str, str or None)
        ``('ok', None)``, ``('failed', why)`` or ``('timed-out', why)``.
    """
    # Not plumbing.child's call_in_child: a step is a command as a user types it (mxfp16 bench, a tool).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    log_path = os.path.join(folder, f"{step.name}.log")
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open(log_path, "w", encoding="utf-8"))
        out = stack.enter_context(open(os.path.join(folder, step.stdout), "w", encoding="utf-8")) \
            if step.stdout else log
        proc = subprocess.Popen(argv, stdout=out, stderr=log if step.stdout else subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=folder, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=allowance)
        except subprocess.TimeoutExpired:
            _stop(proc)
            return "timed-out", (f"stopped at its share of the budget ({allowance:.0f} s); what it had not "
                                 "written is lost")
        except BaseException:  # Ctrl-C: the step's processes go too
            _stop(proc)
            raise
    if code:
        return "failed", f"exit status {code}: {_tail(log_path)}"
    return "ok", None


def _shown(argv):
    """The command as a reader would type it: ``python`` for this interpreter's path."""
    return " ".join(["python" if argv[0] == sys.executable else argv[0], *argv[1:]])


def _record(step, status, reason=None, seconds=0.0, allowance=None, argv=None):
    return {"name": step.name, "status": status, "reason": reason, "seconds": round(seconds, 1),
            "allowance_seconds": None if allowance is None else round(allowance, 1),
            "command": _shown(argv or step.argv), "model": step.model, "notes": list(step.notes)}


def run_steps(steps, budget, folder, run=None, clock=time.monotonic, log=print):
    """Run ``steps`` in order within ``budget`` seconds, each with its share of what is left.

    A step's share is what remains of the budget times its weight over the weights of it and the steps after it
    (a step with fixed :attr:`Step.seconds` gets those, as far as the budget goes). A step whose share is under its
    :attr:`Step.floor` is skipped with the reason recorded; one that outlasts its share is stopped.

    Parameters
    ----------
    run : callable, optional
        ``run(step, argv, allowance, folder) -> (status, reason)``; default :func:`run_child`.

    Returns
    -------
    list of dict
        Per step: ``name``, ``status`` (``ok``, ``failed``, ``timed-out``, ``skipped``), ``reason``,
        ``seconds``, ``allowance_seconds``, ``command``, ``model``, ``notes``.
    """
    run = run or run_child
    start, records = clock(), []
    for index, step in enumerate(steps):
        remaining = budget - (clock() - start)
        share = min(remaining, step.seconds) if step.seconds is not None else \
            remaining * step.weight / (sum(s.weight for s in steps[index:] if not s.skip) or 1.0)
        if step.skip or share < step.floor:
            why = step.skip or (f"budget spent: its share is {max(share, 0):.0f} s of the {max(remaining, 0):.0f} s "
                                f"left, under the {step.floor:.0f} s it needs at least")
            records.append(_record(step, "skipped", why, allowance=None if step.skip else max(share, 0)))
            log(f"{step.name}: skipped: {why}")
            continue
        argv = [str(int(share)) if arg == ALLOWANCE else arg for arg in step.argv]
        log(f"{step.name}: running, up to {share:.0f} s (log: {os.path.join(folder, step.name + '.log')})")
        began = clock()
        status, reason = run(step, argv, share, folder)
        records.append(_record(step, status, reason, clock() - began, share, argv))
        log(f"{step.name}: {status} in {clock() - began:.0f} s" + (f": {reason}" if reason else ""))
    return records


def _census(row):
    census = (row or {}).get("census") or {}
    if census.get("status") != "ok":
        return None
    return {name: round(census["percent"].get(name, 0.0), 1) for name in CENSUS_KEPT}


def _auto_ratio(document, rows, batch_size):
    """auto's speed over float32's: its verdict's row's speedup (1.0 where auto trains float32)."""
    verdict = (document.get("config", {}).get("auto") or {}).get(str(batch_size)) or {}
    chosen = verdict.get("precision")
    if chosen == "float32":
        return 1.0
    field, wanted = ("requested_precision", "auto") if chosen is None else ("precision", chosen)
    lists = verdict.get("amp_lists")  # the list set its route ran under (recorded since auto had list routes)
    return next((r.get("speedup") for r in rows if r.get(field) == wanted and r.get("status") == "ok"
                 and lists in (None, r.get("amp_lists"))), None)


def summary_row(document):
    """One model's line of the table from its ``bench.json``.

    Returns
    -------
    dict
        ``unit``, ``input`` (``224px``, ``35tok``), ``batch_size``, ``rounds``; throughputs ``float32`` and
        ``bfloat16`` (the fastest amp-bfloat16 row, its lists ``bfloat16_lists``), ``pytorch_best_fp32`` and
        ``pytorch_best_bf16`` (the fastest PyTorch rows, with their ``*_label``); the ratios ``bf16_over_fp32``,
        ``bf16_over_pytorch_bf16``, ``fp32_over_pytorch_fp32``, ``auto_over_fp32``; ``auto`` (what it trained in);
        ``census_bf16`` and ``census_fp32``; ``bfloat16_status`` (why there is no bfloat16 figure). ``None`` where
        not measured.
    """
    from .report import UNITS, input_size, throughput_field

    rows = [r for r in document.get("results", []) if r.get("framework", "mxfp16") == "mxfp16"]
    config = document.get("config", {})
    fp32 = next((r for r in rows if r.get("precision") == "float32" and r.get("status") == "ok"), None)
    asked = [r for r in rows if str(r.get("precision", "")).startswith("amp-bfloat16")
             and r.get("requested_precision") != "auto"]
    bf16_any = next(iter(asked), None)
    field_name = throughput_field(fp32 or bf16_any or {})
    # With several AMP lists (routes) the fastest row stands for bfloat16, as the peer comparison's does.
    bf16 = max((r for r in asked if r.get("status") == "ok"), key=lambda r: r.get(field_name) or 0, default=None)
    batch = (fp32 or bf16_any or {}).get("batch_size")
    peer = next(iter((document.get("peer") or {}).values()), {})
    best_bf16, best_fp32 = peer.get("peer_mixed") or {}, peer.get("peer_float32") or {}
    in_row = next((r for r in rows if r.get("auto_reason") and r.get("status") == "ok"), {})  # a family's own row
    verdict = (config.get("auto") or {}).get(str(batch)) or in_row
    auto = ", ".join(filter(None, (verdict.get("precision"), verdict.get("route") or verdict.get("auto_route")))) \
        or None
    return {"unit": UNITS[field_name], "batch_size": batch, "rounds": config.get("rounds"),
            "input": input_size(fp32 or bf16_any) if (fp32 or bf16_any) else None,
            "float32": (fp32 or {}).get(field_name), "bfloat16": (bf16 or {}).get(field_name),
            "bfloat16_lists": (bf16 or {}).get("amp_lists") if len(asked) > 1 else None,
            "pytorch_best_fp32": best_fp32.get(field_name), "pytorch_best_fp32_label": best_fp32.get("label"),
            "pytorch_best_bf16": best_bf16.get(field_name), "pytorch_best_bf16_label": best_bf16.get("label"),
            "bf16_over_fp32": (bf16 or {}).get("speedup"),
            "bf16_over_pytorch_bf16": peer.get("mixed_ratio") if bf16 else None,
            "fp32_over_pytorch_fp32": peer.get("float32_ratio"),
            "auto": auto, "auto_over_fp32": _auto_ratio(document, rows, batch) if "auto" in str(
                config.get("precisions", "")) else None,
            "census_bf16": _census(bf16), "census_fp32": _census(fp32),
            "bfloat16_status": None if bf16 else ("not run" if bf16_any is None else
                                                  f"{bf16_any.get('status')}: {bf16_any.get('reason') or ''}".strip())}


def summarise(folder, records):
    """``{model: summary_row}`` from the ``bench.json`` of each benchmark step that wrote one."""
    summary = {}
    for record in records:
        path = os.path.join(folder, record["name"], "bench.json")
        if record.get("model") and os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                summary[record["model"]] = summary_row(json.load(handle))
    return summary


def _number(value, fmt="{:.2f}"):
    return "—" if value is None else fmt.format(value)


def _census_text(census):
    from .census import CLASS_LABELS  # loads neither MXNet nor torch

    return ", ".join(f"{census[name]:.0f}% {CLASS_LABELS[name]}" for name in CENSUS_KEPT if name in census) \
        if census else "—"


#: The table's columns: its header and how each cell is read from a summary row.
COLUMNS = (
    ("mxfp16 fp32", lambda r: f"{_number(r['float32'])} {r['unit']}" if r["float32"] is not None else "—"),
    ("mxfp16 bf16", lambda r: f"{_number(r['bfloat16'])} {r['unit']}" + (
        f" ({r['bfloat16_lists']} lists)" if r.get("bfloat16_lists") else "") if r["bfloat16"] is not None
     else (r.get("bfloat16_status") or "—")[:60]),
    ("bf16/own fp32", lambda r: _number(r["bf16_over_fp32"], "{:.2f}x")),
    ("bf16/PyTorch best bf16", lambda r: _number(r["bf16_over_pytorch_bf16"], "{:.2f}x")),
    ("fp32/PyTorch best fp32", lambda r: _number(r["fp32_over_pytorch_fp32"], "{:.2f}x")),
    ("auto/fp32", lambda r: _number(r["auto_over_fp32"], "{:.2f}x") + (f" ({r['auto']})" if r["auto"] else "")),
    ("oneDNN census, bf16 row", lambda r: _census_text(r["census_bf16"])),
)


def row_title(model, row):
    """A summary row's name as measured: ``resnet50_v2 224px, batch 16`` (a --quick run's sizes are its own)."""
    return f"{model} {row.get('input') or ''}, batch {row.get('batch_size')}".replace(" ,", ",")


def table_lines(summary):
    """The summary as a Markdown table, one line per model measured."""
    lines = ["| model | rounds | " + " | ".join(name for name, _ in COLUMNS) + " |",
             "|" + "---|" * (len(COLUMNS) + 2)]
    for model, row in summary.items():
        lines.append(f"| {row_title(model, row)} | {row['rounds'] or '—'} | "
                     + " | ".join(cell(row) for _, cell in COLUMNS) + " |")
    return lines


def markdown(document):
    """``measure.md``: the machine, the command, what was left out, the table and each step's status."""
    from ..machine.hardware import describe_cpu

    lines = [f"# Measured on {document['cpu'].get('model_name') or 'this CPU'} ({document['cpu_class']})", "",
             f"Command: `{document['command']}`" + (f", at commit {document['commit']}" if document.get("commit")
                                                    else ""), "",
             f"CPU: {describe_cpu(document['cpu'])}; class {document['cpu_class']} "
             f"({document['cpu_class_meaning']}); bfloat16: {document['bfloat16']['reason']}.",
             f"Threads: {document.get('threads') or 'the bench default'}; Python {document['python']}, numpy "
             f"{document.get('numpy') or '?'}, MXNet {document.get('mxnet') or '?'}; budget "
             f"{document['budget_minutes']:g} min, used {document['seconds'] / 60:.1f} min"
             + ("; --quick: tiny sizes, one round (a check that it runs, not a measurement)" if document["quick"]
                else "") + ".", ""]
    lines += [f"- {note}" for note in document["notes"]] + ([""] if document["notes"] else [])
    lines += ["Ratios are medians of the rounds' own ratios (`mxfp16 bench --rounds`); the census is the share of "
              "oneDNN's time per class of kernel in the amp-bfloat16 row's step.", ""]
    lines += table_lines(document["summary"]) + ["", "| step | status | seconds | share of budget | reason |",
                                                 "|---|---|---|---|---|"]
    for step in document["steps"]:
        lines.append(f"| {step['name']} | {step['status']} | {step['seconds']:.0f} | "
                     f"{_number(step['allowance_seconds'], '{:.0f} s')} | {(step['reason'] or '').replace('|', '/')} |")
    return "\n".join(lines) + "\n"


#: Each figure a summary row gives the docs, with its format.
FIGURES = {"float32": "{:.2f}", "bfloat16": "{:.2f}", "bf16_over_fp32": "{:.2f}x",
           "bf16_over_pytorch_bf16": "{:.2f}x", "fp32_over_pytorch_fp32": "{:.2f}x", "auto_over_fp32": "{:.2f}x"}


def figure_entries(slug, summary):
    """``docs/results/figures.json`` entries for a measurement folder ``slug`` (directly under docs/results): one
    figure per measured value, named ``measure.<slug>.<model>.<field>`` (``field`` of :data:`FIGURES`), and one table
    ``measure.<slug>`` of the summary (a cell with no value reads ``—``), so a page can quote either with
    ``<!-- fig NAME -->`` or ``<!-- table NAME -->``."""
    entries, rows = {}, []
    for model, row in summary.items():
        for name, fmt in FIGURES.items():
            if row.get(name) is not None:
                entries[f"measure.{slug}.{model}.{name}"] = {"file": f"{slug}/measure.json",
                                                             "path": f"summary[{model}].{name}", "format": fmt}
        rows.append([row_title(model, row)] + [{"fig": f"measure.{slug}.{model}.{name}"} if row.get(name) is not None
                                               else "—" for name in FIGURES])
    header = ["model"] + [name for name, _ in COLUMNS[:len(FIGURES)]]  # the table's columns the figures fill
    entries[f"measure.{slug}"] = {"table": [header, *rows]}
    return entries


def update_registry(path, slug, entries):
    """Put ``entries`` into the figures registry at ``path``, replacing every earlier entry of ``slug``; return the
    registry as written (atomically, in its own layout: one-space indent, a final newline, so a diff shows only what
    changed)."""
    with open(path, encoding="utf-8") as handle:
        registry = json.load(handle)
    prefix = f"measure.{slug}"
    registry = {k: v for k, v in registry.items() if k != prefix and not k.startswith(prefix + ".")}
    registry.update(entries)
    with atomic_write(path) as handle:
        handle.write(json.dumps(registry, indent=1, ensure_ascii=False) + "\n")
    return registry
