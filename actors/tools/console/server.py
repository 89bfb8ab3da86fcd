"""The console's web server (aiohttp, which Ray brings): the page, the brokers' state as JSON,
refreshed every few seconds in the background, and the operator's actions. Bound to 127.0.0.1
unless told otherwise; every action needs the console's token (embedded in the page it serves
on loopback, asked for on any other address), so another site open in the same browser cannot
act through it."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

from aiohttp import web

from actors.errors import BrokerError
from actors.tools.console.board import Board, act

log = logging.getLogger("raybroker")

# the brokers to show, and the mirrored ones' records (actors.remote.discovery)
Sources = Callable[[], tuple[Mapping[str, Any], Mapping[str, dict[str, Any]]]]
TOKEN_HEADER = "X-Raybroker-Token"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Console:
    def __init__(
        self,
        sources: Sources,
        *,
        host: str = "127.0.0.1",
        port: int = 8266,
        token: str | None = None,
        every_s: float = 2.0,
    ) -> None:
        self.sources, self.host, self.port, self.every_s = sources, host, port, every_s
        self.token = token or secrets.token_urlsafe(18)
        self.board = Board()
        self.brokers: Mapping[str, Any] = {}
        self.state: dict[str, Any] = {"at": None, "brokers": {}}
        self._lock = asyncio.Lock()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024)
        app.router.add_get("/", self._page)
        app.router.add_get("/api/state", self._state)
        app.router.add_post("/api/action", self._action)
        return app

    async def refresh(self) -> None:
        """Gather every broker's views once (off the event loop: the handles block)."""
        async with self._lock:
            brokers, mirrors = await asyncio.to_thread(self.sources)
            self.state = await asyncio.to_thread(self.board.gather, brokers, time.time(), mirrors)
            self.brokers = brokers

    async def refresh_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # a cluster that is restarting: say so, and try again
                log.exception("the console could not gather the brokers' state")
            await asyncio.sleep(self.every_s)

    async def _page(self, request: web.Request) -> web.Response:
        page = resources.files("actors.tools.console").joinpath("page.html").read_text()
        embedded = self.token if is_loopback(self.host) else ""
        return web.Response(text=page.replace("{{TOKEN}}", embedded), content_type="text/html")

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state, dumps=lambda v: json.dumps(v, default=str))

    async def _action(self, request: web.Request) -> web.Response:
        given = request.headers.get(TOKEN_HEADER, "")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return web.json_response({"error": "a wrong or missing console token"}, status=403)
        try:
            action = await request.json()
        except ValueError:
            return web.json_response({"error": "the action must be a JSON object"}, status=400)
        if not isinstance(action, dict):
            return web.json_response({"error": "the action must be a JSON object"}, status=400)
        who = f"raybroker console (from {request.remote})"
        try:
            done = await asyncio.to_thread(act, self.brokers, action, who)
        except BrokerError as exc:
            return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=400)
        with contextlib.suppress(Exception):  # the page shows it at once; it is done already
            await self.refresh()
        return web.json_response({"done": done})

    async def serve(self, started: Callable[[str], None] = print) -> None:
        """Serve until cancelled."""
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        refresher = asyncio.create_task(self.refresh_forever())
        url = f"http://{self.host}:{self.port}/"
        if is_loopback(self.host):
            started(f"raybroker console on {url} (Ctrl-C stops it)")
        else:
            started(f"raybroker console on {url}; actions need the token {self.token}")
        try:
            await asyncio.Event().wait()
        finally:
            refresher.cancel()
            await asyncio.gather(refresher, return_exceptions=True)
            await runner.cleanup()
