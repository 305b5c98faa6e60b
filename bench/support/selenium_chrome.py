"""Headless Chromium under chromedriver (Selenium), shared by ``bench/dashboard.py`` and the
dashboard tests (``tests/support/dashboard_browser.py`` wraps it for an event loop).

Rules:

- **Binaries.** Debian's ``chromium`` and ``chromium-driver`` on ``PATH``
  (:func:`binaries`); nothing is downloaded (Selenium Manager is never consulted: both
  paths are given).
- **Processes.** :func:`start` runs chromedriver in its own process group, its PID
  recorded in :attr:`Chrome.pid` (the browser is chromedriver's child, in that group);
  :meth:`Chrome.quit` ends the WebDriver session and then SIGKILLs that group, so nothing
  outlives it; idempotent. A fresh profile directory per browser, removed at quit.
- **Blocking.** Every Selenium call blocks; an async caller runs them on a thread.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

WINDOW_SIZE = "1280,1100"
PAGE_LOAD_TIMEOUT_S = 20.0
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    f"--window-size={WINDOW_SIZE}",
)


def binaries() -> tuple[str | None, str | None]:
    """(chromium, chromedriver) on ``PATH``; None for each one missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    return browser, shutil.which("chromedriver")


@dataclass
class Chrome:
    """One started browser session (module rules)."""

    driver: webdriver.Chrome
    pid: int | None
    """chromedriver's PID, also its process group's id."""
    profile: tempfile.TemporaryDirectory[str] | None = field(repr=False)

    def quit(self) -> None:
        """End the session, chromedriver and the browser; remove the profile (idempotent)."""
        try:
            self.driver.quit()
        finally:
            if self.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.pid = None
            if self.profile is not None:
                self.profile.cleanup()
                self.profile = None


def start(browser: str, chromedriver: str) -> Chrome:
    """Start chromedriver and one headless browser session (module rules)."""
    profile = tempfile.TemporaryDirectory(prefix="whip-selenium-")
    options = Options()
    options.binary_location = browser
    for flag in (*FLAGS, f"--user-data-dir={Path(profile.name) / 'profile'}"):
        options.add_argument(flag)
    service = Service(
        executable_path=chromedriver,
        log_output=str(Path(profile.name) / "chromedriver.log"),
        popen_kw={"start_new_session": True},
    )
    try:
        driver = webdriver.Chrome(options=options, service=service)
    except BaseException:
        process = getattr(service, "process", None)
        if process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        profile.cleanup()
        raise
    driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
    return Chrome(driver, service.process.pid, profile)


__all__ = ["Chrome", "binaries", "start"]
