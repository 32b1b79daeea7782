"""A diagnosis as text (summary and per-layer table), a PNG histogram and JSON.

The words "underflow" and "recommended loss scale" appear in the text on
purpose: users and scripts grep for them.
"""
import math

import numpy as np

from ..float_formats import FLOAT16, format_scale

__all__ = ["format_summary", "format_table", "plot_histogram", "diagnosis_document"]


def _pct(fraction):
    # A tiny non-zero share must not read as 0: that is exactly what diagnostics look for.
    if 0 < fraction < 1e-4:
        return "<0.01%"
    return f"{100.0 * fraction:.2f}%"


def format_summary(diagnosis):
    """A few lines: underflow per kind at 1, at the asked scale and at the recommended one; the forward check."""
    rec, asked = diagnosis.recommendation, diagnosis.loss_scale
    flush_exp = int(round(math.log2(FLOAT16.smallest_subnormal)))
    # float16 rounds to nearest: |g| * S at or below 2^-25 becomes 0, and between 2^-25 and 2^-24 it
    # becomes 2^-24 (its only digit). "Underflow" counts both: neither keeps the value.
    lines = [f"underflow in float16 (non-zero gradients with |g| * S < 2^{flush_exp}: up to 2^{flush_exp - 1} they "
             f"flush to zero, above it they round to 2^{flush_exp}):"]
    for stats in diagnosis.totals.values():
        parts = [f"{_pct(stats.fractions_at(1.0)['underflow'])} at S=1"]
        if asked != 1.0:
            parts.append(f"{_pct(stats.fractions_at(asked)['underflow'])} at S={format_scale(asked)}")
        parts.append(f"{_pct(stats.fractions_at(rec.scale)['underflow'])} at S={format_scale(rec.scale)} (recommended)")
        lines.append(f"  {stats.name:<21} {', '.join(parts)}; {stats.nonzero:,} non-zero values, "
                     f"{stats.zeros:,} exact zeros" + (f", {stats.nonfinite:,} inf/NaN" if stats.nonfinite else ""))
    everything = diagnosis.totals["all"]
    over = everything.fractions_at(asked)["overflow"]
    lines.append(f"overflow at S={format_scale(asked)} (|g| * S > {FLOAT16.max:g}): {_pct(over)}; "
                 f"largest |g| = {rec.max_abs:.4g} "
                 f"({diagnosis.largest.kind} {diagnosis.largest.name})")
    if rec.limited_by == "largest gradient":
        why = f"largest |g| {rec.max_abs:.4g} x {format_scale(rec.scale)} x margin {rec.margin:g} <= {FLOAT16.max:g}"
    else:
        why = f"limited by the {rec.limited_by}"
    lines.append(f"recommended loss scale: {format_scale(rec.scale)} (2^{rec.log2_scale}); {why}; underflow "
                 f"{_pct(rec.underflow_at_1)} -> {_pct(rec.underflow_at_scale)}, subnormal {_pct(rec.subnormal_at_1)} "
                 f"-> {_pct(rec.subnormal_at_scale)}")
    if diagnosis.forward is not None:
        bad = diagnosis.forward.first_bad_layer
        lines.append(f"forward check ({diagnosis.forward.dtype}): " +
                     (f"first layer with inf/NaN output: {bad}" if bad else
                      f"every layer's output is finite ({len(diagnosis.forward.layers)} layer calls)"))
    elif diagnosis.forward_skipped:
        lines.append(f"forward check: skipped: {diagnosis.forward_skipped}")
    return "\n".join(lines)


def format_table(diagnosis, limit=None):
    """One row per parameter and activation gradient, worst underflow (at the asked scale) first."""
    asked, rec = diagnosis.loss_scale, diagnosis.recommendation.scale
    rows = diagnosis.worst_first()[:limit]
    width = max([len("layer")] + [len(s.name) for s in rows])
    header = (f"{'layer':<{width}}  {'kind':<10} {'values':>11} {'zeros':>7} {'underflow':>9} {'underflow':>9} "
              f"{'underflow':>9} {'subnormal':>9} {'overflow':>9} {'min |g|':>9} {'max |g|':>9}")
    scales = (f"{'':<{width}}  {'':<10} {'':>11} {'':>7} {'S=1':>9} {'S=' + format(asked, 'g'):>9} "
              f"{'S=' + format(rec, 'g'):>9} {'S=' + format(asked, 'g'):>9} {'S=' + format(asked, 'g'):>9}")
    lines = [header, scales]
    for s in rows:
        at1, at_asked, at_rec = s.fractions_at(1.0), s.fractions_at(asked), s.fractions_at(rec)
        zeros = s.zeros / s.count if s.count else 0.0
        smallest = f"{s.min_nonzero:.2e}" if np.isfinite(s.min_nonzero) else "-"
        lines.append(f"{s.name:<{width}}  {s.kind:<10} {s.count:>11,} {_pct(zeros):>7} {_pct(at1['underflow']):>9} "
                     f"{_pct(at_asked['underflow']):>9} {_pct(at_rec['underflow']):>9} "
                     f"{_pct(at_asked['subnormal']):>9} {_pct(at_asked['overflow']):>9} {smallest:>9} "
                     f"{s.max_abs:>9.2e}")
    lines.append(f"(underflow at S=1, at the asked S={format_scale(asked)} "
                 f"and at the recommended S={format_scale(rec)}; percentages of the "
                 "non-zero finite values, except zeros, which is of all values; values summed over "
                 f"{max(s.batches for s in diagnosis.stats)} batch(es))")
    return "\n".join(lines)


def _fraction_histogram(stats, shift=0):
    exponents, counts, _, _ = stats.log2_histogram()
    return exponents + shift, counts / max(stats.nonzero, 1)


def _stairs(ax, x, y, **style):
    # Step outline over whole binades [x, x+1) (Axes.stairs needs matplotlib 3.4).
    ax.step(np.append(x, x[-1] + 1), np.append(y, y[-1]), where="post", **style)


def plot_histogram(diagnosis, path):
    """Save the log2|g| histogram against float16's range as a PNG (written atomically).

    Drawn: the share of non-zero values per binade at scale 1 and at the recommended scale, with float16's smallest
    subnormal, smallest normal and largest value, and the region float16 loses shaded.
    """
    from ..plumbing.plotting import new_figure, save_png

    totals, rec = diagnosis.totals, diagnosis.recommendation
    lines = {f"{name} {text}": math.log2(value) for name, value, text in (
        ("smallest subnormal", FLOAT16.smallest_subnormal, f"2^{math.log2(FLOAT16.smallest_subnormal):.0f}"),
        ("smallest normal", FLOAT16.smallest_normal, f"2^{math.log2(FLOAT16.smallest_normal):.0f}"),
        ("max", FLOAT16.max, f"{FLOAT16.max:g}"))}
    flush = math.log2(FLOAT16.smallest_subnormal)
    fig, ax = new_figure(figsize=(11, 4.8))
    drawn = []
    for key, colour in (("parameter", "tab:blue"), ("activation", "tab:orange")):
        if key in totals:
            x, y = _fraction_histogram(totals[key])
            _stairs(ax, x, 100 * y, label=f"{totals[key].name}, S=1", color=colour, linewidth=1.5)
            drawn.append((x, y))
    x, y = _fraction_histogram(totals["all"], shift=rec.log2_scale)
    _stairs(ax, x, 100 * y, label=f"all gradients x {format_scale(rec.scale)} (recommended)",
              color="tab:green", linestyle="--", linewidth=1.5)
    drawn.append((x, y))
    occupied = np.concatenate([xs[ys > 0] for xs, ys in drawn])
    low = min(occupied.min() if occupied.size else 0, flush) - 3
    high = max(occupied.max() + 1 if occupied.size else 0, math.log2(FLOAT16.max)) + 2
    ax.axvspan(low, flush, color="grey", alpha=0.2, label="lost in float16 (0, or rounded to 2^-24)")
    for (name, value), style in zip(lines.items(), (":", "-.", "-")):
        ax.axvline(value, color="black", linestyle=style, linewidth=1, label=f"float16 {name}")
    ax.set_xlim(low, high)
    # Log scale: the tails below 2^-24 are small shares and the whole point of the figure.
    ax.set_yscale("log")
    ax.set_ylim(bottom=1e-4)
    ax.set_xlabel("log2 |gradient|")
    ax.set_ylabel("% of non-zero values")
    ax.set_title(f"Gradient magnitudes against float16's range; recommended loss scale {format_scale(rec.scale)}\n"
                 f"underflow {_pct(rec.underflow_at_1)} at S=1, {_pct(rec.underflow_at_scale)} "
                 f"at S={format_scale(rec.scale)}",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_png(fig, path, dpi=110)


def diagnosis_document(diagnosis, config=None):
    """The diagnosis as one JSON-ready dict."""
    scales = sorted({1.0, diagnosis.loss_scale, diagnosis.recommendation.scale})
    return {
        "config": dict(config or {}),
        "float16": FLOAT16.as_dict(),
        "definitions": {
            "underflow": "0 < |g| * S < float16 smallest subnormal (at most 2^-25: flushes to zero; above: "
                         "rounds to 2^-24)",
            "subnormal": "smallest subnormal <= |g| * S < smallest normal",
            "overflow": "|g| * S > float16 max",
            "fractions": "of the non-zero finite values",
        },
        "loss_scale": diagnosis.loss_scale,
        "recommendation": dict(diagnosis.recommendation.as_dict(), largest_in=diagnosis.largest.name),
        "totals": {key: s.as_dict(scales) for key, s in diagnosis.totals.items()},
        "layers": [s.as_dict(scales) for s in diagnosis.worst_first()],
        "forward_check": diagnosis.forward.as_dict() if diagnosis.forward is not None else
        {"skipped": diagnosis.forward_skipped},
    }
