"""The package as users get it: a wheel installed into a fresh virtualenv, with no
Rust toolchain on PATH, serves the README's quickstart under uvicorn against a real server.

The wheel here is built from ``make build``'s compiled core (``maturin build --profile dev``
reuses it, so the test costs seconds); ``make wheel`` builds the release one, for manylinux,
with the same packaging."""

from __future__ import annotations

import fcntl
import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import httpx
import pytest
import tomllib

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
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout


def classified_pythons() -> list[str]:
    """The Python versions the package's classifiers name ("3.10", ...)."""
    classifiers = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["classifiers"]
    return [c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r".*Python :: 3\.\d+", c)]


def interpreter(version: str) -> Path | None:
    """A CPython ``version`` on this machine: this one, ``python3.X`` on PATH, or pyenv's."""
    if version == f"{sys.version_info.major}.{sys.version_info.minor}":
        return Path(sys.executable)
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(
        glob.glob(str(Path.home() / f".pyenv/versions/{version}.*/bin/python{version}"))
    )
    for candidate in filter(None, candidates):
        works = subprocess.run([candidate, "-c", "pass"], capture_output=True, timeout=60)
        if works.returncode == 0:
            return Path(candidate)
    return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once for the session: xdist's workers share their base directory's
    parent, and build under a lock there (two maturin builds at once in one target directory
    fail)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    out = shared / "wheel"
    out.mkdir(exist_ok=True)
    with open(out / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not list(out.glob("*.whl")):
            run(Path(sys.executable).parent / "maturin", "build", "--profile", "dev", "--quiet",
                "--interpreter", sys.executable, "--out", out, cwd=ROOT)  # fmt: skip
    (built,) = out.glob("fastapi_stream_lease-*-abi3-*.whl")
    return built


@pytest.mark.parametrize("version", classified_pythons())
def test_the_wheel_installs_without_rust_and_serves_the_quickstart(
    redis_server, tmp_path, wheel, version
):
    """On each Python the classifiers name: the one abi3 wheel, with the ``[fastapi]`` extra."""
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no CPython {version} on this machine (python{version}, pyenv)")
    venv = tmp_path / "venv"
    run(python, "-m", "venv", venv)
    env = {"PATH": f"{venv / 'bin'}:{SYSTEM_PATH}", "HOME": os.environ.get("HOME", "/root")}
    for tool in ("cargo", "rustc", "maturin"):
        assert shutil.which(tool, path=env["PATH"]) is None, f"{tool} is on the test's PATH"
    # The README's install line. On the tests' own Python, the extra's FastAPI and uvicorn at
    # the versions the rest of the tests run; on another, what a user there gets (FastAPI's
    # newest releases need 3.11). The quickstart talks to Redis through the core alone.
    pins = []
    if python == Path(sys.executable):
        constraints = tmp_path / "constraints.txt"
        constraints.write_text(f"{PINNED['fastapi']}\n{PINNED['uvicorn']}\n")
        pins = ["-c", constraints]
    run(venv / "bin" / "pip", "install", "--quiet", f"{wheel}[fastapi]", *pins, env=env)
    installed = run(
        venv / "bin" / "python",
        "-c",
        "import fastapi_stream_lease as m; print(m.__file__, m.__version__)",
        cwd=tmp_path,
        env=env,
    )
    assert installed.startswith(str(venv)), installed  # the wheel's copy, not the source tree

    (tmp_path / "quickstart.py").write_text(quickstart(redis_server.url))
    server = Uvicorn("quickstart:app", tmp_path, env, python=venv / "bin" / "python")
    try:
        response = httpx.get(server.base_url + "/api/chat/stream", timeout=30)
        assert response.status_code == 200
        assert 'data: "streamed!"' in response.text  # native SSE sends each item as JSON
    finally:
        server.stop()


def test_the_wheels_description_is_the_package_description(wheel):
    """What an index shows: the package description (no relative link or image, the docs'
    test says), as Markdown."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(name).decode("utf-8")
    headers, description = metadata.split("\n\n", 1)
    kinds = [h for h in headers.splitlines() if h.startswith("Description-Content-Type:")]
    assert kinds and "text/markdown" in kinds[0], kinds
    assert description.strip() == (ROOT / "package-description.md").read_text().strip()


def test_the_sdist_holds_the_documentation_the_description_names(tmp_path):
    """The description sends its reader to ``README.md``, ``docs/`` and ``CHANGELOG.md`` in
    the source distribution: they are there, every page of the site among them."""
    run(Path(sys.executable).parent / "maturin", "sdist", "--out", tmp_path, cwd=ROOT)
    (sdist,) = tmp_path.glob("fastapi_stream_lease-*.tar.gz")
    with tarfile.open(sdist) as archive:
        held = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    description = (ROOT / "package-description.md").read_text()
    for named in ("README.md", "docs/", "CHANGELOG.md"):
        assert f"`{named}`" in description
    pages = {str(page.relative_to(ROOT)) for page in (ROOT / "docs").rglob("*.md")}
    assert {"README.md", "CHANGELOG.md"} | pages <= held
