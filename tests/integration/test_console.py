"""`raybroker console` on real brokers over Ray: it finds the namespace's brokers (not the other
actors), shows why a message waits to leave, and an operator's retry goes through the broker's
public verb and is recorded; the command itself serves the page from its own process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request

import ray
from aiohttp.test_utils import TestClient, TestServer

from actors import Queue, Service
from actors.remote.discovery import brokers_in
from actors.tools.console.command import sources
from actors.tools.console.server import TOKEN_HEADER, Console
from tests.polling import wait_until
from tests.ports import free_port

from .conftest import ROOT


@ray.remote(num_cpus=0)
class NotABroker:
    def ping(self) -> str:
        return "pong"


def test_the_console_finds_the_brokers_shows_what_waits_and_retries_it(make_broker):
    a, b = make_broker(), make_broker()
    other = NotABroker.options(name=f"not-a-broker-{a.name}", namespace="raybroker").remote()
    ray.get(other.ping.remote())
    a.create(Queue("Q"))
    a.create(Service("Shop", "Q"))
    a.create_route("ToGone", "Orders", address="ray://no-such-broker")
    h = a.begin_dialog("Shop", "Orders", encryption=False)
    a.send(h, "DEFAULT", b"waits")
    wait_until(lambda: a.transmission_queue()[0]["attempts"] >= 2, what="two attempts, backing off")
    names = {a.name, b.name, f"not-a-broker-{a.name}"}
    assert set(brokers_in("raybroker", names)) == {a.name, b.name}
    console = Console(sources("raybroker", names), token="k" * 20)

    async def check() -> None:
        async with TestClient(TestServer(console.app())) as client:
            await console.refresh()
            state = await (await client.get("/api/state")).json()
            assert set(state["brokers"]) == {a.name, b.name}
            [row] = state["brokers"][a.name]["transmission"]
            assert (
                row["conversation_handle"] == h and "no-such-broker" in row["transmission_status"]
            )
            assert row["age_s"] >= 0 and row["next_attempt_at"] > 0
            retry = {"action": "retry_transmission", "broker": a.name, "handle": h}
            done = await client.post("/api/action", json=retry, headers={TOKEN_HEADER: "k" * 20})
            assert done.status == 200
            assert (await done.json())["done"].endswith(": 1 message(s) made due")

    asyncio.run(check())
    kinds = [e["kind"] for e in a.events()]
    assert kinds[-2:] == ["TransmissionRetried", "ConsoleAction"]
    ray.kill(other)


def test_the_console_command_serves_the_page_and_the_state(make_broker):
    b = make_broker()
    b.create(Queue("Q"))
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
    }
    cmd = [
        sys.executable,
        "-m",
        "actors.tools.cli",
        "console",
        "--port",
        str(port),
        "--every",
        "0.5",
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:

        def shown() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/state", timeout=2) as r:
                    return b.name in json.loads(r.read())["brokers"]
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
                return False

        wait_until(shown, timeout=60, what="the console to show the broker")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            assert b"raybroker console" in r.read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert b"raybroker console on http://127.0.0.1:" in proc.stdout.read()
