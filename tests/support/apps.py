"""The child programs and apps under tests/apps/, which the tests run as processes of their own,
and the README's quickstart app."""

from __future__ import annotations

import re
import sys
from pathlib import Path

APPS_DIR = Path(__file__).resolve().parent.parent / "apps"
README = APPS_DIR.parent.parent / "README.md"


def quickstart(redis_url: str) -> str:
    """The README's quickstart (its first Python block: native SSE under a lease), pointed at
    ``redis_url``, as a module's source."""
    code = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    assert code.count("redis://localhost:6379") == 1
    return code.replace("redis://localhost:6379", redis_url)


def app_command(name: str, *args: str) -> list[str]:
    """The command that runs ``tests/apps/<name>.py`` with ``args`` under this interpreter."""
    return [sys.executable, str(APPS_DIR / f"{name}.py"), *args]
