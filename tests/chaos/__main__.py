"""``python -m tests.chaos --seeds 1 2 3 --minutes 10``: the chaos runs of ``make chaos``.

The minutes are shared out among the seeds; each seed runs on one Redis, then (a quarter of its
time by default) on the 3-master cluster. Exits 1 if any run found a violation.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The chaos package and tests/support are imported as top-level packages, as pytest does.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chaos.main import main

sys.exit(main(sys.argv[1:]))
