"""0.6.3's own test suite, run against this package: the sdist of PyPI's
``fastapi-stream-lease==0.6.3`` is fetched at test time (never copied here), and its tests of
the lease's life, of FastAPI and of a real Redis run on a Redis server of their own, with the
fixtures of ``support/conftest_0_6.py`` in place of the suite's (which imitates Redis in
memory). Every test passes, or docs/recipes/migrating.md lists it under "0.6.3's own tests"
with the reason; a listed test that passes is an error too, so the list stays true."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from support.published import sdist_of
from support.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
MIGRATING = ROOT / "docs" / "recipes" / "migrating.md"
SUITE = ("test_real_redis.py", "test_fastapi_integration.py", "test_lease_lifecycle.py")
#: How the list's reason for the tests that read 0.6's private names begins.
PRIVATE = "imports or reads a private name of 0.6"
#: Seconds one of the suite's tests may take before it counts as failed (hung).
TEST_TIMEOUT = 20


def listed_failures() -> dict[str, str]:
    """The tests migrating.md says fail here, by name (``file::test``), with the reason."""
    text = MIGRATING.read_text()
    section = text.split("### 0.6.3's own tests", 1)[1].split("\n#", 1)[0]
    listed: dict[str, str] = {}
    for row in re.findall(r"^\| (.+?) \| (.+?) \|$", section, re.M):
        names, reason = row
        for name in re.findall(r"`(test_\w+\.py::test_\w+)`", names):
            listed[name] = reason
    return listed


def case_outcomes(report: Path, file: str) -> list[tuple[str, bool]]:
    """Each test case of ``file`` (a parametrization counts as one): its function's name
    (``file::test``) and whether it passed."""
    return [
        (
            f"{file}::{case.get('name', '').split('[')[0]}",
            all(case.find(kind) is None for kind in ("failure", "error", "skipped")),
        )
        for case in ElementTree.parse(report).getroot().iter("testcase")
    ]


def outcomes(cases: list[tuple[str, bool]]) -> dict[str, bool]:
    """Whether each test function passed (every parametrization of it)."""
    passed: dict[str, bool] = {}
    for name, ok in cases:
        passed[name] = passed.get(name, True) and ok
    return passed


def documented_figures() -> dict[str, tuple[int, ...]]:
    """migrating.md's figures per file: tests, passed, tests of 0.6.3's public API only, passed."""
    section = MIGRATING.read_text().split("### 0.6.3's own tests", 1)[1].split("\n#", 1)[0]
    rows = re.findall(
        r"^\| `(test_\w+\.py)` \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$", section, re.M
    )
    return {file: tuple(int(n) for n in numbers) for file, *numbers in rows}


def figures(cases: list[tuple[str, bool]], private: set[str]) -> tuple[int, int, int, int]:
    """Tests, passed, tests that use only 0.6.3's public API (not in the private-name row),
    passed among those."""
    public = [ok for name, ok in cases if name not in private]
    return len(cases), sum(ok for _, ok in cases), len(public), sum(public)


@pytest.mark.parametrize("file", SUITE)
def test_each_of_its_tests_passes_or_is_listed_with_its_reason(
    file: str, own_redis: RedisServer, tmp_path: Path
) -> None:
    sdist = sdist_of("fastapi-stream-lease", "0.6.3")
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(sdist / "tests" / file, tests / file)
    shutil.copy(ROOT / "tests" / "support" / "conftest_0_6.py", tests / "conftest.py")
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    report = tmp_path / "report.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-c", str(ini), "--rootdir", str(tmp_path), f"--timeout={TEST_TIMEOUT}",
         f"--junitxml={report}", str(tests / file)],
        cwd=tmp_path, env={**_environment(), "REDIS_URL": own_redis.url},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert report.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    cases = case_outcomes(report, file)
    results = outcomes(cases)
    private = {name for name, why in listed_failures().items() if why.startswith(PRIVATE)}
    counted = figures(cases, private)
    assert documented_figures().get(file) == counted, (
        f"{MIGRATING.name}'s figures for {file} are not this run's: "
        f"| `{file}` | {' | '.join(map(str, counted))} |"
    )
    listed = {name for name in listed_failures() if name.startswith(f"{file}::")}
    failed = {name for name, ok in results.items() if not ok}
    print(f"{file}: {len(results) - len(failed)} of {len(results)} tests pass")
    assert failed - listed == set(), (
        f"failing and not listed in {MIGRATING.name}:\n" + "\n".join(sorted(failed - listed))
        + "\n\n" + run.stdout[-6000:]
    )  # fmt: skip
    assert listed - failed == set(), (
        f"listed in {MIGRATING.name} as failing, but they pass (or are gone): "
        + ", ".join(sorted(listed - failed))
    )


def _environment() -> dict[str, str]:
    import os

    return {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}


def test_the_totals_are_the_sum_of_the_files_figures():
    """The page's sentence of totals says what its rows add up to."""
    tests, passed, public, public_passed = (
        sum(column) for column in zip(*documented_figures().values(), strict=True)
    )
    share = round(100 * public_passed / public)
    sentence = (f"{passed} of {tests} pass; of the {public} that use only 0.6.3's public API, "
                f"{public_passed} pass ({share} %)")  # fmt: skip
    assert sentence in " ".join(MIGRATING.read_text().split()).replace("**", "")
