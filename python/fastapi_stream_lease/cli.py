"""python -m fastapi_stream_lease: an operator's view of one deployment's keys in Redis.

inspect lists the pools and their use, the holders (one per worker's manager and hash tag) and
when they expire, the waiters in line, and the rate and budget counters, with identities only as
the keyed hashes the keys carry, and the users whose streams are banned. revoke USER [--ban
SECONDS] ends every live stream of one user on every worker and refuses the user's new ones for
the ban; reset USER POLICY forgets one user's counters of one policy. Both hash the user id with
the deployment's secret, from --identity-secret or STREAM_LEASE_IDENTITY_SECRET. The commands
talk to Redis through redis-py (pip install redis).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

from ._core import LeaseConfig, Manager, __version__, redact_url, sentinel_url
from ._environment import (
    FALLBACK_URL_VARIABLE,
    SECRET_VARIABLE,
    URL_VARIABLE,
    backend_url_from_environment,
)
from .errors import BackendError

EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOTHING = 2, 3, 4
#: The Redis the commands look at when neither --url nor the environment names one.
DEFAULT_URL = "redis://localhost:6379/0"

#: ``LeaseConfig().key_prefix``, named here: building a ``LeaseConfig`` reads
#: ``STREAM_LEASE_IDENTITY_SECRET``, whose faults only the commands that hash ids report.
DEFAULT_KEY_PREFIX = "stream_lease"
#: The end of a rate counter's key of threshold alerts told (``lua/prelude/rates.lua``).
TOLD = ":told"


class CliError(Exception):
    """A message for the operator and the exit code that goes with it."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def url_from_environment() -> str:
    """The URL the app's manager reads from the environment, else :data:`DEFAULT_URL`."""
    found = backend_url_from_environment()
    return found[0] if found else DEFAULT_URL


def connect(url: str) -> Any:
    try:
        import redis
        from redis.cluster import ClusterNode, RedisCluster
    except ImportError:
        raise CliError(
            "the CLI talks to Redis through redis-py: pip install redis",
            EXIT_USAGE,
        ) from None
    if url.startswith(("redis+cluster://", "rediss+cluster://")):
        scheme, rest = url.split("://", 1)
        nodes = [node.rsplit(":", 1) for node in rest.split("/", 1)[0].split(",")]
        client: Any = RedisCluster(
            startup_nodes=[ClusterNode(host, int(port)) for host, port in nodes],  # type: ignore[no-untyped-call]
            ssl=scheme.startswith("rediss"),
            decode_responses=True,
        )
    elif url.startswith("redis+sentinel://"):
        client = sentinel_master(url)
    elif url.startswith(("redis://", "rediss://", "unix://")):
        client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
    else:
        raise CliError(
            f"unsupported URL scheme in {url.split('://', 1)[0]!r}: use redis://, rediss://, "
            "unix://, redis+cluster://host:port,host:port or "
            "redis+sentinel://host:port,host:port/master_name",
            EXIT_USAGE,
        )
    try:
        client.ping()
    except redis.AuthenticationError as error:
        raise CliError(f"Redis refused the credentials: {error}", EXIT_UNREACHABLE) from None
    except redis.RedisError as error:
        raise CliError(f"cannot reach Redis: {error}", EXIT_UNREACHABLE) from None
    return client


def sentinel_master(url: str) -> Any:
    """A redis-py client of the master that the sentinels of a ``redis+sentinel://`` URL name,
    the URL read by the core as the app's manager reads it."""
    from redis.sentinel import Sentinel

    try:
        sentinels, master, db, user, password, sentinel_user, sentinel_password = sentinel_url(url)
    except ValueError as error:
        raise CliError(str(error), EXIT_USAGE) from None
    sentinel_auth = {"username": sentinel_user, "password": sentinel_password}
    client = Sentinel(  # type: ignore[no-untyped-call]
        sentinels, sentinel_kwargs=sentinel_auth, socket_timeout=5
    )
    return client.master_for(  # type: ignore[no-untyped-call]
        master, db=db, username=user, password=password, decode_responses=True
    )


def snapshot(client: Any, prefix: str) -> dict[str, Any]:
    """Everything under the prefix, as the keys tell it (capacities live in the app's config)."""
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    report: dict[str, Any] = {
        "pools": [],
        "holders": [],
        "waiting": 0,
        "counters": [],
        "bans": [],
    }
    bans: dict[str, float] = {}
    for key in sorted(keys_of(client, prefix)):
        kind = client.type(key)
        tail = key.split("}", 1)[-1].lstrip(":")
        if kind == "zset" and (tail.startswith(("user", "global", "resource:")) or ":user" in key):
            name = "per_user" if "user" in tail else tail.removeprefix("resource:")
            report["pools"].append({"key": key, "pool": name, "used": client.zcard(key)})
        elif kind == "zset" and tail == "holders":
            for holder, expiry in client.zrange(key, 0, -1, withscores=True):
                left = (expiry - now_ms) / 1000
                report["holders"].append({"tag": key, "holder": holder, "expires_in_s": left})
        elif kind == "zset" and tail == "line":
            report["waiting"] += client.zcard(key)
        elif (tail.startswith("rate:") or ":rate:" in key) and not key.endswith(TOLD):
            report["counters"].append(counter(client, key, kind))
        elif key.endswith(":ban"):
            # {prefix}:user:<hash>:ban, or {prefix:<hash>}:user:ban without a global pool.
            digest = (
                tail.split(":")[1] if tail.count(":") == 2 else key.split("}")[0].split(":")[-1]
            )
            bans[digest] = max(bans.get(digest, 0.0), client.pttl(key) / 1000)
    # The CLI's revoke bans in both key layouts: one line per user.
    report["bans"] = [{"identity_hash": d, "expires_in_s": left} for d, left in bans.items()]
    return report


def keys_of(client: Any, prefix: str, under: str = "") -> set[str]:
    """The deployment's keys: those of its shared tag (``{prefix}:...``) and of users' own tags
    (``{prefix:<hash>}...``, with ``global_pool=False``), ending in ``under``."""
    patterns = (f"{{{prefix}}}:*{under}", f"{{{prefix}:*{under}")
    return {key for pattern in patterns for key in client.scan_iter(match=pattern, count=1000)}


def counter(client: Any, key: str, kind: str) -> dict[str, Any]:
    """One rate or budget counter: its policy's name and window, whose hash, and units in use
    (a sliding window's slices still counted, roughly: the library's exact rule is in Lua)."""
    parts = key.split(":")
    at = parts.index("rate")
    name, window = parts[at + 1], parts[at + 2]
    digest = parts[-1] if not parts[-1].startswith("rate") else key.split("}")[0].split(":")[-1]
    fields = client.hgetall(key) if kind == "hash" else {}
    if "x" in fields:  # a fixed window's: its units ('c') beside its window's end ('x')
        used = int(fields.get("c", 0))
    elif kind == "hash":  # a sliding window's slices, beside the time it was made ('e')
        used = sum(int(v) for f, v in fields.items() if f != "e")
    else:  # a fixed window's kept as a string, until a script rewrites it as the hash
        used = int(client.get(key) or 0)
    return {"policy": name, "window": window, "identity_hash": digest, "used": used}


def render(report: dict[str, Any]) -> str:
    lines = ["pools (use now; capacities are the app's settings):"]
    lines += [f"  {p['pool']:<24} {p['used']:>8}  {p['key']}" for p in report["pools"]] or [
        "  none"
    ]
    lines.append("holders (one per worker's manager and hash tag):")
    lines += [
        f"  {h['holder']:<20} expires in {h['expires_in_s']:7.1f} s  {h['tag']}"
        for h in report["holders"]
    ] or ["  none"]
    lines.append(f"waiting in line: {report['waiting']}")
    lines.append("users whose new streams are banned (revoke --ban):")
    lines += [
        f"  identity {b['identity_hash']}  for {b['expires_in_s']:7.1f} s more"
        for b in report["bans"]
    ] or ["  none"]
    lines.append("rate and budget counters:")
    lines += [
        f"  {c['policy']:<28} {c['window']:<12} {c['used']:>10}  identity {c['identity_hash']}"
        for c in report["counters"]
    ] or ["  none"]
    return "\n".join(lines)


def inspect(options: argparse.Namespace) -> int:
    client = connect(options.url)
    while True:
        report = snapshot(client, options.key_prefix)
        if not any(report[k] for k in ("pools", "holders", "counters", "waiting", "bans")):
            raise CliError(
                f"no keys with the prefix {options.key_prefix!r} at this Redis: check --url "
                "and --key-prefix (LeaseConfig.key_prefix of the app)",
                EXIT_NOTHING,
            )
        text = json.dumps(report) if options.json else render(report)
        if options.watch:
            shown = redact_url(options.url)
            print("\033[2J\033[H" + time.strftime("%H:%M:%S ") + shown, flush=True)
        print(text, flush=True)
        if not options.watch:
            return 0
        time.sleep(options.watch)


def deployment(options: argparse.Namespace, global_pool: bool = True) -> LeaseConfig:
    """The deployment's prefix and identity secret (its other settings play no part here)."""
    try:
        # Without --identity-secret, LeaseConfig reads STREAM_LEASE_IDENTITY_SECRET itself.
        return LeaseConfig(
            key_prefix=options.key_prefix,
            identity_secret=options.identity_secret or None,
            global_pool=global_pool,
        )
    except ValueError as error:
        raise CliError(f"{error} (--identity-secret or {SECRET_VARIABLE})", EXIT_USAGE) from None


def revoke(options: argparse.Namespace) -> int:
    if not 0 <= options.ban <= 30 * 86400:
        raise CliError(
            f"--ban {options.ban} is out of range: use 0 to 2592000 s (30 days)", EXIT_USAGE
        )

    async def in_both_layouts() -> int:
        # The user's pool is keyed one way with a global pool and another without; the CLI does
        # not know the app's setting, so it revokes (and bans) in both: the other stays empty.
        revoked = 0
        for global_pool in (True, False):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # no identity secret: the app's choice
                core = Manager(options.url, deployment(options, global_pool))
            try:
                revoked += await core.revoke(options.user, options.ban)
            finally:
                await core.aclose()
        return revoked

    digest = Manager("memory://", deployment(options)).identity_digest(options.user)
    try:
        revoked = asyncio.run(in_both_layouts())
    except (BackendError, ValueError) as error:
        raise CliError(f"cannot revoke: {error}", EXIT_UNREACHABLE) from None
    ban = f", new ones refused for {options.ban:g} s" if options.ban else ""
    if not revoked:
        # A wrong or missing secret names another identity: nothing ends, and saying "revoked
        # 0" with success would hide that the user's streams go on.
        raise CliError(
            f"no live stream of identity {digest} under the prefix {options.key_prefix!r}: "
            f"nothing revoked{ban and ' (the ban is set for that identity)'}. "
            + secret_hint(options),
            EXIT_NOTHING,
        )
    print(f"revoked {revoked} stream(s) of identity {digest}{ban}")
    return 0


def secret_hint(options: argparse.Namespace) -> str:
    """How to name the identity as the app does, for messages that found none."""
    given = options.identity_secret or os.environ.get(SECRET_VARIABLE)
    where = f"--identity-secret or {SECRET_VARIABLE}"
    if not given:
        return (
            "No identity secret was given: if the app sets LeaseConfig(identity_secret=...), "
            f"pass the same one with {where}; check --key-prefix too."
        )
    return f"Check that {where} is the app's identity_secret, and --key-prefix."


def reset(options: argparse.Namespace) -> int:
    digest = Manager("memory://", deployment(options)).identity_digest(options.user)
    client = connect(options.url)
    under = f"rate:{options.policy}:*"
    keys = [key for key in keys_of(client, options.key_prefix, under) if digest in key]
    counters = [key for key in keys if not key.endswith(TOLD)]
    if not counters:
        raise CliError(
            f"no counter of policy {options.policy!r} for identity {digest} under "
            f"{options.key_prefix!r}: nothing reset. Check the policy's name. "
            + secret_hint(options),
            EXIT_NOTHING,
        )
    # A counter's alerts told go with it, so the fresh allowance's thresholds are told again.
    client.delete(*keys)
    print(f"reset {len(counters)} counter(s) of {options.policy!r} for identity {digest}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastapi_stream_lease", description=__doc__)
    parser.add_argument(
        "--version", action="version", version=f"fastapi-stream-lease {__version__}"
    )
    # --url and --key-prefix go before or after the command; after it, they win (SUPPRESS keeps
    # a command's parser from overwriting the value given before it with its default).
    where = argparse.ArgumentParser(add_help=False)
    for place in (parser, where):
        given_after = place is where
        place.add_argument(
            "--url",
            default=argparse.SUPPRESS if given_after else url_from_environment(),
            help=f"the Redis the app uses (default: ${URL_VARIABLE}, else ${FALLBACK_URL_VARIABLE},"
            f" else {DEFAULT_URL})",
        )
        place.add_argument(
            "--key-prefix",
            default=argparse.SUPPRESS if given_after else DEFAULT_KEY_PREFIX,
            help="the app's LeaseConfig.key_prefix",
        )
    commands = parser.add_subparsers(dest="command", required=True)
    look = commands.add_parser(
        "inspect", help="pools, holders, waiters and counters", parents=[where]
    )
    look.add_argument("--json", action="store_true", help="one JSON document, for scripts")
    look.add_argument("--watch", type=float, metavar="SECONDS", help="refresh, like top")
    end = commands.add_parser(
        "revoke", help="end one user's streams on every worker", parents=[where]
    )
    end.add_argument("user")
    end.add_argument(
        "--ban",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="refuse the user's new streams this long (403)",
    )
    forget = commands.add_parser(
        "reset", help="forget one user's counters of one policy", parents=[where]
    )
    forget.add_argument("user")
    forget.add_argument("policy")
    for command in (end, forget):
        command.add_argument(
            "--identity-secret",
            default=None,
            help="the app's LeaseConfig.identity_secret, which hashes user ids into the keys "
            f"(default: ${SECRET_VARIABLE})",
        )
    options = parser.parse_args(argv)
    run = {"inspect": inspect, "revoke": revoke, "reset": reset}[options.command]
    try:
        return run(options)
    except CliError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.code
    except (KeyboardInterrupt, BrokenPipeError):
        return 0
