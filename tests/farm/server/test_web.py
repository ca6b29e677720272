"""The web view in headless Chromium (over the DevTools protocol) against a real uvicorn server: a sign-in with a
token, the requests page with progress, a request's results table and the report's plots, a comparison; the
keyboard (a skip link first, then the navigation, in DOM order; Enter on the skip link focuses main) and what a
screen reader gets (landmarks, a captioned table, labelled progress bars and fields); read-only for others."""
from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.farm.results_data import seed_request
from tests.farm.server.serverproc import free_port

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is "
                                                   "not installed (scripts/test installs it)")]


@pytest.fixture
def site(tokens: dict[str, str]) -> Iterator[dict[str, Any]]:
    """A uvicorn server of farm's app on a free port, with two of alice's requests (results seeded)."""
    import uvicorn

    from farm.db.models import RequestOwner
    from farm.db.session import session_scope
    from farm.server.app import create_app

    ids = [seed_request(np.random.default_rng(n), repeats=2, edge=False) for n in (1, 2)]
    with session_scope() as s:
        for rid in ids:
            s.add(RequestOwner(request_id=rid, owner="alice", team="ml", priority=0))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(release_jobs=False), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield {"url": f"http://127.0.0.1:{port}", "ids": ids}
    server.should_exit = True
    thread.join(15)


FOCUS = "(function(e){return (e.tagName+' '+(e.getAttribute('href')||e.id||e.textContent||'')).trim()})" \
        "(document.activeElement)"


async def _visit(site: dict[str, Any], token: str, tmp_path: Path) -> dict[str, Any]:
    from tests.farm.server.cdp import Browser

    url, (a, b) = site["url"], site["ids"]
    out: dict[str, Any] = {}
    async with Browser(tmp_path) as br:
        await br.goto(url + "/")
        out["signin_redirect"] = await br.js("location.pathname")
        await br.submit(f"document.getElementById('token').value={token!r}; document.querySelector('main form')"
                        ".submit()")
        out["requests"] = await br.js("document.querySelectorAll('#requests tbody tr').length")
        out["progress"] = await br.js("[...document.querySelectorAll('progress')].map(p=>p.getAttribute('aria-label'))")
        order = []
        for _ in range(6):
            await br.key("Tab", 9)
            order.append(await br.js(FOCUS))
        out["focus"] = order
        out["dom_order"] = await br.js("[...document.querySelectorAll('a[href],button,input')].slice(0,6)"
                                       ".map(e=>(e.tagName+' '+(e.getAttribute('href')||e.id||e.textContent)).trim())")
        await br.goto(url + "/")
        await br.key("Tab", 9)
        await br.key("Enter", 13)
        out["after_skip"] = await br.js("document.activeElement.id")
        await br.goto(f"{url}/requests/{a}")
        out["ax"] = await br.ax_nodes()
        out["rows"] = await br.js("document.querySelectorAll('#results tbody tr').length")
        out["plots"] = await br.js("[...document.querySelectorAll('figure svg')].map(s=>s.getBoundingClientRect()"
                                   ".width)")
        out["read_only"] = await br.js("!!document.getElementById('read-only')")
        out["cancel"] = await br.js("!!document.querySelector('form[action$=\"/cancel\"]')")
        out["unlabelled"] = await br.js("[...document.querySelectorAll('input,select,textarea')].filter(e=>!e.labels"
                                        "||!e.labels.length).length")
        await br.screenshot(tmp_path / "request.png")
        await br.goto(f"{url}/compare?a={a}&b={b}")
        out["compare"] = await br.js("document.querySelectorAll('#comparison tbody tr').length")
        out["compare_fields"] = await br.js("[...document.querySelectorAll('main input')].map(e=>e.labels[0]"
                                            ".textContent)")
    return out


def test_the_web_view_in_chromium(site: dict[str, Any], tokens: dict[str, str], tmp_path: Path) -> None:
    from farm.readers.results import result_rows

    page = asyncio.run(_visit(site, tokens["bob"], tmp_path))
    assert page["signin_redirect"] == "/login"
    assert page["requests"] == 2 and all(p and p.endswith("jobs done") for p in page["progress"])
    assert page["focus"][0] == "A #main", page["focus"]  # the skip link comes first
    assert page["focus"] == page["dom_order"], page  # then every control in DOM order: no tabindex traps
    assert page["after_skip"] == "main"
    assert page["rows"] == len(result_rows(site["ids"][0])) > 0
    assert len(page["plots"]) >= 3 and min(page["plots"]) > 300
    assert page["read_only"] and not page["cancel"]  # bob does not own alice's request
    assert page["unlabelled"] == 0
    roles = {(n["role"], n["name"]) for n in page["ax"]}
    assert {"banner", "navigation", "main"} <= {r for r, _ in roles}, roles
    assert ("navigation", "Main") in roles
    assert any(r == "table" and n.startswith("Results of request") for r, n in roles)
    assert any(r == "progressbar" and n.endswith("jobs done") for r, n in roles)
    assert any(r == "columnheader" and n == "job" for r, n in roles)
    assert page["compare"] > 0 and page["compare_fields"] == ["Baseline request (A)", "Compared request (B)"]
    from PIL import Image

    with Image.open(tmp_path / "request.png") as img:  # the screenshot, kept in the test's artifacts
        assert img.size[0] > 1000 and img.size[1] > 800
        assert (np.asarray(img.convert("L")) < 200).mean() > 0.02


def test_the_owner_gets_a_cancel_button(site: dict[str, Any], tokens: dict[str, str], tmp_path: Path) -> None:
    from tests.farm.server.cdp import Browser

    async def visit() -> tuple[bool, bool]:
        async with Browser(tmp_path) as br:
            await br.goto(site["url"] + "/login")
            await br.submit(f"document.getElementById('token').value={tokens['alice']!r};"
                            "document.querySelector('main form').submit()")
            await br.goto(f"{site['url']}/requests/{site['ids'][0]}")
            return (await br.js("!!document.getElementById('read-only')"),
                    await br.js("document.querySelectorAll('#results tbody tr').length > 0"))

    read_only, table = asyncio.run(visit())
    assert not read_only and table
