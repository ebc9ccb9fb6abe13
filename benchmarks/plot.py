"""Draws acquire+release cycles per second against concurrency, from acquire_release.py's JSON.

One line per implementation (this project, the pure-Python peer, redis-py running this
project's scripts), the median cycles/s at each number of coroutines on a log-2 axis, and the
server's ceiling (redis-benchmark, halved) as a dashed line. It measures nothing itself: run
``acquire_release.py`` first (``bash benchmarks/run.sh`` does both), then::

    benchmarks/.venv/bin/python benchmarks/plot.py

It reads ``benchmarks/results/acquire_release.json`` and writes
``benchmarks/results/cycles_vs_concurrency.png`` (matplotlib, installed by setup_bench_env.sh).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from common import RESULTS_DIR

DEFAULT_INPUT = RESULTS_DIR / "acquire_release.json"
DEFAULT_OUTPUT = RESULTS_DIR / "cycles_vs_concurrency.png"


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


def main() -> None:
    parser = argparse.ArgumentParser(description="Plot cycles/s against concurrency.")
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT, help="acquire_release JSON")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="PNG to write")
    args = parser.parse_args()
    plot(json.loads(args.input.read_text(encoding="utf-8")), args.output)
    print(f"plot: {args.output}")


if __name__ == "__main__":
    main()
