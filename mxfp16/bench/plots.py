"""The benchmark's PNG figures: throughput, peak memory and speedup by precision and batch size; inference latency."""
import os

import numpy as np

from ..plumbing.plotting import color_cycle, new_figure, save_png
from .report import UNITS, input_size, label, throughput_field


def _bar_text(height, value):
    """A bar's label: a ratio to 2 decimals, a count whole from 100 up (``1196``, not ``1.2e+03``), else 3 digits."""
    if height is None or np.isnan(height):
        return ""
    if value == "speedup":
        return f"{height:.2f}"
    return f"{height:.0f}" if abs(height) >= 100 else f"{height:.3g}"


def _grouped_bars(records, value, ylabel, title, path, colors, baseline_line=None, whisker=None):
    ok = [r for r in records if r.get("status") == "ok" and r.get(value) is not None]
    batch_sizes = sorted({r["batch_size"] for r in ok})
    labels = list(dict.fromkeys(label(r) for r in ok))
    fig, ax = new_figure(figsize=(max(5.0, 1.6 * len(batch_sizes) * max(1, len(labels)) ** 0.5 + 2), 3.8))
    width = 0.8 / max(1, len(labels))
    x = np.arange(len(batch_sizes))

    def column(name, key):
        return [next((r[key] for r in ok if label(r) == name and r["batch_size"] == bs), np.nan) for bs in batch_sizes]

    for i, name in enumerate(labels):
        heights = column(name, value)
        # a whisker from the bar's top up to the tail value (p99 over the median)
        tops = None if whisker is None else [np.zeros(len(heights)), np.subtract(column(name, whisker), heights)]
        bars = ax.bar(x + (i - (len(labels) - 1) / 2) * width, heights, width, label=name, color=colors[name],
                      yerr=tops, capsize=3 if tops is not None else 0)
        ax.bar_label(bars, labels=[_bar_text(h, value) for h in heights], fontsize=7)
    tallest = max((r.get(whisker or value) or r[value] for r in ok), default=0)
    if tallest:
        ax.set_ylim(0, tallest * 1.3)  # room for the legend above the bars
    if baseline_line is not None:
        ax.axhline(baseline_line, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(x, [f"batch {bs}" for bs in batch_sizes])
    ax.set_ylabel(ylabel)
    if not ok:  # e.g. no precision ran beside float32 here: say so rather than draw empty axes
        ax.set_title(title)
        ax.text(0.5, 0.5, f"nothing to draw:\nno {title.lower()} was measured\nin this invocation",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return save_png(fig, path)
    ax.set_title(f"{title}: {ok[0]['model']}, {input_size(ok[0])}, {ok[0]['mode']}")
    return save_png(fig, path, legend=ax)


def write_plots(out_dir, records):
    """Write ``throughput.png``, ``memory.png`` and ``speedup.png`` (and ``latency.png`` for inference); return their
    paths. Only successful runs are drawn; ``speedup`` needs :func:`mxfp16.bench.report.add_speedups` first.
    ``latency.png`` draws the median per-call latency of the smallest batch with a whisker up to the p99."""
    os.makedirs(out_dir, exist_ok=True)
    non_baseline = [r for r in records if r.get("precision") != "float32"]
    # One colour per precision across the three figures.
    cycle = color_cycle()
    colors = {name: cycle[i % len(cycle)] for i, name in enumerate(dict.fromkeys(label(r) for r in records))}
    timed = [r for r in records if r.get("status") == "ok" and r.get("latency_ms_median") is not None]
    field = throughput_field(records[0]) if records else "images_per_second"  # one model per invocation
    # Latency is a question about single requests: the smallest batch (1 by default), on its own scale.
    smallest = [r for r in timed if r["batch_size"] == min(t["batch_size"] for t in timed)]
    latency = [_grouped_bars(smallest, "latency_ms_median", "ms per call (median, whisker to p99)", "Latency",
                             os.path.join(out_dir, "latency.png"), colors, whisker="latency_ms_p99")] if timed else []
    return latency + [
        _grouped_bars(records, field, UNITS[field].replace("/s", " / second"), "Throughput",
                      os.path.join(out_dir, "throughput.png"), colors),
        _grouped_bars(records, "peak_memory_mb", "peak memory (MB)", "Peak memory",
                      os.path.join(out_dir, "memory.png"), colors),
        _grouped_bars(non_baseline, "speedup", "speedup over float32", "Speedup",
                      os.path.join(out_dir, "speedup.png"), colors, baseline_line=1.0),
    ]
