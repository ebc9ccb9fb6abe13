"""The randomized fault run (`make chaos`): worker processes open and close streams on
a real Redis (or the 3-master cluster) while a seeded schedule breaks Redis, the network and the
workers; an auditor outside the library checks the caps, the counts and the leftovers from the
streams' own start and end events and from samples of Redis.

Run it with ``python -m tests.chaos --seed 1 --minutes 2`` from the repository root (``--help``
lists the options); ``tests/test_chaos.py`` runs a short fixed-seed version.
"""
