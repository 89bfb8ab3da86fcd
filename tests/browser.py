"""A real headless Chromium for tests that look at a page as an operator does: started with a
DevTools port, driven over the DevTools protocol's websocket (aiohttp, which Ray brings), its
clicks real mouse events at the element's place, its confirm() dialogs accepted and recorded.

`Browser.find()` says why none can run here (no chromium on the PATH): tests skip with that
reason, except on CI (CI=1), which installs Debian's `chromium` and must run them."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.polling import wait_until

CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--no-first-run", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--window-size=1300,1000",
)  # fmt: skip


def chromium_or_skip() -> str:
    """The chromium binary; a skip naming what is missing (a failure on CI)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    why = "a browser test needs Debian's chromium on the PATH (apt-get install chromium)"
    if os.environ.get("CI") == "1":
        pytest.fail(f"{why}: CI installs it in .ci/run and must run this test")
    pytest.skip(why)


class Browser:
    """One headless Chromium with one page. Every call blocks until the browser answers."""

    def __init__(self, binary: str, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="raybroker-chromium-")
        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        active = Path(self.profile) / "DevToolsActivePort"
        wait_until(lambda: self._started(active), timeout=timeout_s, what="chromium's DevTools")
        self.port = int(active.read_text().split()[0])
        self.dialogs: list[str] = []  # the messages of the confirm()s accepted
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._run(self._connect())
        self.call("Page.enable")
        self.call("Runtime.enable")

    def _started(self, active: Path) -> bool:
        assert self.proc.poll() is None, f"chromium exited with {self.proc.returncode}"
        return active.exists() and bool(active.read_text().strip())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout_s)

    async def _connect(self) -> None:
        self.http = aiohttp.ClientSession()
        async with self.http.get(f"http://127.0.0.1:{self.port}/json/list") as r:
            targets = json.loads(await r.text())
        [page] = [t for t in targets if t["type"] == "page"]
        self.ws = await self.http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data:
                fut = self._pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
            elif data.get("method") == "Page.javascriptDialogOpening":
                # an operator confirming the action: accept it, and remember what it asked
                self.dialogs.append(data["params"]["message"])
                await self._send("Page.handleJavaScriptDialog", {"accept": True})

    async def _send(self, method: str, params: dict[str, Any]) -> asyncio.Future:
        n = next(self._ids)
        fut = self.loop.create_future()
        self._pending[n] = fut
        await self.ws.send_str(json.dumps({"id": n, "method": method, "params": params}))
        return fut

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        answer = await (await self._send(method, params))
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self._run(self._call(method, params))

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        wait_until(lambda: self.js("document.readyState") == "complete", what=f"{url} to load")

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        out = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def click(self, selector: str) -> None:
        """A left click with the mouse at the middle of the first element `selector` matches."""
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        assert box, f"nothing on the page matches {selector}"
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def screenshot(self, path: str | Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self) -> None:
        async def shut() -> None:
            await self.ws.close()
            await self.http.close()

        try:
            self._run(shut())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)
