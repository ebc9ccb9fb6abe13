"""The child programs and apps under tests/apps/, which the tests run as processes of their own."""

from __future__ import annotations

import sys
from pathlib import Path

APPS_DIR = Path(__file__).resolve().parent.parent / "apps"


def app_command(name: str, *args: str) -> list[str]:
    """The command that runs ``tests/apps/<name>.py`` with ``args`` under this interpreter."""
    return [sys.executable, str(APPS_DIR / f"{name}.py"), *args]
