"""The cost of one order crossing two brokers, in one process (no Ray): the demo's path without
the router. Broker A begins a dialog per order and sends its lines; A's transport dispatches
them to broker B (its courier over in-process peers, real SQLite files); B receives each order,
answers every line with a Reply and commits; the replies go back to A, which receives and commits
them. Prints CPU microseconds per order, both brokers together.

    python scripts/hops_cost.py [ROUNDS] [ORDERS_PER_ROUND] [LINES] [secured]

`secured`: with dialog security, as the demo's topology has it: each service a certificate, the
other's imported, the target service bound on A and SEND granted; every dialog encrypted.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from typing import Any

from actors import collector
from actors.calls.envelope import Begin, Send
from actors.core import BrokerCore, Limits
from actors.model.catalog import Contract, MessageType, Queue, Service
from actors.model.credentials import Certificate, Grant, RemoteServiceBinding
from actors.store.database import Store

WARMUP = 10


class Net:
    """Two brokers and their couriers; a call runs the callee's courier in this process."""

    def __init__(self, folder: str, secured: bool = False) -> None:
        self.cores: dict[str, BrokerCore] = {}
        self.couriers: dict[str, Any] = {}
        limits = Limits()
        if secured:
            master = os.path.join(folder, "master.key")
            with open(master, "wb") as f:
                f.write(os.urandom(32))
            limits = Limits(master_key_file=master)
        for name, svc in (("A", Service("Init", "InitQ")), ("B", Service("T", "TQ", ("C",)))):
            store = Store(os.path.join(folder, f"{name}.sqlite"))
            core = BrokerCore(store, time.time, limits, name)
            core.create(MessageType("Order", "json"))
            core.create(MessageType("Reply", "json"))
            core.create(Contract("C", {"Order": "initiator", "Reply": "target"}))
            core.create(Queue(svc.queue))
            core.create(svc)
            self.cores[name] = core
            self.couriers[name] = core.transport.courier(self)
        a, b = self.cores["A"], self.cores["B"]
        a.create_route("routes", {"name": "ToT", "service_name": "T", "address": "ray://B"})
        b.create_route(
            "routes",
            {"name": "ToInit", "service_name": "Init", "broker_instance": a.broker_id,
             "address": "ray://A"},
        )  # fmt: skip
        if secured:
            a.create(Certificate("InitCert", owner="Init", days=30))
            b.create(Certificate("InitCert", a.catalog.certificates["InitCert"].certificate))
            b.create(Certificate("TCert", owner="T", days=30))
            a.create(Certificate("TCert", b.catalog.certificates["TCert"].certificate))
            a.create(RemoteServiceBinding("ToT", "T", "TCert"))
            b.create(Grant("InitMaySend", "T", "InitCert"))

    async def deliver(self, broker: str, blob: bytes, timeout: float) -> bytes:
        return await self.couriers[broker].deliver(blob)

    async def pump(self) -> None:
        while True:
            moved = False
            for name, core in self.cores.items():
                for out in core.transport.dispatch():
                    await self.couriers[name].send(out)
                    moved = True
            if not moved:
                return


def take(core: BrokerCore, queue: str, answer: bool) -> int:
    got = 0
    while groups := core.receive(queue, max_groups=100):
        ops = []
        for g in groups:
            got += len(g.rows)
            if answer:
                for m in g.messages:
                    ops.append(Send(m.conversation_handle, "Reply", m.body))
        core.settle(commit=[g.lock_id for g in groups], ops=ops)
    return got


async def one_round(net: Net, orders: int, lines: int, secured: bool) -> None:
    a, b = net.cores["A"], net.cores["B"]
    ops: list = []
    for i in range(orders):
        begin = Begin("Init", "T", "C", encryption=secured)
        bodies = [b'{"order": %d, "line": %d, "qty": 1}' % (i, n) for n in range(lines)]
        ops += [begin, Send(begin.handle, "Order", bodies)]
    a.apply(ops)
    await net.pump()
    assert take(b, "TQ", answer=True) == orders * lines
    await net.pump()
    assert take(a, "InitQ", answer=False) == orders * lines


async def measure(rounds: int, orders: int, lines: int, secured: bool = False) -> float:
    with tempfile.TemporaryDirectory(prefix="raybroker-hops-") as folder:
        net = Net(folder, secured)
        try:
            for _ in range(WARMUP):
                await one_round(net, orders, lines, secured)
            started = time.process_time()
            for _ in range(rounds):
                await one_round(net, orders, lines, secured)
            return (time.process_time() - started) / (rounds * orders)
        finally:
            for core in net.cores.values():
                core.store.close()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    orders = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    lines = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    secured = sys.argv[4:5] == ["secured"]
    collector.own_process()
    per_order = asyncio.run(measure(rounds, orders, lines, secured))
    print(
        f"{rounds} rounds of {orders} {'secured ' if secured else ''}orders of {lines} lines: "
        f"{per_order * 1e6:.0f} us of CPU per order, both brokers"
    )


if __name__ == "__main__":
    main()
