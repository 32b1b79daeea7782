"""How often would three seeds per side pass the 0.3-point goal?

Reads the ``parity.json`` that ``mxfp16 compare`` wrote beside this file
(24 seeds per side), splits the seeds into disjoint groups of three
(1-3, 4-6, ...), and reports each group's mean gap (amp-bfloat16 minus
float32, in points) as if it were the only three seeds run. Writes
``triplets.json`` and ``triplets.txt`` beside this file (atomically).

Run from the repository root::

    python docs/results/parity-demo-24seeds/triplets.py
"""
import json
import os

from mxfp16.plumbing.fileio import write_json
from mxfp16.plumbing.output import atomic_write

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GOAL = 0.3  # points: the bound on a three-seed mean gap


def main():
    with open(os.path.join(HERE, "parity.json")) as f:
        report = json.load(f)
    # Pair the two sides by seed: compare sorts runs by name, not by seed.
    a = dict(zip(report["a"]["seeds"], report["a"]["final_val_top1"]))
    b = dict(zip(report["b"]["seeds"], report["b"]["final_val_top1"]))
    seeds = sorted(set(a) & set(b))
    groups = [seeds[i:i + 3] for i in range(0, len(seeds) - len(seeds) % 3, 3)]
    rows = []
    for group in groups:
        gap = float(np.mean([b[s] - a[s] for s in group]))
        rows.append({"seeds": group, "gap": round(gap, 4), "within_goal": abs(gap) <= GOAL + 1e-9})
    gaps = np.array([r["gap"] for r in rows])
    out = {
        "goal": GOAL,
        "groups": rows,
        "n_groups": len(rows),
        "n_within_goal": int(sum(r["within_goal"] for r in rows)),
        "gap_min": float(gaps.min()),
        "gap_max": float(gaps.max()),
        "gap_sd": float(gaps.std(ddof=1)),
    }
    write_json(os.path.join(HERE, "triplets.json"), out, indent=1)
    lines = ["three-seed mean gap (amp-bfloat16 - float32, points), disjoint groups of seeds:"]
    for r in rows:
        seeds_txt = ", ".join(str(s) for s in r["seeds"])
        mark = "within" if r["within_goal"] else "outside"
        lines.append(f"  seeds {seeds_txt}: {r['gap']:+.2f}  ({mark} +-{GOAL})")
    lines.append(f"{out['n_within_goal']} of {out['n_groups']} groups within +-{GOAL}; "
                 f"group gaps from {out['gap_min']:+.2f} to {out['gap_max']:+.2f} (sd {out['gap_sd']:.2f})")
    text = "\n".join(lines) + "\n"
    with atomic_write(os.path.join(HERE, "triplets.txt")) as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
