"""Compare finished training runs: accuracy, loss and speed of float32 against mixed precision.

Every number a comparison uses is checked when the run is read (:data:`RANGES`): a NaN, an infinity or a value
outside its range refuses the run, naming the file and the field, instead of printing ``nan`` or a 300-digit number.
"""
import itertools
import math
import os
from dataclasses import dataclass

from ..plumbing.fileio import JSONFileError, read_json, read_jsonl, write_json
from ..plumbing.output import atomic_write, shown
from .outputs import METRIC_FIELDS, SUMMARY_FIELDS

#: The range of each number a comparison reads, ``(low, high)`` inclusive; ``None`` is allowed where noted.
RANGES = {
    "final_val_top1": (0.0, 1.0), "best_val_top1": (0.0, 1.0), "val_top1": (0.0, 1.0), "val_top5": (0.0, 1.0),
    "train_top1": (0.0, 1.0), "images_per_second": (1e-9, 1e9), "peak_memory_mb": (0.0, 1e9),
    "seconds": (0.0, 1e9), "epochs": (1, 1e6), "epoch": (1, 1e6), "skipped_steps": (0, 1e12),
    "train_loss": (0.0, 1e6), "loss_scale": (0.0, 3.5e38), "final_loss_scale": (0.0, 3.5e38), "lr": (0.0, 1e6),
}
#: Fields that may be ``null`` (not measured: a CPU without a memory counter, a run with no timing, an epoch
#: whose steps were all skipped and so has no training loss; :func:`mxfp16.train.epochs.missing_marked`).
NULLABLE = {"peak_memory_mb", "images_per_second", "train_loss", "train_top1"}


class RunDirError(ValueError):
    """A run directory that is missing, incomplete or unreadable."""


def check_number(value, name, where):
    """``value`` if it is a finite number inside :data:`RANGES` for ``name``; else :class:`RunDirError`."""
    if value is None and name in NULLABLE:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RunDirError(f"{where}: {name} is {value!r}, not a finite number; the file was changed or damaged "
                          "after the run wrote it. Re-run or leave this run out")
    low, high = RANGES.get(name, (-math.inf, math.inf))
    if not low <= value <= high:
        raise RunDirError(f"{where}: {name} {value:.6g} is outside {low:g}..{high:g}, which no run of mxfp16 train "
                          "writes; the file was changed or damaged. Re-run or leave this run out")
    return value


@dataclass
class FinishedRun:
    """One training run as read from its folder."""

    name: str
    path: str
    config: dict
    metrics: list
    summary: dict

    @property
    def precision(self):
        return self.summary["precision"]

    @property
    def wall_seconds(self):
        """Cumulative training time at the end of each epoch."""
        return list(itertools.accumulate(float(m["seconds"]) for m in self.metrics))


def _read(path, what, reader=read_json, fix=None):
    """``reader(path, fix or what)``, refused as :class:`RunDirError` when the file is missing (``what``) or damaged."""
    if not os.path.exists(path):
        raise RunDirError(f"{shown(path)} is missing: {what}")
    try:
        return reader(path, fix or what)
    except JSONFileError as err:
        raise RunDirError(str(err)) from None


def _load_run(path):
    """Read one run directory; :class:`RunDirError` names a missing folder, file or field and what to do."""
    if not os.path.isdir(path):
        raise RunDirError(f"{shown(path)!r} is not a folder; pass the --out folder of an `mxfp16 train` run")
    unfinished = "the run has not finished an epoch (train it, or resume it with mxfp16 train --resume)"
    config = _read(os.path.join(path, "config.json"), "not an mxfp16 train output folder?")
    summary_path, metrics_path = os.path.join(path, "summary.json"), os.path.join(path, "metrics.jsonl")
    summary = _read(summary_path, unfinished)
    metrics = _read(metrics_path, unfinished, read_jsonl, "re-run or leave this run out")
    if not metrics:
        raise RunDirError(f"{shown(metrics_path)} has no epochs: {unfinished}")
    _check_summary(summary, summary_path)
    _check_metrics(metrics, metrics_path)
    return FinishedRun(name=os.path.basename(os.path.normpath(path)), path=path, config=config, metrics=metrics,
                       summary=summary)


def _check_metrics(metrics, metrics_path):
    """Refuse an epoch record that lacks a field, or whose numbers are out of range."""
    for m in metrics:
        lacking = [f for f in METRIC_FIELDS if f not in m or (m[f] is None and f not in NULLABLE)]
        if lacking:
            raise RunDirError(f"{shown(metrics_path)}: epoch record {m.get('epoch', '?')} lacks {', '.join(lacking)}")
        for field in METRIC_FIELDS:
            if field in RANGES:
                check_number(m[field], field, f"{shown(metrics_path)} epoch {m['epoch']}")


def _check_summary(summary, summary_path):
    """Refuse a ``summary.json`` that lacks a field, or whose numbers and names are not numbers and names."""
    missing = [f for f in SUMMARY_FIELDS if f not in summary]
    if missing:
        raise RunDirError(f"{shown(summary_path)} lacks {', '.join(missing)}; was it written by mxfp16 train?")
    for name in ("final_val_top1", "best_val_top1", "images_per_second", "peak_memory_mb", "epochs"):
        check_number(summary[name], name, shown(summary_path))
    for field in ("precision", "model"):
        if not isinstance(summary[field], str):
            raise RunDirError(f"{shown(summary_path)}: {field} is {summary[field]!r}, not a name; the file was "
                              "changed or damaged. Re-run or leave this run out")


def check_distinct(paths, fix):
    """Refuse a folder given twice (however its path is spelled); ``fix`` ends the message."""
    seen = {}
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            raise RunDirError(f"{shown(path)} is given twice (also as {shown(seen[real])}){fix}")
        seen[real] = path


def load_runs(paths):
    """Read several run directories (:class:`RunDirError` for one unreadable or given twice); names made unique."""
    check_distinct(paths, "; pass each run folder once")
    runs = [_load_run(p) for p in paths]
    names = [r.name for r in runs]
    for r in runs:
        if names.count(r.name) > 1:
            r.name = os.path.normpath(r.path)
    return runs


def comparison_table(runs):
    """One row per run, with img/s speedup and accuracy difference against the first float32 run.

    Returns
    -------
    list of dict
        ``run``, ``path``, ``precision``, ``model``, ``epochs``, ``final_val_top1``, ``best_val_top1``,
        ``images_per_second``, ``peak_memory_mb``, ``train_seconds``, ``speedup`` and ``val_top1_delta`` (``None``
        without a float32 run). Another float32 run gets no speedup: it would show the run-to-run spread.
    """
    base = next((r for r in runs if r.precision == "float32"), None)
    rows = []
    for r in runs:
        s = r.summary
        row = {
            "run": r.name, "path": r.path, "precision": r.precision, "model": s["model"], "epochs": s["epochs"],
            "final_val_top1": s["final_val_top1"], "best_val_top1": s["best_val_top1"],
            "images_per_second": s["images_per_second"], "peak_memory_mb": s.get("peak_memory_mb"),
            "train_seconds": r.wall_seconds[-1], "speedup": None, "val_top1_delta": None,
        }
        if base is not None:
            if r is base or r.precision != "float32":
                row["speedup"] = s["images_per_second"] / base.summary["images_per_second"]
            row["val_top1_delta"] = s["final_val_top1"] - base.summary["final_val_top1"]
        rows.append(row)
    return rows


#: (row key, text header, text alignment or None: Markdown only, Markdown header, format); ``.21`` cuts long names.
_COLUMNS = (
    ("run", "run", "<22.21", "run", "{}"), ("precision", "precision", "<14", "precision", "{}"),
    ("epochs", "epochs", ">7", "epochs", "{}"), ("final_val_top1", "final top1", ">11", "final val top-1", "{:.4f}"),
    ("best_val_top1", "best top1", ">10", "best val top-1", "{:.4f}"),
    ("val_top1_delta", "vs fp32", ">9", "top-1 vs float32", "{:+.4f}"),
    ("images_per_second", "img/s", ">9", "img/s", "{:.2f}"), ("speedup", "speedup", ">9", "speedup", "{:.2f}x"),
    ("train_seconds", "train s", ">9", "train time (s)", "{:.1f}"),
    ("peak_memory_mb", None, None, "peak memory (MB)", "{:.0f}"),
)


def _cells(row, columns):
    return ["-" if row[c[0]] is None else c[4].format(row[c[0]]) for c in columns]


def format_table(rows):
    cols = [c for c in _COLUMNS if c[2]]
    head = "".join(format(c[1], c[2]) for c in cols)
    lines = ["".join(format(cell, c[2]) for cell, c in zip(_cells(r, cols), cols)) for r in rows]
    return "\n".join([head, "-" * len(head), *lines])


def _to_markdown(rows):
    lines = ["| " + " | ".join(c[3] for c in _COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(_cells(r, _COLUMNS)) + " |" for r in rows]) + "\n"


def _plot_runs(runs, path):
    """Loss and accuracy per epoch, and accuracy against wall time, one line per run, in one PNG."""
    from ..plumbing.plotting import new_figure, save_png

    fig, (ax_loss, ax_acc, ax_time) = new_figure(1, 3, figsize=(13, 3.8))
    for r in runs:
        epochs = [m["epoch"] for m in r.metrics]
        top1 = [m["val_top1"] for m in r.metrics]
        name = f"{r.name} ({r.precision})"
        ax_loss.plot(epochs, [m["train_loss"] for m in r.metrics], marker="o", label=name)
        ax_acc.plot(epochs, top1, marker="o", label=name)
        ax_time.plot(r.wall_seconds, top1, marker="o", label=name)
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="Loss per epoch")
    ax_acc.set(xlabel="epoch", ylabel="validation top-1", title="Accuracy per epoch")
    ax_time.set(xlabel="training time (s, cumulative)", ylabel="validation top-1", title="Accuracy against time")
    for ax in (ax_loss, ax_acc, ax_time):
        ax.grid(alpha=0.3)
    return save_png(fig, path, legend=ax_time)


def compare(paths, out_dir):
    """Read the runs, write ``compare.json``, ``compare.md`` and ``compare.png`` into ``out_dir``.

    Returns
    -------
    (list of dict, list of str)
        The table rows and the paths written.
    """
    runs = load_runs(paths)
    rows = comparison_table(runs)
    os.makedirs(out_dir, exist_ok=True)
    json_path, md_path, png_path = (os.path.join(out_dir, f"compare.{ext}") for ext in ("json", "md", "png"))
    write_json(json_path, {"runs": rows, "metrics": {r.name: r.metrics for r in runs}})
    with atomic_write(md_path) as handle:
        handle.write(_to_markdown(rows))
    _plot_runs(runs, png_path)
    return rows, [json_path, md_path, png_path]
