"""The embedded store and the Lua scripts agree: a fixed-seed random sequence of acquires,
releases, waits, hits, reservations, top-ups, settlements, revokes and counts played on both
(tests/agreement/play.py) gets the same answers. ``make chaos`` plays random seeds for
minutes (``python -m tests.agreement``)."""

from __future__ import annotations

from agreement.play import Play

SEED = 20261206
STEPS = 400


async def test_both_stores_answer_a_random_sequence_alike(redis_server):
    play = Play(SEED, redis_server.url)
    try:
        await play.run(STEPS)
    finally:
        await play.close()
    assert play.counts.get("acquire", 0) > 0
