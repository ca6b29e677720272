"""A headless Chromium driven over the Chrome DevTools Protocol (``--remote-debugging-port``, one websocket), for
what ``--dump-dom`` cannot show: keyboard focus order, the accessibility tree a screen reader reads, cookies
and screenshots. Only the few CDP methods the web view's test needs."""
from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp


class Browser:
    """``async with Browser(tmp) as b``: one Chromium, one page; ``call`` sends a CDP method and awaits its answer."""

    def __init__(self, tmp: Path) -> None:
        self.profile = tmp / "chromium-profile"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ids = 0
        self.events: list[dict[str, Any]] = []

    async def __aenter__(self) -> Browser:
        self.proc = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--remote-debugging-port=0",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--window-size=1280,1600", f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            await asyncio.sleep(0.1)
        port = port_file.read_text().split()[0]
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as res:
            page = next(t for t in await res.json() if t["type"] == "page")
        self.ws = await self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=64 << 20)
        for domain in ("Page", "Runtime", "Network", "Accessibility"):
            await self.call(f"{domain}.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ws.close()
        await self.session.close()
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)
        shutil.rmtree(self.profile, ignore_errors=True)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.ids += 1
        mine = self.ids
        await self.ws.send_str(json.dumps({"id": mine, "method": method, "params": params}))
        while True:
            msg = json.loads((await self.ws.receive(timeout=60)).data)
            if msg.get("id") == mine:
                assert "error" not in msg, (method, msg["error"])
                return dict(msg.get("result", {}))
            self.events.append(msg)

    async def goto(self, url: str) -> None:
        """Navigate and wait for the load event."""
        await self.then_load("Page.navigate", url=url)

    async def submit(self, expression: str) -> None:
        """Run ``expression`` (one that submits a form) and wait for the page it leads to."""
        await self.then_load("Runtime.evaluate", expression=expression)

    async def then_load(self, method: str, **params: Any) -> None:
        self.events.clear()
        await self.call(method, **params)
        deadline = time.monotonic() + 60
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            assert time.monotonic() < deadline, f"{method} {params} led to no page load"
            msg = json.loads((await self.ws.receive(timeout=60)).data)
            self.events.append(msg)

    async def js(self, expression: str) -> Any:
        out = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return out["result"].get("value")

    async def key(self, key: str, code: int, shift: bool = False) -> None:
        """Press and release a key (Tab 9, Enter 13)."""
        mods = 8 if shift else 0
        for kind in ("rawKeyDown", "keyUp"):
            await self.call("Input.dispatchKeyEvent", type=kind, key=key, code=key, windowsVirtualKeyCode=code,
                            modifiers=mods)
        if key == "Enter":
            await self.call("Input.dispatchKeyEvent", type="char", text="\r")

    async def screenshot(self, path: Path) -> None:
        data = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))

    async def ax_nodes(self) -> list[dict[str, Any]]:
        """The accessibility tree as a screen reader gets it: (role, name) of every node not ignored."""
        tree = await self.call("Accessibility.getFullAXTree")
        return [{"role": n.get("role", {}).get("value"), "name": n.get("name", {}).get("value", "")}
                for n in tree["nodes"] if not n.get("ignored")]
