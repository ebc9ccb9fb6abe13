"""Draws the benchmarks' figures against concurrency from their JSON results.

* ``--figure cycles``: acquire+release cycles per second, one line per implementation (this
  project, the pure-Python peer, redis-py running this project's scripts), the median cycles/s
  at each number of coroutines on a log-2 axis, and the server's ceiling (redis-benchmark,
  halved) as a dashed line. Reads ``results/acquire_release.json``, writes
  ``results/cycles_vs_concurrency.png``.
* ``--figure rates``: rate-limit hits per second, two panels (two policies, one policy), one
  line per implementation, and the ceiling of ``rate_hits.py`` (redis-benchmark running the
  floor's script) as a dashed line. Reads ``results/rate_hits.json``, writes
  ``results/rate_hits_vs_concurrency.png``.

It measures nothing itself: run ``acquire_release.py`` or ``rate_hits.py`` first (``bash
benchmarks/run.sh`` runs everything), then::

    benchmarks/.venv/bin/python benchmarks/plot.py [--figure cycles|rates]

(matplotlib, installed by setup_bench_env.sh).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from common import RESULTS_DIR

FIGURES = {
    "cycles": (RESULTS_DIR / "acquire_release.json", RESULTS_DIR / "cycles_vs_concurrency.png"),
    "rates": (RESULTS_DIR / "rate_hits.json", RESULTS_DIR / "rate_hits_vs_concurrency.png"),
}


def plot(report: dict[str, Any], output: Path) -> None:
    lines: dict[str, list[tuple[int, float]]] = {}
    for row in report["summary"]:
        lines.setdefault(row["implementation"], []).append((row["coroutines"], row["cycles_per_s"]))
    figure = Figure(figsize=(8, 5), dpi=120)
    axes = figure.subplots()
    for (name, points), marker in zip(lines.items(), "osD^v", strict=False):
        points.sort()
        axes.plot([x for x, _ in points], [y for _, y in points], marker=marker, label=name)
    axes.axhline(
        report["ceiling"]["cycles_per_s_ceiling"],
        linestyle="--",
        color="grey",
        label="Redis ceiling (redis-benchmark EVALSHA, halved)",
    )
    levels = sorted({row["coroutines"] for row in report["summary"]})
    axes.set_xscale("log", base=2)
    axes.set_xticks(levels, [str(level) for level in levels])
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:,.0f}"))
    axes.set_ylim(bottom=0)
    axes.set_xlabel("concurrent coroutines (one user id each)")
    axes.set_ylabel("acquire + release cycles per second")
    machine = report["machine"]
    axes.set_title(
        f"Acquire+release against one Redis {machine['redis_server']},"
        f" {machine['nproc']} cores, CPython {machine['python']}",
        fontsize=10,
    )
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output)


def plot_rates(report: dict[str, Any], output: Path) -> None:
    figure = Figure(figsize=(11, 5), dpi=120)
    panels = figure.subplots(1, 2, sharey=True)
    levels = sorted({row["coroutines"] for row in report["summary"]})
    for axes, policies in zip(panels, (2, 1), strict=True):
        lines: dict[str, list[tuple[int, float]]] = {}
        for row in report["summary"]:
            if row["policies"] == policies:
                lines.setdefault(row["name"], []).append((row["coroutines"], row["hits_per_s"]))
        for (name, points), marker in zip(lines.items(), "osD^v<>px", strict=False):
            points.sort()
            axes.plot([x for x, _ in points], [y for _, y in points], marker=marker, label=name)
        axes.axhline(
            report["ceiling"]["hits_per_s"],
            linestyle="--",
            color="grey",
            label="Redis ceiling (redis-benchmark, floor script)",
        )
        axes.set_xscale("log", base=2)
        axes.set_xticks(levels, [str(level) for level in levels])
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:,.0f}"))
        axes.set_ylim(bottom=0)
        axes.set_xlabel("concurrent coroutines (16 identities)")
        axes.set_title(
            "two policies per hit" if policies == 2 else "one policy per hit", fontsize=10
        )
        axes.grid(True, which="major", alpha=0.3)
        axes.legend(fontsize=7)
    panels[0].set_ylabel("rate-limit hits per second")
    machine = report["machine"]
    figure.suptitle(
        f"Rate-limit hits against one Redis {machine['redis_server']},"
        f" {machine['nproc']} cores, CPython {machine['python']}",
        fontsize=10,
    )
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output)


def main() -> None:
    parser = argparse.ArgumentParser(description="Plot the benchmarks against concurrency.")
    parser.add_argument("--figure", choices=sorted(FIGURES), default="cycles")
    parser.add_argument("--input", type=Path, help="the benchmark's JSON (default: by figure)")
    parser.add_argument("--output", type=Path, help="PNG to write (default: by figure)")
    args = parser.parse_args()
    default_input, default_output = FIGURES[args.figure]
    source, output = args.input or default_input, args.output or default_output
    draw = plot if args.figure == "cycles" else plot_rates
    draw(json.loads(source.read_text(encoding="utf-8")), output)
    print(f"plot: {output}")


if __name__ == "__main__":
    main()
