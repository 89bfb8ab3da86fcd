"""The broker's cost per message in one process (no Ray), through `BrokerService.calls` on a real
SQLite file, the client's packing included, in the shape of one `raybroker bench peers`
workload. Prints CPU microseconds per message.

- `many-clients` (the default): rounds of one coalesced batch each, 100 one-message sends and
  100 receive-and-commits of one-message groups.
- `paced`: rounds of one call of 100 sends (one message on each of 100 conversations), then
  receives of up to 32 groups by 4 consumers, each committing what it took in its last call.
- `new-dialogs` (the demo's shape): rounds of one call beginning 100 dialogs with 3 messages on
  each, then receives as in bulk.
- `bulk-one-conversation` and `bulk-spread`: rounds of one call sending 1,000 messages, on one
  conversation (the next one each round) or 10 on each of the 100, then receives of up to 16
  groups, each committing what the one before took, until all 1,000 are committed.
- `ingest-dialogs` and `ingest-digest-dialogs`: as `new-dialogs`, each dialog begun `if_absent`
  under an id an ingest makes (`spark_bridge.plan.dialog_id`) for keys 0, 1, 2, ... in the order
  a sender meets them: the ids of this release (in that order) or the digest ids of earlier
  releases (in none).

CPU time on a shared machine drifts by 2x from run to run; instruction counts do not. To count
them, run it under callgrind with two sizes and divide the difference by the messages between:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python scripts/verbs_cost.py 10
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python scripts/verbs_cost.py 40
    # instructions per message = (Collected at 40 - Collected at 10) / (30 * 100)
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

from actors import Begin, Queue, Send, Service, collector
from actors.calls.envelope import pack_ops, unpack_received
from actors.calls.ordering import Issuer
from actors.client.coalesce import holders_once
from actors.ids import new_request_id
from actors.model.catalog import kind_of, to_record
from actors.service.broker import BrokerService

CONVERSATIONS = 100  # messages per round
WARMUP = 20
OWNER = ("verbs-client", [None])
Round = Callable[[], Awaitable[None]]


def _options(max_groups: int, top: int | None) -> dict:
    return {"max_groups": max_groups, "top": top, "group_id": None, "handle": None, "lease_s": None}


def _settle(locks: list[str]) -> tuple | None:
    return (locks, [], pack_ops([]), {}, None) if locks else None  # recorded by its place


class Client:
    """A client of `service`: its calls go as one coalesced batch each, as a handle sends them."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self.issuer = Issuer()

    async def calls(self, batch: list) -> list:
        seq = self.issuer.issue()
        outcomes = await self.service.calls(self.issuer.order(seq), holders_once(batch))
        self.issuer.answered(seq)
        for ok, value in outcomes:
            if not ok:
                raise value
        return outcomes


def many_clients(client: Client, handles: list[str]) -> Round:
    options = _options(1, 1)
    held: list[list[str]] = [[] for _ in handles]  # each consumer's lock to commit next

    async def one_round() -> None:
        batch = [("apply", (pack_ops([Send(h, "DEFAULT", [bytes(100)])]), None)) for h in handles]
        for locks in held:
            batch.append(("receive", ("T", 0.0, options, OWNER, _settle(locks), None)))
        outcomes = await client.calls(batch)
        for i, (_, value) in enumerate(outcomes[len(handles) :]):
            held[i] = [g.lock_id for g in unpack_received(value)]

    return one_round


def paced(client: Client, handles: list[str], consumers: int = 4) -> Round:
    options = _options(32, None)
    held: list[list[str]] = [[] for _ in range(consumers)]

    async def one_round() -> None:
        ops = pack_ops([Send(h, "DEFAULT", [bytes(100)]) for h in handles])
        await client.calls([("apply", (ops, None))])
        got = 0
        while got < len(handles):
            for c in range(consumers):
                receive = ("receive", ("T", 0.0, options, OWNER, _settle(held[c]), None))
                [(_, value)] = await client.calls([receive])
                held[c] = [g.lock_id for g in unpack_received(value)]
                got += len(held[c])

    return one_round


async def _receive_all(client: Client, messages: int) -> None:
    """Receive from T, up to 16 groups a call, each call committing what the one before took,
    until `messages` are taken and nothing more comes."""
    options = _options(16, None)
    held: list[str] = []
    got = 0
    while True:
        receive = ("receive", ("T", 0.0, options, OWNER, _settle(held), None))
        [(_, value)] = await client.calls([receive])
        groups = unpack_received(value)
        held = [g.lock_id for g in groups]
        got += sum(len(g) for g in groups)
        if not groups and got >= messages:
            return


def bulk(client: Client, handles: list[str], spread: bool) -> Round:
    turn = itertools.count()

    async def one_round() -> None:
        if spread:
            ops = [Send(h, "DEFAULT", [bytes(100)] * BULK_PER) for h in handles]
        else:
            h = handles[next(turn) % len(handles)]
            ops = [Send(h, "DEFAULT", [bytes(100)] * (BULK_PER * len(handles)))]
        await client.calls([("apply", (pack_ops(ops), None))])
        await _receive_all(client, BULK_PER * len(handles))

    return one_round


def new_dialogs(client: Client, handles: list[str], lines: int = 3) -> Round:
    """The demo's shape, one dialog per order: a call begins 100 dialogs and sends `lines`
    messages on each, then receives commit them as in bulk."""

    async def one_round() -> None:
        ops: list = []
        for _ in handles:
            begin = Begin("Init", "T")
            ops += [begin, Send(begin.handle, "DEFAULT", [bytes(100)] * lines)]
        await client.calls([("apply", (pack_ops(ops), None))])
        await _receive_all(client, lines * len(handles))

    return one_round


def ingest_dialogs(kind: int) -> Callable[[Client, list[str]], Round]:
    """`new_dialogs` with an ingest's dialog ids of `kind`, its keys (whole numbers) met as an
    ingest's sender meets them: in order."""
    from spark_bridge.plan import dialog_id

    def shape(client: Client, handles: list[str]) -> Round:
        keys = iter(map(str, range(2000 * len(handles))))  # enough for 2,000 rounds

        async def one_round() -> None:
            ops: list = []
            for key in itertools.islice(keys, len(handles)):
                h = dialog_id("ingest", key, kind)
                begin = Begin("Init", "T", handle=h, conversation_id=h, if_absent=True)
                ops += [begin, Send(h, "DEFAULT", [bytes(100)] * 3, at=0)]
            await client.calls([("apply", (pack_ops(ops), None))])
            await _receive_all(client, 3 * len(handles))

        return one_round

    return shape


BULK_PER = 10  # bulk: messages per conversation per round (spread), 1,000 a round in all
SHAPES: dict[str, Callable[[Client, list[str]], Round]] = {
    "many-clients": many_clients,
    "paced": paced,
    "bulk-one-conversation": lambda client, handles: bulk(client, handles, spread=False),
    "bulk-spread": lambda client, handles: bulk(client, handles, spread=True),
    "new-dialogs": new_dialogs,
    "ingest-dialogs": ingest_dialogs(3),
    "ingest-digest-dialogs": ingest_dialogs(1),
}
PER_ROUND = dict.fromkeys(("bulk-one-conversation", "bulk-spread"), BULK_PER * CONVERSATIONS)
for name in ("new-dialogs", "ingest-dialogs", "ingest-digest-dialogs"):
    PER_ROUND[name] = 3 * CONVERSATIONS


async def measure(rounds: int, shape: str = "many-clients") -> float:
    """CPU seconds per message over `rounds` rounds, after a warm-up."""
    with tempfile.TemporaryDirectory(prefix="raybroker-verbs-") as folder:  # 40 MB a run
        return await _measure(rounds, shape, os.path.join(folder, "verbs.sqlite"))


async def _measure(rounds: int, shape: str, path: str) -> float:
    service = BrokerService("verbs", path)
    try:
        for d in (Queue("I"), Service("Init", "I", []), Queue("T"), Service("T", "T", ["DEFAULT"])):
            await service.define(kind_of(d), to_record(d), new_request_id())
        begins = pack_ops([Begin("Init", "T") for _ in range(CONVERSATIONS)])
        handles = (await service.apply(begins, new_request_id()))["handles"]
        one_round = SHAPES[shape](Client(service), handles)
        for _ in range(WARMUP):
            await one_round()
        started = time.process_time()
        for _ in range(rounds):
            await one_round()
        return (time.process_time() - started) / (rounds * PER_ROUND.get(shape, CONVERSATIONS))
    finally:
        await service.close()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    shape = sys.argv[2] if len(sys.argv) > 2 else "many-clients"
    if shape not in SHAPES:
        sys.exit(f"unknown shape {shape!r}; use one of {', '.join(SHAPES)}")
    collector.own_process()  # as the broker actor does (actors.remote.broker)
    per_message = asyncio.run(measure(rounds, shape))
    print(f"{shape}, {rounds} rounds of {PER_ROUND.get(shape, CONVERSATIONS)} messages: ", end="")
    print(f"{per_message * 1e6:.1f} us of CPU per message")


if __name__ == "__main__":
    main()
