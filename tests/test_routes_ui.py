"""The dashboard's files over HTTP (whip/routes_ui.py): what is served, with which headers,
revalidation, and nothing else; and the browser tests' requirement rule. The page itself
runs in tests/test_dashboard.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.support.dashboard_browser import require_chromedriver
from whip.routes_ui import UI_FILES, load_ui_files


async def test_every_file_is_served_with_its_type_policy_and_etag(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    server = await whip_servers()
    files = load_ui_files()
    async with aiohttp.ClientSession() as http:
        pages = {}
        for path in ("/", "/ui/", *(f"/ui/{name}" for name in UI_FILES)):
            async with http.get(server.make_url(path)) as response:
                assert response.status == 200, path
                pages[path] = (await response.read(), response.headers.copy())
        assert pages["/"][0] == pages["/ui/"][0] == pages["/ui/index.html"][0]
        for name, content_type in UI_FILES.items():
            body, headers = pages[f"/ui/{name}"]
            assert body == files[name].body
            assert headers["Content-Type"] == f"{content_type}; charset=utf-8"
            assert headers["ETag"] == files[name].etag
            assert headers["Cache-Control"] == "no-cache"
            assert headers["X-Content-Type-Options"] == "nosniff"
            policy = dict(
                directive.strip().split(" ", 1)
                for directive in headers["Content-Security-Policy"].split(";")
            )
            assert policy["script-src"] == "'self'"  # no inline script, no eval
            assert policy["default-src"] == "'none'"
            assert "blob:" in policy["img-src"].split()
            assert policy["connect-src"] == "'self'"
            assert "unsafe" not in headers["Content-Security-Policy"]

        # Revalidation: the same ETag answers 304 with no body, another one the file.
        etag = files["app.js"].etag
        async with http.get(
            server.make_url("/ui/app.js"), headers={"If-None-Match": etag}
        ) as response:
            assert response.status == 304
            assert await response.read() == b""
            assert response.headers["ETag"] == etag
        async with http.get(
            server.make_url("/ui/app.js"), headers={"If-None-Match": '"stale"'}
        ) as response:
            assert response.status == 200

        # Nothing but the listed files: a JSON 404, never a file system path.
        for path in ("/ui/nope.js", "/ui/..%2Fopenapi.json", "/ui/app.js.map"):
            async with http.get(server.make_url(path)) as response:
                assert response.status == 404, path
                assert (await response.json())["error"]["code"] == "not_found"
        async with http.post(server.make_url("/")) as response:
            assert response.status == 405


def test_the_page_has_no_inline_script_or_handler() -> None:
    """The CSP would block them; the page must not need them."""
    page = load_ui_files()["index.html"].body.decode()
    assert page.count("<script") == 1
    assert '<script src="/ui/app.js" defer></script>' in page
    for handler in ("onclick", "onload", "onerror", "onsubmit", "javascript:"):
        assert handler not in page
    script = load_ui_files()["app.js"].body.decode()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink


def test_a_missing_chromedriver_fails_under_ci_and_skips_elsewhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The browser tests never pass by skipping in CI (tests/support/dashboard_browser.py)."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no chromium, no chromedriver
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_chromedriver()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="chromium-driver"):
        require_chromedriver()
