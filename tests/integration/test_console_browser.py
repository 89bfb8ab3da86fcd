"""`raybroker console` in a real headless Chromium, looked at and clicked as an operator does,
over a deployed topology on real brokers: the page lists the topology's brokers and queues, a
queue's depth chart moves while messages flow, a waiting transmission row shows why it waits,
and a poisoned queue shows as disabled until the operator's click on "re-enable" (confirmed)
brings it back on the broker."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import pytest
import yaml

from actors import Send
from actors.tools.console.command import names_of, sources
from actors.tools.console.server import Console
from tests.browser import Browser, chromium_or_skip
from tests.polling import wait_until
from tests.ports import free_port
from topologies.deploy import deploy
from topologies.loader import load

pytestmark = pytest.mark.slow


def _topology(tag: str) -> dict:
    """shop-* (which the test gives a route to a broker that does not run) and work-*, whose
    queue poisons after two rollbacks in a row."""
    return {
        "brokers": [
            {
                "name": f"shop-{tag}",
                "storage": "shop.sqlite",
                "queues": [{"name": "StoreQ"}],
                "services": [{"name": "Store", "queue": "StoreQ"}],
            },
            {
                "name": f"work-{tag}",
                "storage": "work.sqlite",
                "queues": [{"name": "WorkQ", "poison_limit": 2}],
                "services": [
                    {"name": "Client", "queue": "WorkQ"},
                    {"name": "Work", "queue": "WorkQ", "contracts": ["DEFAULT"]},
                ],
            },
        ]
    }


class Served:
    """The console serving from a thread of the test's, as `raybroker console` serves."""

    def __init__(self, console: Console) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="console").start()

        async def start() -> asyncio.Task:
            return asyncio.ensure_future(console.serve(lambda s: None))

        self.task = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)

    def stop(self) -> None:
        async def stop() -> None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_an_operator_sees_the_topology_its_flow_what_waits_and_re_enables_a_queue(
    ray_session, tmp_path
):
    binary = chromium_or_skip()
    tag = uuid.uuid4().hex[:6]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(_topology(tag)))
    topology = load(str(tmp_path / "t.yaml"))
    d = deploy(topology, str(tmp_path / "data"))
    shop, work = d.brokers[f"shop-{tag}"], d.brokers[f"work-{tag}"]
    port = free_port()
    console = Console(sources("raybroker", names_of(topology)), port=port, every_s=0.3)
    served = Served(console)
    browser = Browser(binary)
    try:
        wait_until(lambda: console.state["brokers"], what="the console's first gathering")
        browser.open(f"http://127.0.0.1:{port}/")

        def shown(expr: str):
            return lambda: browser.js(expr)

        # the topology's brokers and their queues
        names = 'Array.from(document.querySelectorAll("section.broker h2"), e => e.textContent)'
        wait_until(lambda: set(browser.js(names) or []) == {shop.name, work.name},
                   what="both brokers on the page")  # fmt: skip
        queues = 'Array.from(document.querySelectorAll("section.broker tr td:first-child"), e => e.textContent)'  # noqa: E501
        assert {"StoreQ", "WorkQ"} <= set(browser.js(queues))

        # a waiting transmission row says why it waits
        shop.create_route("ToGone", "Gone", address=f"ray://gone-{tag}")
        h = shop.begin_dialog("Store", "Gone", encryption=False)
        shop.send(h, "DEFAULT", b"waits")
        row = f'[...document.querySelectorAll("tr")].find(r => r.textContent.includes("{h}"))'
        status = wait_until(
            shown(f"{row}?.cells[3].textContent"), what="the waiting row with its status"
        )
        assert f"gone-{tag}" in status, status

        # the work queue's depth chart moves while messages flow into it
        points = (
            '[...document.querySelectorAll("tr")].find(r => r.cells[0]?.textContent === "WorkQ")'
            '?.querySelector("svg polygon")?.getAttribute("points")'
        )
        seen: set[str] = set()
        dialog = work.begin_dialog("Client", "Work", encryption=False)

        def flowing() -> bool:
            work.apply([Send(dialog, "DEFAULT", b"x")] * 50)
            if p := browser.js(points):
                seen.add(p)
            return len(seen) >= 3

        wait_until(flowing, timeout=60, what="the depth chart to change while messages flow")
        depth = work.queues()["WorkQ"]["depth"]
        assert depth > 0

        # two rollbacks in a row poison WorkQ: the page says so, and the operator re-enables it
        for _ in range(2):
            work.rollback(work.receive("WorkQ", max_groups=1))
        assert not work.queues()["WorkQ"]["enabled"]
        button = 'button[data-act="enable_queue"]'
        wait_until(shown(f'!!document.querySelector({json.dumps(button)})'),
                   what="the re-enable button of the disabled queue")  # fmt: skip
        assert f"work-{tag}/WorkQ" in browser.js('document.getElementById("stuck").textContent')
        browser.click(button)
        wait_until(lambda: work.queues()["WorkQ"]["enabled"], what="the broker's queue enabled")
        assert browser.dialogs == [f"On broker {work.name}: re-enable queue WorkQ?"]
        wait_until(shown(f'!document.querySelector({json.dumps(button)})'),
                   what="the page to show the queue enabled")  # fmt: skip
        kinds = [e["kind"] for e in work.events()]
        assert kinds.index("QueueDisabled") < len(kinds) - 1 - kinds[::-1].index("ConsoleAction")
        [g] = work.receive("WorkQ", max_groups=1)
        assert len(g.messages) == depth  # the flow's messages, none lost to the poisoning
        browser.screenshot(tmp_path / "console.png")
        assert (tmp_path / "console.png").stat().st_size > 10_000
    finally:
        browser.close()
        served.stop()
        d.stop(delete_stores=True)
