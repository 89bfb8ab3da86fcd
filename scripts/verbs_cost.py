"""The broker's cost per message for many small clients, in one process (no Ray): rounds of one
coalesced batch each, 100 one-message sends and 100 receive-and-commits of one-message groups,
through `BrokerService.calls` on a real SQLite file, as the `many-clients` workload of
`raybroker bench peers` sends them (the client's packing included). Prints CPU microseconds per
message.

CPU time on a shared machine drifts by 2x from run to run; instruction counts do not. To count
them, run it under callgrind with two sizes and divide the difference by the messages between:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python scripts/verbs_cost.py 10
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python scripts/verbs_cost.py 60
    # instructions per message = (Collected at 60 - Collected at 10) / (50 * 100)
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time

from actors import Begin, Queue, Send, Service
from actors.catalog import kind_of, to_record
from actors.coalesce import holders_once
from actors.envelope import pack_ops, unpack_received
from actors.ordering import Issuer
from actors.service import BrokerService
from actors.verbs import new_request_id

CLIENTS = 100
WARMUP = 20
OPTIONS = {"max_groups": 1, "top": 1, "group_id": None, "handle": None, "lease_s": None}


async def measure(rounds: int) -> float:
    """CPU seconds per message over `rounds` batches, after a warm-up."""
    folder = tempfile.mkdtemp(prefix="raybroker-verbs-")
    service = BrokerService("verbs", os.path.join(folder, "verbs.sqlite"))
    try:
        for d in (Queue("I"), Service("Init", "I", []), Queue("T"), Service("T", "T", ["DEFAULT"])):
            await service.define(kind_of(d), to_record(d), new_request_id())
        begins = pack_ops([Begin("Init", "T") for _ in range(CLIENTS)])
        handles = (await service.apply(begins, new_request_id()))["handles"]
        issuer, owner = Issuer(), ("verbs-client", [None])
        held: list[str | None] = [None] * CLIENTS  # each consumer's lock to commit next

        async def one_round() -> None:
            batch = [
                ("apply", (pack_ops([Send(h, "DEFAULT", [bytes(100)])]), new_request_id()))
                for h in handles
            ]
            for lock in held:
                settle = ([lock], [], pack_ops([]), {}, new_request_id()) if lock else None
                batch.append(("receive", ("T", 0.0, OPTIONS, owner, settle, None)))
            seq = issuer.issue()
            outcomes = await service.calls(issuer.order(seq), holders_once(batch))
            issuer.answered(seq)
            for i, (ok, value) in enumerate(outcomes[CLIENTS:]):
                if not ok:
                    raise value
                groups = unpack_received(value)
                held[i] = groups[0].lock_id if groups else None

        for _ in range(WARMUP):
            await one_round()
        started = time.process_time()
        for _ in range(rounds):
            await one_round()
        return (time.process_time() - started) / (rounds * CLIENTS)
    finally:
        await service.close()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    per_message = asyncio.run(measure(rounds))
    print(
        f"{rounds} rounds of {CLIENTS} sends + {CLIENTS} receive-and-commits: "
        f"{per_message * 1e6:.1f} us of CPU per message"
    )


if __name__ == "__main__":
    main()
