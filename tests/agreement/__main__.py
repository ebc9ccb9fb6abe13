"""``python -m tests.agreement --minutes 5 --seeds 1 2 3``: random sequences played on the
embedded store and on a Redis of its own (``make chaos`` runs it). Exits 1 at the first
disagreement, printing the step and both answers."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

# tests/support and this package are imported as top-level packages, as pytest does.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agreement.play import Disagreement, Play
from support.redis_servers import RedisServer

STEPS_PER_PLAY = 2_000


async def play_for(
    seconds: float, seed: int, url: str
) -> tuple[int, dict[str, int], dict[str, int]]:
    """Plays sequences of ``STEPS_PER_PLAY`` steps, each from its own seed drawn from ``seed``,
    until ``seconds`` pass; the plays, the operations counted and the answers by kind."""
    deadline = time.monotonic() + seconds
    plays, counts, answers = 0, {}, {}
    while time.monotonic() < deadline:
        play = Play(seed * 1_000_003 + plays, url)
        try:
            await play.run(STEPS_PER_PLAY)
        finally:
            await play.close()
        plays += 1
        for name, count in play.counts.items():
            counts[name] = counts.get(name, 0) + count
        for kind, count in play.answers.items():
            answers[kind] = answers.get(kind, 0) + count
    return plays, counts, answers


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.agreement", description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--minutes", type=float, default=3.0,
                        help="minutes in all, shared out among the seeds (default 3)")
    args = parser.parse_args(argv)
    # The library's warnings about the usage the plays report at random are expected here.
    logging.getLogger("fastapi_stream_lease").setLevel(logging.ERROR)
    server = RedisServer().start()
    try:
        for seed in args.seeds:
            seconds = args.minutes * 60 / len(args.seeds)
            try:
                plays, counts, answers = asyncio.run(play_for(seconds, seed, server.url))
            except Disagreement as disagreement:
                print(f"== seed {seed}: {disagreement}", flush=True)
                return 1
            steps = sum(counts.values())
            print(f"== seed {seed}: {plays} plays, {steps} operations, all answered alike: "
                  f"{dict(sorted(counts.items()))}", flush=True)
            for kind, count in sorted(answers.items()):
                print(f"  {count:7d}  {kind}", flush=True)
    finally:
        server.cleanup()
    return 0


sys.exit(main(sys.argv[1:]))
