"""Pre-forking servers (gunicorn --preload): a manager built before the fork works in each
child; one already used before the fork gives a clear error instead of hanging, and the child
never releases the parent's leases.

Regression: a script built lazily on a core's thread (the revocations' look for missed revokes,
right after the parent's first lease) while the process forked stayed "being built" in the
child, whose first call of that script then hung."""

from __future__ import annotations

import subprocess

from support.apps import app_command


def test_managers_across_fork(redis_server, key_prefix):
    done = subprocess.run(
        app_command("fork_after_use", redis_server.url, key_prefix),
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "child acquired 1" in done.stdout
    assert "used in process" in done.stdout and "before it forked" in done.stdout
    assert "parent holds 1" in done.stdout
