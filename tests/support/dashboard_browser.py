"""The operator dashboard in headless Chromium, driven by Selenium through chromedriver.

Rules:

- **Where the browser comes from.** Debian's ``chromium`` and ``chromium-driver``
  (``.ci/test-packages`` installs both when run as root). :func:`require_chromedriver`
  skips a test with a message saying how to get them when either is missing, except
  under ``CI=true``, where it fails the test: CI never passes by skipping.
- **Threads.** Selenium's client blocks, and the test's server runs on the test's own
  event loop: every browser call goes through :meth:`DashboardBrowser.call` on a worker
  thread (``asyncio.to_thread``), so the loop keeps answering the page meanwhile. Calls
  are made one at a time (the tests await each), as a WebDriver session requires.
- **Processes.** :mod:`bench.support.selenium_chrome` starts and ends them (the bench's
  own, shared as :mod:`tests.support.peers` shares the publisher): chromedriver in its own
  process group (recorded: :attr:`DashboardBrowser.pid`), the browser its child in that
  group, a fresh profile; :meth:`DashboardBrowser.quit` kills the whole group; idempotent.
- **Waits.** :meth:`DashboardBrowser.until` is :func:`tests.support.eventually.eventually`
  over a JavaScript expression evaluated in the page: state, never sleeps.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By

from bench.support import selenium_chrome
from tests.support.eventually import eventually


def require_chromedriver() -> tuple[str, str]:
    """(chromium, chromedriver) executables; skips when missing (fails under CI)."""
    browser, driver = selenium_chrome.binaries()
    if browser is not None and driver is not None:
        return browser, driver
    message = (
        "the dashboard tests need Debian's `chromium` and `chromium-driver`: `make test` "
        "run as root installs them (.ci/test-packages), or run "
        "`apt-get install chromium chromium-driver`"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: browser tests never skip)")
    pytest.skip(message)


class DashboardBrowser:
    """One headless Chromium under chromedriver (module rules)."""

    def __init__(self, browser_binary: str, driver_binary: str) -> None:
        self.browser_binary = browser_binary
        self.driver_binary = driver_binary
        self._chrome: selenium_chrome.Chrome | None = None

    @property
    def pid(self) -> int | None:
        """chromedriver's PID, also the id of the process group it and the browser share."""
        return self._chrome.pid if self._chrome is not None else None

    @property
    def driver(self) -> webdriver.Chrome:
        assert self._chrome is not None, "the browser is not started"
        return self._chrome.driver

    def start(self) -> None:
        """Start chromedriver and one browser session (blocking: call before a loop runs
        or from a thread)."""
        self._chrome = selenium_chrome.start(self.browser_binary, self.driver_binary)

    def quit(self) -> None:
        """End the session, chromedriver and the browser (idempotent)."""
        chrome, self._chrome = self._chrome, None
        if chrome is not None:
            chrome.quit()

    async def call[T](self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on a worker thread (module rules).

        Cancellation: the call runs on to its end on its thread; its result is dropped.
        """
        return await asyncio.to_thread(function, *args)

    async def open(self, url: str) -> None:
        """Load ``url`` (returns once the document has loaded)."""
        await self.call(self.driver.get, url)

    async def js(self, script: str, *args: Any) -> Any:
        """The value of a script's ``return`` in the page (``arguments[i]`` are ``args``)."""
        return await self.call(self.driver.execute_script, script, *args)

    async def until(self, expression: str, *args: Any, within: float, awaiting: str) -> Any:
        """The first truthy value of a JavaScript expression, polled (module rules)."""

        async def value() -> Any:
            return await self.js(f"return ({expression});", *args)

        return await eventually(value, within=within, awaiting=awaiting, every=0.1)

    async def click(self, selector: str) -> None:
        """Click the element ``selector`` names (it must exist and be enabled)."""
        clicked = await self.js(
            "const node = document.querySelector(arguments[0]);"
            "if (!node || node.disabled) return false; node.click(); return true;",
            selector,
        )
        assert clicked, f"nothing enabled to click at {selector}"

    async def type_into(self, selector: str, text: str) -> None:
        """Type ``text`` into the input ``selector`` names, as a user does (key events)."""

        def typed() -> None:
            field = self.driver.find_element(By.CSS_SELECTOR, selector)
            field.clear()
            field.send_keys(text)

        await self.call(typed)

    async def alert_text(self) -> str | None:
        """The text of an open JavaScript alert, or None when there is none."""

        def read() -> str | None:
            try:
                return self.driver.switch_to.alert.text
            except NoAlertPresentException:
                return None

        return await self.call(read)

    async def screenshot(self, path: Path) -> None:
        """A PNG of the window at ``path``."""
        saved = await self.call(self.driver.save_screenshot, str(path))
        assert saved, f"no screenshot written to {path}"


__all__ = ["DashboardBrowser", "require_chromedriver"]
