"""``python -m fastapi_stream_lease``: the operator CLI (:mod:`fastapi_stream_lease.cli`)."""

import sys

from .cli import main

sys.exit(main())
