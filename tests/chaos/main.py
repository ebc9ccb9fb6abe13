"""The command line of the chaos runs (see ``__main__``)."""

from __future__ import annotations

import argparse
import asyncio
import time

from chaos.report import overall, summary
from chaos.run import ChaosRun
from chaos.settings import Settings


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3],
                        help="one run per seed (default: 1 2 3)")
    parser.add_argument("--seed", type=int, help="a single seed (same as --seeds N)")
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="minutes in all, shared out among the seeds (default 10)")
    parser.add_argument("--cluster-share", type=float, default=0.25,
                        help="the share of each seed's time run on the cluster (default 0.25; "
                             "0: none, 1: the cluster only)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--lease-global-slots", action="store_true",
                        help="the workers take the global pool's slots in slabs "
                             "(LeaseConfig(lease_global_slots=True))")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    seeds = [args.seed] if args.seed is not None else args.seeds
    per_seed = args.minutes * 60 / len(seeds)
    results = []
    began = time.monotonic()
    for seed in seeds:
        for cluster, share in ((False, 1 - args.cluster_share), (True, args.cluster_share)):
            seconds = per_seed * share
            if seconds < 20:
                continue
            target = "cluster" if cluster else "redis"
            print(f"== seed {seed} on {target}: {seconds:.0f} s", flush=True)
            settings = Settings(key_prefix=f"chaos{seed}",
                                lease_global_slots=args.lease_global_slots)
            run = ChaosRun(seed, seconds, cluster=cluster, workers=args.workers,
                           settings=settings, say=lambda line: print(line, flush=True))
            audit = asyncio.run(run.run())
            for line in summary(audit, seed, target, seconds, args.workers):
                print(line, flush=True)
            results.append((seed, target, seconds, audit))
    print(f"== all runs: {(time.monotonic() - began) / 60:.1f} minutes", flush=True)
    for line in overall(results):
        print(line, flush=True)
    for seed, target, seconds, audit in results:
        print(f"  seed {seed} {target:8s} {seconds:5.0f} s: {len(audit.faults)} faults, "
              f"{audit.outcomes['started']} streams, {len(audit.violations)} violations",
              flush=True)
    return 1 if any(audit.violations for *_, audit in results) else 0
