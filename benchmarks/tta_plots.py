"""Plots of ``benchmarks/tta_sweep.py``'s results: accuracy against modelled time for every
configuration of each task, and the batch autoscale chose over time.

    PYTHONPATH=src:. python benchmarks/tta_plots.py RESULTS.json [--out docs/img]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt


def _accuracy(ax: Any, configs: list[dict[str, Any]], target: float, title: str) -> None:
    """Seed 0's held-out accuracy of each configuration against modelled seconds."""
    for c in configs:
        curve = c["curves"][0] if c.get("curves") else []
        if not curve:
            continue
        xs, ys = zip(*curve, strict=True)
        style = "-" if c["name"].startswith("autoscale") else ":"
        width = 2.0 if c["name"].startswith("autoscale") else 1.2
        ax.plot(xs, ys, style, linewidth=width, label=c["name"])
    ax.axhline(target, color="grey", linewidth=0.8)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("modelled seconds")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(max(0.0, target - 0.3), min(1.0, target + 0.08))
    ax.legend(fontsize=7)


def _batches(ax: Any, configs: list[dict[str, Any]], title: str) -> None:
    """The global batch each autoscale variant trained at (seed 0), a step plot."""
    for c in configs:
        if not c["name"].startswith("autoscale") or not c.get("batches"):
            continue
        points = c["batches"][0]
        xs = [0.0] + [p[0] for p in points[1:]]
        ys = [p[1] for p in points]
        if c.get("curves") and c["curves"][0]:
            xs.append(c["curves"][0][-1][0])  # held to the end of the run
            ys.append(ys[-1])
        ax.step(xs, ys, where="post", label=c["name"])
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("modelled seconds")
    ax.set_ylabel("global batch")
    ax.legend(fontsize=7)


def _seconds(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else "not reached"


def table(result: dict[str, Any], key: str | None = None) -> str:
    """A markdown table of one task's configurations: rate, median and per-seed modelled
    seconds to target, and the ratio to the best fixed configuration."""
    configs = result[key]["configs"] if key else result["configs"]
    fixed = [c["median_seconds"] for c in configs if c["name"].startswith("fixed")]
    best, middle = min(fixed), statistics.median(fixed)
    rows = [
        "| configuration | lr | median s | seeds | / best fixed | / median fixed |",
        "|---|---|---|---|---|---|",
    ]
    for c in configs:
        t = c["median_seconds"]
        seeds = ", ".join(_seconds(x) for x in c["seconds"])
        lr = f"{c['lr']:.4f}" if c.get("lr") else ""
        rows.append(
            f"| {c['name']} | {lr} | {_seconds(t)} | {seeds} | {t / best:.2f} | {t / middle:.2f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results")
    parser.add_argument("--out", default="docs/img")
    args = parser.parse_args()
    results = json.loads(Path(args.results).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for key, suffix in ((None, ""), ("rescale", "-rescale")):
        rows = [r for r in results if key is None or key in r]
        if not rows:
            continue
        fig, axes = plt.subplots(2, len(rows), figsize=(5 * len(rows), 8), squeeze=False)
        for i, result in enumerate(rows):
            configs = result[key]["configs"] if key else result["configs"]
            title = result["task"] + (" (2 → 4 → 1 workers)" if key else " (2 workers)")
            _accuracy(axes[0][i], configs, result["target"], title)
            _batches(axes[1][i], configs, f"{result['task']}: batch chosen")
        fig.tight_layout()
        path = out / f"tta{suffix}.png"
        fig.savefig(path, dpi=90)
        print(path)
        for result in rows:
            title = result["task"] + (" under 2 → 4 → 1 workers" if key else "")
            print(f"\n{title}\n\n{table(result, key)}")


if __name__ == "__main__":
    main()
