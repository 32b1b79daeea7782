"""Speedups against float32, and the benchmark's table, ``bench.json`` and ``bench.csv``.

With ``mxfp16 bench --rounds N`` a speedup is the median of the rounds' own
ratios, each comparing two processes that ran minutes apart, rather than the
ratio of two medians (:func:`merge_rounds`, :func:`round_spread`).
``python -m mxfp16.bench.report --round-ratios DIR/bench.json`` derives the
spread for a file recorded before ``bench.json`` held it.
"""
import csv
import io
import os
import statistics

from ..plumbing.fileio import write_json
from ..plumbing.output import atomic_write
from .census import CLASSES as CENSUS_CLASSES
from .census import format_census as census_lines

#: Fields every result record has (``None`` where a run was skipped or failed).
RESULT_FIELDS = ("precision", "batch_size", "image_size", "model", "mode", "images_per_second", "ms_per_step",
                 "ms_per_step_spread", "peak_memory_mb")
#: Further fields written to ``bench.csv`` after :data:`RESULT_FIELDS`.
EXTRA_FIELDS = ("framework", "layout", "compiled", "requested_precision", "amp_lists", "data", "pipeline", "ctx",
                "threads", "status", "reason", "cpu_ms_per_step", "speedup", "cpu_speedup", "memory_ratio",
                "load_average", "seq_len", "tokens_per_second")
#: Inference records also have these (per-call times over every timed call).
LATENCY_FIELDS = ("latency_ms_median", "latency_ms_p90", "latency_ms_p99", "latency_samples")
BASELINE = "float32"
#: The kernel census's share of oneDNN's time per class (:data:`mxfp16.bench.census.CLASSES`), empty where
#: no census was taken (``--no-census``, a failed census, no oneDNN).
CENSUS_FIELDS = tuple(f"census_{name}_percent" for name in CENSUS_CLASSES)
#: What a row's throughput counts: images, or tokens for the token families (``unit == "tokens"``).
THROUGHPUT_FIELDS = ("images_per_second", "tokens_per_second")
UNITS = {"images_per_second": "img/s", "tokens_per_second": "tokens/s"}


def throughput_field(record):
    """``tokens_per_second`` for a row of a token family, else ``images_per_second``."""
    return "tokens_per_second" if record.get("unit") == "tokens" else "images_per_second"


def input_size(record):
    """What one sample is: ``224px``, or ``35tok`` (tokens per sequence) for a token family."""
    return f"{record['seq_len']}tok" if record.get("image_size") is None and record.get("seq_len") else \
        f"{record.get('image_size')}px"


def _group(record):
    """Records in one group are compared with each other: only precision (and AMP lists) differ."""
    return tuple(record.get(k) for k in ("model", "image_size", "batch_size", "mode", "data", "ctx"))


#: The framework of rows that run the exported network elsewhere (``bench --mode inference --onnxruntime``).
ONNXRUNTIME = "onnxruntime"


def _is_mxfp16(record):
    return record.get("framework", "mxfp16") == "mxfp16"


def label(record):
    """A row's display name: ``amp-bfloat16 (mxfp16 lists)``, ``auto: float32``, ``auto: amp-bfloat16, unfused-rnn
    (mxfp16 lists)`` (with the route auto applied), ``pytorch-bfloat16 (NCHW)``, ``pytorch-float32 (channels_last,
    compiled)``, ``onnxruntime float32``."""
    if record.get("framework") == ONNXRUNTIME:
        return f"{ONNXRUNTIME} {record['precision']}"
    if not _is_mxfp16(record):
        how = [part for part in (record.get("layout"), "compiled" if record.get("compiled") else None) if part]
        return f"{record['precision']} ({', '.join(how)})" if how else record["precision"]
    lists = record.get("amp_lists")
    name = f"auto: {record['precision']}" if record.get("auto_reason") else record["precision"]  # decided in its row
    name += f", {record['auto_route']}" if record.get("auto_route") else ""
    return f"{name} ({lists} lists)" if lists else name


def _identity(record):
    """What one measurement is, whatever its round: framework, precision, lists, layout, compilation and group."""
    return (record.get("framework", "mxfp16"), record.get("precision"), record.get("requested_precision"),
            record.get("amp_lists"), record.get("layout"), bool(record.get("compiled"))) + _group(record)


def merge_rounds(records):
    """One record per measurement from :func:`mxfp16.bench.suite.run_suite`'s records of several rounds: the first
    successful round's, its times the medians over the successful rounds, with ``rounds`` (each round's figures)."""
    if all(r.get("round", 1) == 1 for r in records):
        return records
    groups = {}
    for r in records:
        groups.setdefault(_identity(r), []).append(r)
    merged = []
    for rows in groups.values():
        ok = [r for r in rows if r.get("status") == "ok"]
        m = dict(ok[0] if ok else rows[0])
        m.pop("round", None)
        m["rounds"] = [{k: r.get(k) for k in ("round", "status", throughput_field(r), "ms_per_step", "cpu_ms_per_step",
                                              "peak_memory_mb", "load_average")} for r in rows]
        if ok:
            ms = [r["ms_per_step"] for r in ok]
            m["ms_per_step"] = statistics.median(ms)
            field = throughput_field(m)
            m[field] = ok[0][field] * ok[0]["ms_per_step"] / m["ms_per_step"]  # the same work per step
            m["ms_per_step_spread"] = (max(ms) - min(ms)) / 2
            m["peak_memory_mb"] = max(r["peak_memory_mb"] for r in ok)
            for key in ("cpu_ms_per_step",) + LATENCY_FIELDS[:3]:
                values = [r.get(key) for r in ok]
                m[key] = statistics.median(values) if all(v is not None for v in values) else None
        merged.append(m)
    return merged


def _paired_ratios(a, b, key):
    """``a[key] / b[key]`` for each round both rows ran successfully, in round order (``[]`` without rounds)."""
    pairs = {e["round"]: e[key] for e in a.get("rounds", ()) if e["status"] == "ok" and e.get(key)}
    return [pairs[e["round"]] / e[key] for e in b.get("rounds", ())
            if e["status"] == "ok" and e.get(key) and e["round"] in pairs]


def _ratio(a, b, key):
    """``a[key] / b[key]``: the median over rounds when both have rounds, else the plain ratio (``None`` if missing)."""
    if paired := _paired_ratios(a, b, key):
        return statistics.median(paired)
    return a[key] / b[key] if a.get(key) and b.get(key) else None


def round_spread(a, b, key):
    """The ratio ``a[key] / b[key]`` within each round both rows ran, and its lowest and highest value.

    Parameters
    ----------
    a, b : dict
        Merged rows (:func:`merge_rounds`) with their ``rounds``.
    key : str
        ``ms_per_step`` (``a`` the baseline) or a throughput.

    Returns
    -------
    dict or None
        ``{"round_ratios": [...], "round_min", "round_max"}``; ``None`` without a round both ran.
    """
    ratios = _paired_ratios(a, b, key)
    return {"round_ratios": ratios, "round_min": min(ratios), "round_max": max(ratios)} if ratios else None


def add_speedups(records):
    """Set ``speedup`` and ``memory_ratio`` on each record (in place) against mxfp16's float32 run of its group.

    Returns
    -------
    dict
        ``{"<label> vs float32, <model> <input> bs<batch> <mode>": {...}}``: the ratios, precision and group of every
        successful non-float32 record that has a baseline, with rounds also :func:`round_spread`'s.
    """
    baselines = {}
    for r in records:
        if r.get("status") == "ok" and r["precision"] == BASELINE and _is_mxfp16(r):
            baselines.setdefault(_group(r), r)
    table = {}
    for r in records:
        base = baselines.get(_group(r))
        if r.get("status") != "ok" or base is None:
            r["speedup"] = r["cpu_speedup"] = r["memory_ratio"] = None
            continue
        r["speedup"] = _ratio(base, r, "ms_per_step")
        # On a shared machine wall time swings with other programs; CPU time much less.
        r["cpu_speedup"] = _ratio(base, r, "cpu_ms_per_step")
        r["memory_ratio"] = r["peak_memory_mb"] / base["peak_memory_mb"] if base["peak_memory_mb"] else None
        if r is not base:
            table[f"{label(r)} vs float32, {r['model']} {input_size(r)} bs{r['batch_size']} {r['mode']}"] = {
                "speedup": r["speedup"], "cpu_speedup": r["cpu_speedup"], "memory_ratio": r["memory_ratio"],
                **{k: r[k] for k in ("precision", "amp_lists", "batch_size", "image_size", "model", "mode")},
                **(round_spread(base, r, "ms_per_step") or {}),
            }
    return table


def _fastest(rows, field):
    """The fastest of ``rows`` by the throughput ``field`` as ``{"label", field, "row"}``, or ``None`` without rows."""
    row = max(rows, key=lambda r: r[field], default=None)
    return None if row is None else {"label": label(row), field: row[field], "row": row}


def _peer_comparison(records):
    """mxfp16 against the peer, per group: the best mixed-precision rows and the float32 rows.

    Returns
    -------
    dict
        ``{"<model> <px>px bs<batch>": {"mxfp16_mixed", "peer_mixed", "mixed_ratio", "mxfp16_float32",
        "peer_float32", "float32_ratio"}}`` where each ``*_mixed``/``*_float32`` is the label and throughput of the
        fastest such row, compiled or not, and a ratio is mxfp16's throughput over the peer's (with rounds, the median
        of each round's ratio, and :func:`round_spread`'s figures prefixed ``mixed_`` or ``float32_``).
    """
    groups = {}
    for r in records:
        if r.get("status") == "ok":
            groups.setdefault(_group(r), []).append(r)
    out = {}
    for rows in groups.values():
        field = throughput_field(rows[0])
        mine = [r for r in rows if _is_mxfp16(r)]
        # PyTorch's rows: onnxruntime rows run mxfp16's own export.
        peer = [r for r in rows if not _is_mxfp16(r) and r.get("framework") != ONNXRUNTIME]
        if not peer:
            continue
        entry = {"mxfp16_mixed": _fastest([r for r in mine if r["precision"] != BASELINE], field),
                 "peer_mixed": _fastest([r for r in peer if not r["precision"].endswith(BASELINE)], field),
                 "mxfp16_float32": _fastest([r for r in mine if r["precision"] == BASELINE], field),
                 "peer_float32": _fastest([r for r in peer if r["precision"].endswith(BASELINE)], field)}
        for kind in ("mixed", "float32"):
            a, b = entry[f"mxfp16_{kind}"], entry[f"peer_{kind}"]
            entry[f"{kind}_ratio"] = _ratio(a["row"], b["row"], field) if a and b else None
            if a and b:
                entry.update({f"{kind}_{k}": v for k, v in (round_spread(a["row"], b["row"], field) or {}).items()})
        for side in entry.values():
            if isinstance(side, dict):
                del side["row"]  # the row is in the results already
        first = rows[0]
        out[f"{first['model']} {input_size(first)} bs{first['batch_size']} {first['mode']}"] = entry
    return out


def format_ratio(ratio, low=None, high=None):
    """``1.71x``, and with the rounds' lowest and highest ratio ``1.71x (rounds 1.65x-1.79x)``."""
    text = f"{ratio:.2f}x"
    return text if low is None or high is None else f"{text} (rounds {low:.2f}x-{high:.2f}x)"


def format_speedups(table):
    """Lines for the terminal: each speedup against float32 with the spread of its rounds (:func:`add_speedups`)."""
    return "\n".join(f"{key}: {format_ratio(e['speedup'], e.get('round_min'), e.get('round_max'))}"
                     for key, e in table.items() if e.get("speedup") is not None)


def format_peer_comparison(comparison):
    """Lines for the terminal: the fastest mixed row of each side and their ratio (with its rounds' spread)."""
    lines = []
    for key, e in comparison.items():
        for kind in ("mixed", "float32"):
            a, b, ratio = e[f"mxfp16_{kind}"], e[f"peer_{kind}"], e[f"{kind}_ratio"]
            if a and b:
                field = next(f for f in THROUGHPUT_FIELDS if f in a)
                lines.append(f"{key}: {a['label']} {a[field]:.2f} {UNITS[field]} against {b['label']} "
                             f"{b[field]:.2f} {UNITS[field]}: "
                             + format_ratio(ratio, e.get(f"{kind}_round_min"), e.get(f"{kind}_round_max")))
    return "\n".join(lines)


def bench_document(machine, records, config=None, tensor_cores=None):
    """The content of ``bench.json``: machine, results (rounds merged), speedups and the peer comparison."""
    records = merge_rounds(records)
    doc = {"machine": machine, "results": records, "speedup": add_speedups(records)}
    if comparison := _peer_comparison(records):
        doc["peer"] = comparison
    doc.update((k, v) for k, v in (("config", config), ("tensor_cores", tensor_cores)) if v is not None)
    return doc


def write_outputs(out_dir, document):
    """Write ``bench.json`` and ``bench.csv`` into ``out_dir`` (atomically); return their paths."""
    os.makedirs(out_dir, exist_ok=True)
    json_path, csv_path = os.path.join(out_dir, "bench.json"), os.path.join(out_dir, "bench.csv")
    write_json(json_path, document)
    with atomic_write(csv_path, "w") as handle:
        handle.write(_to_csv(document["results"]))
    return json_path, csv_path


def _to_csv(records):
    buffer = io.StringIO()
    names = RESULT_FIELDS + EXTRA_FIELDS + LATENCY_FIELDS
    writer = csv.DictWriter(buffer, fieldnames=names + CENSUS_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in records:
        census = r.get("census") or {}
        shares = census.get("percent", {}) if census.get("status") == "ok" else {}
        writer.writerow({**{k: _csv_value(r.get(k)) for k in names},
                         **{field: _csv_value(shares.get(name)) for field, name in zip(CENSUS_FIELDS, CENSUS_CLASSES)}})
    return buffer.getvalue()


def _csv_value(value):
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return " ".join(_csv_value(v) for v in value)
    if isinstance(value, str):
        return value.splitlines()[-1] if value else value
    return value


def _num(value, fmt):
    return format(value, fmt) if value is not None else "-"


def _times(value):
    return _num(value, ".2f") + ("x" if value else "")


def _short_reason(record, width=90):
    """The gist of why a run did not produce timings: a skip's first sentence, a crash's last line."""
    text = (record.get("reason") or "").strip()
    if not text:
        return "no reason given"
    line = text.split(". ")[0] if record.get("status") == "skipped" else text.splitlines()[-1]
    return line if len(line) <= width else line[:width - 3] + "..."


def format_table(records):
    """A fixed-width text table of the results, speedups included (call :func:`add_speedups` first). ``cpu ms`` is the
    process's CPU time per step (all cores count) and ``cpu x`` the speedup by that measure: on a busy shared machine
    the steadier of the two. Inference rows add the per-call latency (p50, p90, p99)."""
    latency = any(r.get("latency_ms_median") is not None for r in records)
    fields = {throughput_field(r) for r in records}
    field = fields.pop() if len(fields) == 1 else "images_per_second"  # one model per invocation: one unit
    head = f"{'model':<18}{'input':>7}{'mode':>10}  {'precision':<42}{'batch':>6}{UNITS[field]:>10}{'ms/step':>10}" \
           f"{'+/-':>8}{'cpu ms':>9}{'peak MB':>9}{'speedup':>9}{'cpu x':>7}{'memory':>8}" \
           + (f"{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}" if latency else "")
    lines = [head, "-" * len(head)]
    for r in records:
        row = f"{r['model']:<18}{input_size(r):>7}{r['mode']:>10}  {label(r):<42}{r['batch_size']:>6}"
        if r.get("status") != "ok":
            lines.append(f"{row}  {r.get('status', 'failed').upper()}: {_short_reason(r)}")
            continue
        lines.append(row + f"{_num(r.get(field), '.2f'):>10}{_num(r['ms_per_step'], '.1f'):>10}"
                     f"{_num(r['ms_per_step_spread'], '.1f'):>8}{_num(r.get('cpu_ms_per_step'), '.0f'):>9}"
                     f"{_num(r['peak_memory_mb'], '.0f'):>9}"
                     f"{_times(r.get('speedup')):>9}{_times(r.get('cpu_speedup')):>7}{_times(r.get('memory_ratio')):>8}"
                     + ("".join(f"{_num(r.get(k), '.1f'):>9}" for k in LATENCY_FIELDS[:3]) if latency else ""))
    return "\n".join(lines)


def format_census(records):
    """Lines for the terminal: each row's kernel census (:func:`mxfp16.bench.census.format_census`), if taken."""
    lines = []
    for r in records:
        census = r.get("census")
        name = f"{label(r)} batch {r['batch_size']}"
        if census and census.get("status") == "ok":
            lines += census_lines(name, census)
        elif census:
            reason = (census.get("reason") or "").strip().splitlines()
            lines.append(f"{name} census: not taken ({reason[-1] if reason else 'no reason given'})")
    return "\n".join(lines)


def round_ratios(document):
    """The spread of every ratio in a loaded ``bench.json`` (not changed), derived from its rows' ``rounds``.

    Returns
    -------
    dict
        ``{"speedup": {key: {...}}, "peer": {key: {...}}}``, keyed as in ``bench.json``: each ratio that has rounds,
        with :func:`round_spread`'s figures.
    """
    import copy

    rows = copy.deepcopy(document["results"])  # add_speedups writes into the rows
    spread = ("round_ratios", "round_min", "round_max")
    speedups = {key: {name: e[name] for name in ("speedup",) + spread}
                for key, e in add_speedups(rows).items() if "round_ratios" in e}
    peers = {}
    for key, e in _peer_comparison(rows).items():
        fields = {f"{kind}_{name}": e[f"{kind}_{name}"] for kind in ("mixed", "float32")
                  if f"{kind}_round_ratios" in e for name in ("ratio",) + spread}
        if fields:
            peers[key] = fields
    return {"speedup": speedups, "peer": peers}


def main(argv=None):
    """``python -m mxfp16.bench.report --round-ratios BENCH_JSON``: write ``round_ratios.json`` beside it."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m mxfp16.bench.report",
                                     description="Derive the ratio within each round, and its lowest and highest "
                                                 "value, from a recorded bench.json's rounds.")
    parser.add_argument("--round-ratios", metavar="BENCH_JSON", required=True,
                        help="a bench.json recorded with --rounds 2 or more; round_ratios.json is written into "
                             "its folder (required)")
    args = parser.parse_args(argv)
    with open(args.round_ratios, encoding="utf-8") as handle:
        document = json.load(handle)
    derived = round_ratios(document)
    if not derived["speedup"] and not derived["peer"]:
        parser.error(f"{args.round_ratios} has no rows with rounds: it was recorded with --rounds 1")
    out = os.path.join(os.path.dirname(args.round_ratios), "round_ratios.json")
    write_json(out, {"source": os.path.basename(args.round_ratios),
                     "derived_by": "python -m mxfp16.bench.report --round-ratios BENCH_JSON", **derived})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
