"""The operator CLI, ``python -m fastapi_stream_lease``, against real servers: what it shows,
that no raw identity or password appears, and clear exits for the wrong server, prefix or
identity secret."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
from urllib.parse import quote

import pytest

from fastapi_stream_lease import LeaseConfig, RateLimit, StreamLeaseManager, UserBanned

from support.redis_servers import RedisServer, SentinelSetup
from support.waiting import eventually

SECRET = "cli-test-secret-16b"
USER = "raw-user-id-4f2a"


async def cli(url: str | None, *args: str, env: dict[str, str] | None = None):
    """Runs the CLI (``url``: its ``--url``, or None to leave it to the environment)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fastapi_stream_lease",
        *(["--url", url] if url is not None else []),
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode, out.decode(), err.decode()


async def holding(url: str, key_prefix: str, **config: float) -> tuple[StreamLeaseManager, object]:
    manager = StreamLeaseManager(
        url=url, config=LeaseConfig(key_prefix=key_prefix, identity_secret=SECRET, **config)
    )
    lease = await manager.acquire(
        USER,
        rate_limits=[RateLimit("per_minute", 5, per=60)],
        budgets=[
            RateLimit("tpm", 1_000, per=60, unit="tokens"),
            RateLimit("tpd", 10_000, per=86_400, algorithm="fixed_window", unit="tokens"),
        ],
        reserve=100,
    )
    return manager, lease


async def test_inspect_shows_pools_holders_and_counters_without_identities(
    redis_server, key_prefix
):
    manager, lease = await holding(redis_server.url, key_prefix)
    code, out, err = await cli(redis_server.url, "--key-prefix", key_prefix, "inspect", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert {p["pool"]: p["used"] for p in report["pools"]} == {"global": 1, "per_user": 1}
    assert len(report["holders"]) == 1 and report["holders"][0]["expires_in_s"] > 0
    # a fixed window's counter keeps its window's end beside its units: only the units count
    assert {c["policy"]: c["used"] for c in report["counters"]} == {
        "per_minute": 1,
        "tpm": 100,
        "tpd": 100,
    }
    digest = manager._core.identity_digest(USER)
    assert {c["identity_hash"] for c in report["counters"]} == {digest}
    code, text, _ = await cli(redis_server.url, "--key-prefix", key_prefix, "inspect")
    assert code == 0 and "per_user" in text and "tpm" in text
    assert USER not in out + text
    env = {**os.environ, "STREAM_LEASE_IDENTITY_SECRET": SECRET}
    code, out, err = await cli(
        redis_server.url, "--key-prefix", key_prefix, "reset", USER, "per_minute", env=env
    )
    assert code == 0 and digest in out and USER not in out, err
    assert (await manager.peek(USER, RateLimit("per_minute", 5, per=60))).used == 0
    await lease.release()
    await manager.aclose()


async def test_revoke_ends_the_users_streams_and_bans_them(redis_server, key_prefix):
    # The CLI's revoke reaches the manager's lease within one renewal period.
    manager, lease = await holding(redis_server.url, key_prefix, renew_every=0.5)
    code, out, err = await cli(
        redis_server.url,
        "--key-prefix",
        key_prefix,
        "revoke",
        USER,
        "--ban",
        "60",
        "--identity-secret",
        SECRET,
    )
    digest = manager._core.identity_digest(USER)
    assert code == 0, err
    assert out.strip() == f"revoked 1 stream(s) of identity {digest}, new ones refused for 60 s"

    async def ended() -> bool:
        return lease.revoked

    await eventually(ended, what="the lease to be revoked")
    with pytest.raises(UserBanned):
        await manager.acquire(USER)
    code, out, err = await cli(redis_server.url, "--key-prefix", key_prefix, "inspect", "--json")
    [ban] = json.loads(out)["bans"]
    assert ban["identity_hash"] == digest and 0 < ban["expires_in_s"] <= 60
    code, text, _ = await cli(redis_server.url, "--key-prefix", key_prefix, "inspect")
    assert f"identity {digest}  for" in text
    assert USER not in out + text
    code, _, err = await cli(redis_server.url, "revoke", USER, "--ban", "-5")
    assert code == 2 and "--ban -5.0 is out of range" in err
    await manager.aclose()


async def test_inspect_on_a_cluster(redis_cluster, key_prefix):
    manager, lease = await holding(redis_cluster.url, key_prefix)
    code, out, err = await cli(redis_cluster.url, "--key-prefix", key_prefix, "inspect", "--json")
    assert code == 0, err
    assert {p["pool"] for p in json.loads(out)["pools"]} == {"global", "per_user"}
    code, out, err = await cli(
        redis_cluster.url, "--key-prefix", key_prefix, "revoke", USER, "--identity-secret", SECRET
    )
    assert code == 0 and out.startswith("revoked 1 stream(s)"), err
    await lease.release()
    await manager.aclose()


async def test_the_wrong_server_or_prefix_gets_a_message_and_an_exit_code(redis_server):
    code, _, err = await cli(redis_server.url, "--key-prefix", "no-such-prefix", "inspect")
    assert code == 4 and "no keys with the prefix 'no-such-prefix'" in err
    code, _, err = await cli("redis://127.0.0.1:1/0", "inspect")
    assert code == 3 and "cannot reach Redis" in err and "Traceback" not in err
    code, _, err = await cli("redis://:wrong@" + redis_server.url.split("://")[1], "inspect")
    assert code in (0, 3, 4) and "Traceback" not in err
    code, _, err = await cli("memcache://localhost", "inspect")
    assert code == 2 and "unsupported URL scheme" in err
    code, _, err = await cli("redis://127.0.0.1:1/0", "revoke", USER)
    assert code == 3 and "cannot revoke" in err and "Traceback" not in err
    assert USER not in err


async def test_revoke_without_the_apps_secret_says_it_found_no_such_identity(
    redis_server, key_prefix
):
    """Without the app's secret the CLI hashed the id to another identity, printed "revoked 0"
    and exited 0 while the user's streams went on."""
    manager, lease = await holding(redis_server.url, key_prefix)
    env = {k: v for k, v in os.environ.items() if k != "STREAM_LEASE_IDENTITY_SECRET"}
    code, out, err = await cli(
        redis_server.url, "--key-prefix", key_prefix, "revoke", USER, env=env
    )
    assert code == 4 and out == "", err
    assert "no live stream of identity" in err and "nothing revoked" in err
    assert "No identity secret was given" in err and "--identity-secret" in err
    code, out, err = await cli(
        redis_server.url,
        "--key-prefix",
        key_prefix,
        "revoke",
        USER,
        "--ban",
        "60",
        "--identity-secret",
        "another-secret-of-16-bytes",
        env=env,
    )
    assert code == 4 and "the ban is set for that identity" in err
    assert "is the app's identity_secret" in err
    code, out, err = await cli(
        redis_server.url, "--key-prefix", key_prefix, "reset", USER, "per_minute", env=env
    )
    assert code == 4 and "nothing reset" in err and "No identity secret was given" in err
    assert not lease.revoked and USER not in err
    await manager.acquire(USER)  # neither call touched the user's identity
    await manager.aclose()


async def test_watch_hides_the_redis_password(key_prefix):
    """``inspect --watch`` printed the URL, password included, at every refresh."""
    server = RedisServer("--requirepass", "hunter2-secret").start()
    try:
        url = f"redis://:hunter2-secret@127.0.0.1:{server.port}/0"
        manager, lease = await holding(url, key_prefix)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "fastapi_stream_lease",
            "--url",
            url,
            "--key-prefix",
            key_prefix,
            "inspect",
            "--watch",
            "0.2",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdout is not None
        screens = b""
        while screens.count(b"rate and budget counters") < 2:
            screens += await asyncio.wait_for(process.stdout.read(4096), 60)
        process.terminate()
        await process.wait()
        assert f"redis://:***@127.0.0.1:{server.port}/0".encode() in screens
        assert b"hunter2" not in screens
        await lease.release()
        await manager.aclose()
    finally:
        server.cleanup()


def test_version_is_the_packages_one():
    from importlib.metadata import version

    import fastapi_stream_lease

    shown = subprocess.run(
        [sys.executable, "-m", "fastapi_stream_lease", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert shown == f"fastapi-stream-lease {fastapi_stream_lease.__version__}"
    # One number in one place: Cargo.toml's, which maturin gives the distribution.
    assert fastapi_stream_lease.__version__ == version("fastapi-stream-lease")


async def test_url_and_key_prefix_may_follow_the_command(redis_server, key_prefix):
    """``inspect --url ...`` was refused: the options were the top-level parser's only. Given
    both places, the one after the command wins."""
    manager, lease = await holding(redis_server.url, key_prefix)
    code, out, err = await cli(
        "redis://127.0.0.1:1/0", "inspect", "--url", redis_server.url, "--key-prefix", key_prefix,
        "--json",
    )  # fmt: skip
    assert code == 0, err
    assert {p["pool"]: p["used"] for p in json.loads(out)["pools"]} == {"global": 1, "per_user": 1}
    await lease.release()
    await manager.aclose()


def test_the_version_sorts_above_the_0_6_line_as_a_1_0_pre_release():
    """This package succeeds the pure-Python 0.6 line under the same name: a version below
    0.6.3 made ``pip install --find-links dist/ fastapi-stream-lease`` pick 0.6.3 from the
    index instead of the local wheel."""
    from packaging.version import Version

    import fastapi_stream_lease

    version = Version(fastapi_stream_lease.__version__)
    assert version > Version("0.6.3")
    assert version.is_prerelease and version.release[0] == 1


def test_changelog_has_the_version():
    from pathlib import Path

    import fastapi_stream_lease

    changelog = (Path(__file__).resolve().parent.parent / "CHANGELOG.md").read_text()
    assert f"\n## {fastapi_stream_lease.__version__} " in changelog


@pytest.mark.parametrize(
    ("secret", "complaint"),
    [("short", "is 5 bytes long"), ("\udcff-not-utf-8-but-long-enough", "is not valid UTF-8")],
    ids=["short", "not-utf-8"],
)
async def test_a_bad_secret_in_the_environment_breaks_only_the_commands_that_hash(
    secret, complaint
):
    """Building the parser read ``STREAM_LEASE_IDENTITY_SECRET`` (for the default key prefix),
    so a bad value raised a traceback for every command, ``--help`` included."""
    env = {**os.environ, "STREAM_LEASE_IDENTITY_SECRET": secret}
    code, out, err = await cli("redis://127.0.0.1:1/0", "--help", env=env)
    assert code == 0 and "revoke" in out, err
    code, _, err = await cli("redis://127.0.0.1:1/0", "inspect", env=env)
    assert code == 3 and "cannot reach Redis" in err and "Traceback" not in err
    for command in (("revoke", USER), ("reset", USER, "per_minute")):
        code, _, err = await cli("redis://127.0.0.1:1/0", *command, env=env)
        assert code == 2 and "Traceback" not in err, err
        assert complaint in err and "STREAM_LEASE_IDENTITY_SECRET" in err


def test_the_default_key_prefix_is_the_configs():
    from fastapi_stream_lease.cli import DEFAULT_KEY_PREFIX

    assert DEFAULT_KEY_PREFIX == LeaseConfig(identity_secret=SECRET).key_prefix


async def test_the_url_comes_from_the_environment_as_the_apps_does(redis_server, key_prefix):
    """The CLI read only ``$REDIS_URL`` while the app read no variable: both read
    ``$STREAM_LEASE_URL``, else ``$REDIS_URL``."""
    manager, lease = await holding(redis_server.url, key_prefix)
    unset = {k: v for k, v in os.environ.items() if k not in ("STREAM_LEASE_URL", "REDIS_URL")}
    for variables in (
        {"STREAM_LEASE_URL": redis_server.url},
        {"REDIS_URL": redis_server.url},
        {"STREAM_LEASE_URL": redis_server.url, "REDIS_URL": "redis://127.0.0.1:1/0"},
    ):
        code, out, err = await cli(
            None, "inspect", "--key-prefix", key_prefix, "--json", env={**unset, **variables}
        )
        assert code == 0, (variables, err)
        assert {p["pool"]: p["used"] for p in json.loads(out)["pools"]}["global"] == 1
    await lease.release()
    await manager.aclose()


async def test_inspect_behind_sentinel_with_the_apps_url(tmp_path, key_prefix):
    """The CLI refused ``redis+sentinel://`` URLs that the app takes; the master's password and
    the sentinels' own are read from the URL as the app reads them."""
    password, sentinel_password = "master-pw", "s3nt/n@l:pw"
    setup = SentinelSetup(tmp_path, password=password, sentinel_password=sentinel_password).start()
    try:
        url = (setup.url.replace("://", f"://:{password}@")
               + f"?sentinel_password={quote(sentinel_password, safe='')}")  # fmt: skip
        manager, lease = await holding(url, key_prefix)
        code, out, err = await cli(url, "--key-prefix", key_prefix, "inspect", "--json")
        assert code == 0, err
        assert {p["pool"]: p["used"] for p in json.loads(out)["pools"]}["global"] == 1
        code, _, err = await cli(url.split("?")[0], "--key-prefix", key_prefix, "inspect")
        assert code == 3 and "Traceback" not in err and password not in err
        for unreadable in ("redis+sentinel://127.0.0.1:1", "redis+sentinel://127.0.0.1:1/m/x"):
            code, _, err = await cli(unreadable, "inspect")
            assert code == 2 and "master_name" in err and "Traceback" not in err
        await lease.release()
        await manager.aclose()
    finally:
        setup.cleanup()


def test_help_is_plain_text_and_every_option_says_what_it_is():
    """The help showed the docstring's raw backticks, and ``--identity-secret`` had no text."""
    for command in ([], ["inspect"], ["revoke"], ["reset"]):
        done = subprocess.run(
            [sys.executable, "-m", "fastapi_stream_lease", *command, "--help"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0 and "`" not in done.stdout, done.stdout
        lines = [*done.stdout.split("options:", 1)[1].splitlines(), ""]
        for line, after in itertools.pairwise(lines):
            # An option alone on its line has its help on the next, indented further.
            if re.fullmatch(r"  (-\w, )?--[\w-]+( [A-Z_]+)?", line):
                assert after.startswith(" " * 6), f"{line.strip()} has no help"
    assert "STREAM_LEASE_IDENTITY_SECRET" in subprocess.run(
        [sys.executable, "-m", "fastapi_stream_lease", "revoke", "--help"],
        capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
