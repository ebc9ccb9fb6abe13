"""What the apps that tests run under uvicorn share: their store from the environment
(STREAM_LEASE_URL, STREAM_LEASE_PREFIX, STREAM_LEASE_SECRET) and the library's log on stderr at
INFO, each line after its level, for the test to read."""

import logging
import os
import sys

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager


def log_library_to_stderr() -> None:
    library_log = logging.getLogger("fastapi_stream_lease")
    library_log.setLevel(logging.INFO)
    to_stderr = logging.StreamHandler(sys.stderr)
    to_stderr.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    library_log.addHandler(to_stderr)


def manager_from_environment(max_per_user: int) -> StreamLeaseManager:
    """A manager on the test's store, 5 s leases renewed every 0.2 s."""
    config = LeaseConfig(
        key_prefix=os.environ["STREAM_LEASE_PREFIX"],
        identity_secret=os.environ["STREAM_LEASE_SECRET"],
        max_per_user=max_per_user,
        lease_seconds=5,
        renew_every=0.2,
    )
    return StreamLeaseManager(url=os.environ["STREAM_LEASE_URL"], config=config)
