"""A real uvicorn server in a subprocess, on a free loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from .ports import free_port
from .waiting import wait_until


class Uvicorn:
    """``uvicorn <app> --app-dir <app_dir>``, started and answering once built."""

    def __init__(
        self, app: str, app_dir: Path, env: dict[str, str] | None = None, *extra_args: str,
        python: str | Path = sys.executable, log: Path | None = None, loop: str = "asyncio",
    ) -> None:
        """``log``: a file that takes the server's stderr (its log), else the tests' own.
        ``loop``: uvicorn's ``--loop``, asyncio's default loop unless a test asks for
        ``"uvloop"`` (which ``--loop auto`` would pick wherever it is installed)."""
        self.port = free_port()
        self._log = open(log, "wb") if log is not None else None
        self.process = subprocess.Popen(
            [str(python), "-m", "uvicorn", app, "--app-dir", str(app_dir),
             "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning",
             "--loop", loop, *extra_args],
            env={**os.environ, **(env or {})},
            stderr=self._log,
        )
        wait_until(self._up, timeout=60, what="uvicorn to accept connections")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _up(self) -> bool:
        assert self.process.poll() is None, "uvicorn exited"
        try:
            httpx.get(self.base_url + "/openapi.json", timeout=1)
            return True
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self._log is not None:
            self._log.close()
