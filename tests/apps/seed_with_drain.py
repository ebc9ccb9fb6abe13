"""The seed quickstart (the test's copy of examples/seed_quickstart.py, as written, found on
PYTHONPATH as ``seed_app``) plus the operator's route a deploy calls to drain the worker."""

from seed_app import app, lease_manager


@app.post("/admin/drain")
async def drain() -> None:
    await lease_manager.drain(timeout=0)
