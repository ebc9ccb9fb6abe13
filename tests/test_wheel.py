"""The package as users get it: a wheel installed into a fresh virtualenv, with no
Rust toolchain on PATH, serves the README's quickstart under uvicorn against a real server.

The wheel here is built from ``make build``'s compiled core (``maturin build --profile dev``
reuses it, so the test costs seconds); ``make wheel`` builds the release one, for manylinux,
with the same packaging."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from support.apps import quickstart
from support.uvicorn_server import Uvicorn

ROOT = Path(__file__).resolve().parent.parent
# What a user's app needs besides this package (the README's FastAPI and uvicorn, redis-py for
# the quickstart's client), at the versions the rest of the tests run.
PINNED = {
    line.split("==")[0]: line.strip()
    for line in (ROOT / "requirements-dev.txt").read_text().splitlines()
    if "==" in line and not line.startswith("#")
}
# A PATH with the system's tools only: no cargo, rustc or maturin.
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def run(*command: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    return subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, check=True, capture_output=True,
        text=True, timeout=600,
    ).stdout


def test_the_wheel_installs_without_rust_and_serves_the_quickstart(redis_server, tmp_path):
    run(Path(sys.executable).parent / "maturin", "build", "--profile", "dev", "--quiet",
        "--interpreter", sys.executable, "--out", tmp_path / "dist", cwd=ROOT)
    (wheel,) = (tmp_path / "dist").glob("fastapi_stream_lease-*-abi3-*.whl")

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    env = {"PATH": f"{venv / 'bin'}:{SYSTEM_PATH}", "HOME": os.environ.get("HOME", "/root")}
    for tool in ("cargo", "rustc", "maturin"):
        assert shutil.which(tool, path=env["PATH"]) is None, f"{tool} is on the test's PATH"
    # The quickstart talks to Redis through the core alone: no redis-py.
    run(venv / "bin" / "pip", "install", "--quiet", wheel, PINNED["fastapi"], PINNED["uvicorn"],
        env=env)
    installed = run(venv / "bin" / "python", "-c",
                    "import fastapi_stream_lease as m; print(m.__file__, m.__version__)",
                    cwd=tmp_path, env=env)
    assert installed.startswith(str(venv)), installed  # the wheel's copy, not the source tree

    (tmp_path / "quickstart.py").write_text(quickstart(redis_server.url))
    server = Uvicorn("quickstart:app", tmp_path, env, python=venv / "bin" / "python")
    try:
        response = httpx.get(server.base_url + "/api/chat/stream", timeout=30)
        assert response.status_code == 200
        assert 'data: "streamed!"' in response.text  # native SSE sends each item as JSON
    finally:
        server.stop()
