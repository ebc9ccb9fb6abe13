"""The rate-limit examples run as their docstrings say (here on the test's Redis)."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import http_sf
import pytest
from starlette.testclient import TestClient

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def example(monkeypatch, redis_server):
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.syspath_prepend(str(ROOT))

    def load(name: str):
        sys.modules.pop(f"examples.{name}", None)
        return importlib.import_module(f"examples.{name}")

    yield load


def test_the_chat_example_streams_with_headers_and_refuses_the_eleventh(example):
    module = example("rate_limited_chat")
    user = {"authorization": "Bearer chat-example-user"}
    with TestClient(module.app) as client:
        assert client.get("/api/chat/stream").status_code == 401
        for left in range(9, -1, -1):
            response = client.get("/api/chat/stream", params={"prompt": "hi"}, headers=user)
            assert response.status_code == 200 and "data: hi" in response.text
            states = dict(http_sf.parse(response.headers["RateLimit"].encode(), tltype="list"))
            assert states["chat_per_minute"]["r"] == left
        refused = client.get("/api/chat/stream", headers=user)
        assert refused.status_code == 429 and "Retry-After" in refused.headers
        assert client.get("/api/chat/quota", headers=user).json() == {
            "per_minute": 0, "per_day": 190,
        }


def test_the_login_example_limits_per_address_and_per_user(example):
    module = example("login")
    with TestClient(module.app) as client:
        attempt = {"username": "alice", "password": "wrong"}
        for _ in range(5):
            assert client.post("/login", json=attempt).status_code == 401
        refused = client.post("/login", json=attempt)
        assert refused.status_code == 429
        assert refused.json()["violated-policies"] == ["login_user_ip_per_minute"]
        # An unknown user is counted the same way, and another name from the address still
        # gets through (the address has 15 attempts left).
        unknown = {"username": "mallory", "password": "x"}
        assert client.post("/login", json=unknown).status_code == 401
        good = {"username": "alice", "password": "correct horse battery staple"}
        assert client.post("/login", json=good).status_code == 429  # alice's pair is spent


def test_the_llm_proxy_story_runs_and_settles_nested_money_budgets(redis_server):
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "llm_proxy.py")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "REDIS_URL": redis_server.url},
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "alice, stream 1: HTTP 200" in out and "x-ratelimit-remaining-tokens" in out
    # The model's usage, cached prompt tokens at their price: 7 x 2 + 5 x 0.5 + 40 x 8, rounded up.
    assert "spent after stream 1 (microdollars): team 337, alice 337" in out
    assert "model gpt-9: HTTP 400, unknown model 'gpt-9': use one of" in out
    # alice's running stream holds 12 x 2 + 1,500 x 8; bob's 12,024 fits his own 15,000, not
    # what his team has left of 20,000.
    assert "alice, stream 2 (max_tokens=1500) running: team 12361, alice 12361" in out
    assert "bob, same team, max_tokens=1500: HTTP 429, ['team_spend_per_day']" in out
    assert "alice left stream 2 after one token: team 369, alice 369" in out  # + 24 + 8
    # No usage chunk from fake-small: the proxy's count, 12 x 0.5 + 30 x 2.
    assert "carol (support), fake-small, no usage sent: team 66, carol 66" in out
    for level in (
        "team_spend_per_day 369 microdollars used of 20000",
        "user_spend_per_day 369 microdollars used of 15000",
        "tokens_per_minute 65 tokens used of 2000",
        "requests_per_minute 2 requests used of 20",
        "model_spend_per_day:fake-large 369 microdollars used of 100000",
        "model_spend_per_day:fake-small 66 microdollars used of 100000",
    ):
        assert f"GET /usage: {level}\n" in out
    # alice's second start brought her day's spend past 80 % of 15,000: told once.
    assert out.count("alert: ") == 1
    assert "alert: user_spend_per_day at 80%, 12361 of 15000\n" in out
    assert "llm proxy demo done" in out


def test_the_prometheus_example_exports_what_the_grafana_dashboard_reads(redis_server):
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "prometheus_metrics.py")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "REDIS_URL": redis_server.url},
    )
    assert done.returncode == 0, done.stderr
    (statuses,) = re.findall(r"^statuses: (.*)$", done.stdout, re.M)
    assert sorted(statuses.split()) == ["200", "200", "200", "429"]  # alice's third: 429
    assert 'fastapi_stream_lease_pool_used{pool="gpu"} 1.0' in done.stdout  # while streaming
    assert 'fastapi_stream_lease_requests_total{result="per_user"} 1.0' in done.stdout
    exported = set(re.findall(r"^  (fastapi_stream_lease_\w+)\{", done.stdout, re.M))
    dashboard_file = ROOT / "examples" / "grafana" / "fastapi-stream-lease.json"
    dashboard = json.loads(dashboard_file.read_text())
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    read = {
        name.removesuffix("_bucket") + ("_count" if name.endswith("_bucket") else "")
        for expression in expressions
        for name in re.findall(r"fastapi_stream_lease_\w+", expression)
    }
    assert read <= exported, f"the dashboard reads metrics never exported: {read - exported}"
    assert len(read) >= 12
