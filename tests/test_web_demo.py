"""The demo's web page (``examples/web_demo.py``, ``make demo-web``) in a real headless browser
against a real server: a visitor opens streams for three users and sees their tokens, a 429 and
a 503 with Retry-After, and the pool's use against its caps; closing a stream frees its slot; an
operator's revoke ends an EventSource and fetch readers with a final event, and the page's
EventSource does not reconnect.
The screenshot it takes is the docs' picture (``STREAM_LEASE_UPDATE_SCREENSHOTS=1`` writes it
to ``docs/images/web-demo.png``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.browser import Browser, browser_binaries
from support.uvicorn_server import Uvicorn
from support.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT = ROOT / "docs" / "images" / "web-demo.png"


@pytest.fixture
def browser() -> Iterator[Browser]:
    binaries = browser_binaries()
    if binaries is None:
        pytest.skip(
            "no chromium and chromedriver on PATH: `make test` installs Debian's where it can"
            " (apt-get install chromium chromium-driver)"
        )
    window = Browser(*binaries, height=720)
    yield window
    window.close()


@pytest.fixture
def web_demo(redis_server) -> Iterator[str]:
    server = Uvicorn("web_demo:app", ROOT / "examples", {"REDIS_URL": redis_server.url})
    yield server.base_url + "/"
    server.stop()


def test_a_visitor_sees_streams_refusals_and_the_pools_use(web_demo, browser, tmp_path):
    browser.open(web_demo)
    wait_until(lambda: browser.text("#cap-user") == "2", what="the caps from /pool")

    def clicks(user: str, times: int) -> None:
        for _ in range(times):
            browser.click(f"#user-{user} .open")

    clicks("alice", 3)  # her third is over her own cap
    wait_until(lambda: "HTTP 429, Retry-After: " in browser.text("#user-alice .streams"),
               what="alice's 429")
    wait_until(lambda: browser.text("#user-alice .count") == "2 of 2", what="alice at her cap")
    clicks("bob", 2)
    wait_until(lambda: browser.text("#in-all") == "4", what="4 streams in all")
    clicks("carol", 1)  # over the cap in all
    wait_until(lambda: "HTTP 503, Retry-After: " in browser.text("#user-carol .streams"),
               what="carol's 503")
    wait_until(lambda: "token" in browser.text("#user-bob .tokens"), what="bob's tokens")
    log = browser.text("#log")
    assert "alice" in log and "HTTP 429" in log and "HTTP 503" in log

    browser.screenshot(tmp_path / "web-demo.png")
    if os.environ.get("STREAM_LEASE_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(tmp_path / "web-demo.png", SCREENSHOT)

    browser.click("#user-alice .stream:not(.refused) button")  # close one of hers
    wait_until(lambda: browser.text("#user-alice .count") == "1 of 2", what="alice's slot freed")
    wait_until(lambda: browser.text("#in-all") == "3", what="3 streams in all")

    # An operator's revoke ends carol's EventSource with a final event the page reads, and the
    # page closes it: no reconnection. Bob's streams, read with fetch, get the same event.
    browser.click("#user-carol .open-eventsource")
    carols = "#user-carol .eventsource"
    wait_until(lambda: "token" in browser.text(f"{carols} .tokens"), what="carol's tokens")
    browser.click("#user-carol .revoke")
    wait_until(lambda: "EventSource closed" in browser.text(carols), what="carol's final event")
    assert "ended by the server: Stream lease revoked" in browser.text(carols)
    assert browser.text(f"{carols} .connections") == "(connections: 1)"
    browser.click("#user-bob .revoke")
    wait_until(lambda: browser.text("#user-bob .streams").count("Stream lease revoked") == 2,
               what="bob's final events")
    wait_until(lambda: browser.text("#in-all") == "1", what="alice's stream alone")
    assert browser.text(f"{carols} .connections") == "(connections: 1)", "never reconnected"
