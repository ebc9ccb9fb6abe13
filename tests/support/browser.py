"""A real headless browser for the tests: Debian's ``chromium`` driven through its
``chromedriver`` over the W3C WebDriver protocol (plain HTTP, so no client library)."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx

from .ports import free_port
from .waiting import wait_until

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the protocol's key for an element reference


def browser_binaries() -> tuple[str, str] | None:
    """(chromium, chromedriver) when both are on PATH (``make test`` installs Debian's where
    it can), else None."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


class Browser:
    """One headless chromium window."""

    def __init__(self, browser: str, driver: str, width: int = 1200, height: int = 900) -> None:
        port = free_port()
        self._driver = subprocess.Popen(
            [driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        wait_until(self._ready, timeout=30, what="chromedriver")
        options = {
            "binary": browser,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     f"--window-size={width},{height}"],
        }
        capabilities = {"browserName": "chrome", "goog:chromeOptions": options}
        reply = self._call("POST", "/session", {"capabilities": {"alwaysMatch": capabilities}})
        self._session = f"/session/{reply['sessionId']}"

    def _ready(self) -> bool:
        try:
            return bool(self._http.get("/status").json()["value"]["ready"])
        except httpx.TransportError:
            return False

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self._http.request(method, path, json=body)
        value = response.json()["value"]
        if response.status_code != 200:
            raise RuntimeError(f"WebDriver {method} {path}: {value}")
        return value

    def open(self, url: str) -> None:
        self._call("POST", f"{self._session}/url", {"url": url})

    def elements(self, css: str) -> list[str]:
        found = self._call(
            "POST", f"{self._session}/elements", {"using": "css selector", "value": css}
        )
        return [element[ELEMENT] for element in found]

    def click(self, css: str, index: int = 0) -> None:
        element = self.elements(css)[index]
        self._call("POST", f"{self._session}/element/{element}/click", {})

    def text(self, css: str) -> str:
        """The visible text of every element ``css`` selects, one per line."""
        return "\n".join(
            self._call("GET", f"{self._session}/element/{element}/text")
            for element in self.elements(css)
        )

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self._call("GET", f"{self._session}/screenshot")))

    def close(self) -> None:
        try:
            self._call("DELETE", self._session)
        finally:
            self._http.close()
            self._driver.terminate()
            self._driver.wait(timeout=30)
