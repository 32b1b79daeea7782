"""Accuracy parity over several seeds: is the gap between two precisions bigger than the noise?

:func:`parity` reports each side's (``a``, usually float32; ``b``, mixed precision) mean final top-1, seed-to-seed
spread and img/s; then the gap (``b`` minus ``a``), its Welch's t-interval and, when both sides ran the same seeds,
the paired interval over per-seed differences. The gap
*exceeds the noise* when its interval excludes 0 and it is larger than the larger side's sd.
"""
import glob
import json
import math
import os

import numpy as np

from ..plumbing.fileio import write_json
from ..plumbing.output import atomic_write
from .compare import RunDirError, check_distinct, load_runs

__all__ = ["seeds_needed", "parity", "format_parity", "write_parity", "check_groups", "RUN_ONLY",
           "PRECISION_SETTINGS"]

#: config.json fields that say how a run was executed or recorded, not what it trained: they may differ.
#: (``ctx`` and ``precision`` are compared as resolved; ``data_dir``/``data_root`` as the ``source`` read.)
RUN_ONLY = frozenset({"out", "seed", "command", "resumed", "resume", "overwrite", "accept_changed_data", "progress",
                      "log_every", "keep_checkpoints", "threads", "resolved_threads", "workers", "ctx", "data_dir",
                      "data_root", "augment", "precision", "auto"})
#: What may differ between the two sides besides RUN_ONLY: the precision and what it decides.
PRECISION_SETTINGS = frozenset({"resolved_precision", "resolved_amp_lists", "loss_scale", "allow_cpu_float16"})

#: The gap, in points, compare says how many seeds it would take to resolve (docs/training.md's parity goal).
RESOLVE = 0.3
#: Beyond this many seeds per side compare says "more than" rather than a number.
MAX_SEEDS = 1000


def _expand_paths(patterns):
    """Run folders from paths and shell-style globs (a quoted ``'runs/f32-s*'`` reaches here unexpanded)."""
    paths = []
    for pattern in patterns:
        if os.path.exists(pattern) or not glob.has_magic(pattern):
            paths.append(pattern)
            continue
        found = sorted(p for p in glob.glob(pattern) if os.path.isdir(p))
        if not found:
            raise RunDirError(f"{pattern!r} matches no run folder")
        paths += found
    return paths


def _settings(run):
    """What a run trained with: its config without :data:`RUN_ONLY`, and how many epochs it finished."""
    settings = {k: v for k, v in run.config.items() if k not in RUN_ONLY}
    settings["epochs finished"] = len(run.metrics)
    return settings


def _settings_differences(runs, allowed=frozenset()):
    """``{setting: "value (runs); value (runs)"}`` for each setting outside ``allowed`` that differs among ``runs``."""
    settings = [_settings(r) for r in runs]
    found = {}
    for key in sorted(set().union(*settings) - set(allowed)):
        seen = {}
        for run, values in zip(runs, settings):
            seen.setdefault(json.dumps(values.get(key), sort_keys=True), []).append(run.name)
        if len(seen) > 1:
            found[key] = "; ".join(f"{value} ({', '.join(names[:3])}{' ...' if len(names) > 3 else ''})"
                                   for value, names in seen.items())
    return found


def check_groups(a_runs, b_runs, allow_differences=False):
    """Refuse the same folder twice, copies of one run, and runs whose settings (epochs finished included) differ
    in more than the seed (between the sides: and the precision): they are not seeds of one experiment.

    Returns
    -------
    list of str
        With ``allow_differences``, the settings that differ; else ``[]`` (differences raise :class:`RunDirError`).
    """
    everything = a_runs + b_runs
    check_distinct([run.path for run in everything], ": one run is one seed. Pass each run folder once")
    for side, runs in (("--a", a_runs), ("--b", b_runs)):
        by_seed, by_digest = {}, {}
        for run in runs:
            key = (json.dumps(run.config.get("seed")), json.dumps(_settings(run), sort_keys=True))
            if key in by_seed:
                raise RunDirError(f"{side}: {run.name} and {by_seed[key]} ran the same seed "
                                  f"({run.config.get('seed')!r}) with the same settings: they are one experiment "
                                  "run twice, not two seeds. Leave one out, or train another seed")
            by_seed[key] = run.name
            digest = run.summary.get("params_digest")
            if digest and digest in by_digest:
                raise RunDirError(f"{side}: {run.name} and {by_digest[digest]} ended with bit-identical parameters: "
                                  "copies of one run, not two seeds. Leave one out")
            by_digest.setdefault(digest, run.name)
    differences, within = [], set()
    for side, runs in (("--a", a_runs), ("--b", b_runs)):
        for key, values in _settings_differences(runs).items():
            differences.append(f"{side} {key}: {values}")
            within.add(key)
    differences += [f"between --a and --b: {key}: {values}"
                    for key, values in _settings_differences(everything, PRECISION_SETTINGS).items()
                    if key not in within]
    if differences and not allow_differences:
        raise RunDirError("the runs differ in more than the seed (and, between the sides, the precision), so they "
                          "are not seeds of one experiment:\n  " + "\n  ".join(differences[:12])
                          + ("\n  ..." if len(differences) > 12 else "")
                          + "\nCompare runs that differ only in the seed, or pass --allow-differences to pool them "
                            "anyway (the report then lists the differences)")
    return differences if allow_differences else []


def _side_summary(runs):
    """Mean, spread and speed of one side's runs (final val top-1 in points, i.e. x100)."""
    values = np.array([100.0 * r.summary["final_val_top1"] for r in runs])
    speeds = [r.summary["images_per_second"] for r in runs]
    return {
        "runs": [r.name for r in runs], "precisions": sorted({r.precision for r in runs}),
        "seeds": [r.config.get("seed") for r in runs], "n": len(runs),
        "final_val_top1": values.tolist(), "mean": float(values.mean()),
        "sd": float(values.std(ddof=1)) if len(values) > 1 else None,
        "range": float(values.max() - values.min()),
        "images_per_second": float(np.mean(speeds)) if all(s is not None for s in speeds) else None,
    }


def _interval(gap, se, df, confidence):
    """``gap +- t(df) * se`` at ``confidence``, as a report's interval: ``gap``, ``low``, ``high``, ``df``, ``se``."""
    from scipy import stats

    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * se
    return {"gap": gap, "low": gap - half, "high": gap + half, "df": df, "se": se}


def _welch_interval(a, b, confidence=0.95):
    """Welch's interval for ``mean(b) - mean(a)``; ``None`` with fewer than two values on a side (no spread)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if va + vb else math.inf
    return _interval(float(b.mean() - a.mean()), math.sqrt(va + vb), float(df), confidence)


def _paired_interval(a_by_seed, b_by_seed, confidence=0.95):
    """The interval of the mean per-seed difference ``b - a`` over the seeds both sides ran (``None`` under two)."""
    seeds = sorted(set(a_by_seed) & set(b_by_seed), key=str)
    if len(seeds) < 2:
        return None
    d = np.array([b_by_seed[s] - a_by_seed[s] for s in seeds], float)
    return dict(_interval(float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d))), len(d) - 1, confidence),
                seeds=seeds, differences=d.tolist())


def seeds_needed(sd, resolve, confidence=0.95, paired=True, limit=MAX_SEEDS):
    """Seeds per side for a confidence interval of the gap no wider than ``+-resolve``.

    Parameters
    ----------
    sd : float
        Paired: the standard deviation of the per-seed differences. Unpaired: ``sqrt((sd_a**2 + sd_b**2) / 2)``.
    resolve : float
        The half-width wanted, in the same unit (points).
    confidence : float
    paired : bool
        Paired: ``t(n - 1) * sd / sqrt(n)``; unpaired: ``t(2n - 2) * sd * sqrt(2 / n)``.
    limit : int

    Returns
    -------
    int or None
        The smallest ``n >= 2`` that reaches it; ``None`` when more than ``limit``
        would be needed.
    """
    from scipy import stats

    if resolve <= 0:
        raise ValueError(f"resolve must be positive, got {resolve!r}")
    q = 0.5 + confidence / 2
    for n in range(2, limit + 1):
        half = (stats.t.ppf(q, n - 1) * sd / math.sqrt(n) if paired
                else stats.t.ppf(q, 2 * n - 2) * sd * math.sqrt(2.0 / n))
        if half <= resolve:
            return n
    return None


def _resolution(report, resolve):
    """What it takes to resolve ``+-resolve`` points at this spread (``None`` without a spread)."""
    a, b = report["a"], report["b"]
    if report["paired"]:
        sd, paired = float(np.std(report["paired"]["differences"], ddof=1)), True
    elif a["sd"] is not None and b["sd"] is not None:
        sd, paired = math.sqrt((a["sd"] ** 2 + b["sd"] ** 2) / 2), False
    else:
        return None
    interval = report["paired"] or report["welch"]
    return {"resolve": resolve, "basis": "paired" if paired else "welch", "sd": sd,
            "half_width": (interval["high"] - interval["low"]) / 2,
            "seeds_per_side": seeds_needed(sd, resolve, report["confidence"], paired), "limit": MAX_SEEDS}


def parity(a_paths, b_paths, confidence=0.95, a_name="a", b_name="b", resolve=RESOLVE, allow_differences=False):
    """Read both sides' runs, check they are seeds of one experiment, and compare them (see the module docstring).

    ``resolve`` (points) is the gap the report's ``resolution`` says how many seeds would resolve.
    ``allow_differences`` pools runs whose settings differ (:func:`check_groups`).

    Returns
    -------
    (dict, list, list)
        The report, and the runs of each side.

    Raises
    ------
    RunDirError
        A run that cannot be read or holds impossible numbers, or groups that
        :func:`check_groups` refuses.
    """
    a_runs, b_runs = load_runs(_expand_paths(a_paths)), load_runs(_expand_paths(b_paths))
    differences = check_groups(a_runs, b_runs, allow_differences)
    a, b = _side_summary(a_runs), _side_summary(b_runs)
    report = {"a": dict(a, name=a_name), "b": dict(b, name=b_name), "confidence": confidence,
              "differences": differences, "gap": b["mean"] - a["mean"],
              "welch": _welch_interval(a["final_val_top1"], b["final_val_top1"], confidence),
              "paired": None, "speedup": None}
    by_seed = [{r.config.get("seed"): 100.0 * r.summary["final_val_top1"] for r in runs} for runs in (a_runs, b_runs)]
    if len(by_seed[0]) == len(a_runs) and len(by_seed[1]) == len(b_runs):  # seeds unique on each side
        report["paired"] = _paired_interval(*by_seed, confidence)
    if a["images_per_second"] and b["images_per_second"]:
        report["speedup"] = b["images_per_second"] / a["images_per_second"]
    interval = report["paired"] or report["welch"]
    noise = max(s for s in (a["sd"], b["sd"], 0.0) if s is not None)
    report["noise"] = noise
    report["interval_used"] = "paired" if report["paired"] else ("welch" if report["welch"] else None)
    report["exceeds_noise"] = (None if interval is None else
                               bool((interval["low"] > 0 or interval["high"] < 0) and abs(report["gap"]) > noise))
    report["resolution"] = _resolution(report, resolve)
    return report, a_runs, b_runs


def format_parity(report):
    """The report as text."""
    a, b = report["a"], report["b"]
    lines = [f"warning: pooled although their settings differ (--allow-differences): {d}"
             for d in report.get("differences") or []]
    for side in (a, b):
        spread = f"sd {side['sd']:.2f}, range {side['range']:.2f}" if side["sd"] is not None else "one run"
        speed = f", {side['images_per_second']:.1f} img/s" if side["images_per_second"] else ""
        lines.append(f"{side['name']}: {', '.join(side['precisions'])}, {side['n']} run(s) (seeds "
                     f"{', '.join(str(s) for s in side['seeds'])}): final val top-1 {side['mean']:.2f} points "
                     f"({spread}){speed}")
    level = f"{100 * report['confidence']:.0f}%"
    lines.append(f"gap {b['name']} - {a['name']}: {report['gap']:+.2f} points")
    lines += [f"  {level} interval ({name}, df {ci['df']:.1f}): [{ci['low']:+.2f}, {ci['high']:+.2f}]"
              for name, ci in (("Welch", report["welch"]), ("paired by seed", report["paired"])) if ci]
    if report["exceeds_noise"] is None:
        lines.append("  one run on a side: no spread to measure the gap against; run several seeds per side")
    elif report["exceeds_noise"]:
        lines.append(f"  the gap exceeds the noise (the interval excludes 0 and |gap| > seed-to-seed sd "
                     f"{report['noise']:.2f})")
    else:
        lines.append(f"  within the noise: the runs cannot tell the two apart (seed-to-seed sd {report['noise']:.2f})")
    res = report.get("resolution")
    if res:
        n = (f"about {res['seeds_per_side']} seeds per side" if res["seeds_per_side"]
             else f"more than {res['limit']} seeds per side")
        lines.append(f"  to resolve +-{res['resolve']:.2f} points ({level}) at this spread: {n} "
                     f"(now +-{res['half_width']:.2f} with {min(a['n'], b['n'])})")
    if report["speedup"]:
        lines.append(f"speed: {b['name']} at {report['speedup']:.2f}x {a['name']}'s img/s (means over runs)")
    return "\n".join(lines)


def _plot_parity(report, a_runs, b_runs, path):
    """Every run's validation curve, one colour per side, and each side's mean curve."""
    from ..plumbing.plotting import color_cycle, new_figure, save_png

    fig, ax = new_figure(figsize=(7, 4.2))
    colours = color_cycle()
    for colour, side, runs in ((colours[0], report["a"], a_runs), (colours[1], report["b"], b_runs)):
        curves = [[100.0 * m["val_top1"] for m in r.metrics] for r in runs]
        for curve in curves:
            ax.plot(range(1, len(curve) + 1), curve, color=colour, alpha=0.35, linewidth=1)
        length = min(len(c) for c in curves)
        mean = np.mean([c[:length] for c in curves], axis=0)
        ax.plot(range(1, length + 1), mean, color=colour, linewidth=2.5,
                label=f"{side['name']} ({', '.join(side['precisions'])}), mean of {len(runs)}")
    ax.set(xlabel="epoch", ylabel="validation top-1 (points)",
           title=f"Every seed's curve; gap {report['gap']:+.2f} points")
    ax.grid(alpha=0.3)
    return save_png(fig, path, legend=ax)


def write_parity(report, a_runs, b_runs, out_dir):
    """Write ``parity.json``, ``parity.txt`` and ``parity.png`` into ``out_dir``; return their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, name) for name in ("parity.json", "parity.txt", "parity.png")]
    write_json(paths[0], report)
    with atomic_write(paths[1]) as handle:
        handle.write(format_parity(report) + "\n")
    _plot_parity(report, a_runs, b_runs, paths[2])
    return paths
