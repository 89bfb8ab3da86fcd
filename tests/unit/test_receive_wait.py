"""A receive that waits: a message that lands after the receive's first take (which runs inside a
group commit) and before its wait begins still wakes it at once. Before, that message woke nobody
and the receive slept its whole wait (10 s on a request-reply between two brokers, once the
deliveries came over a direct channel, fast enough to land in that gap). A real broker service on
a real SQLite file, no Ray."""

from __future__ import annotations

import asyncio

from actors import Begin, Queue, Send, Service
from actors.calls.envelope import pack_ops, unpack_received
from actors.ids import new_request_id
from actors.model.catalog import kind_of, to_record
from actors.service.broker import BrokerService

WAIT_S = 30.0  # what the receive would sleep through
WITHIN_S = 10.0  # the test fails (rather than waits out WAIT_S) past this


class LandsAfterTheTake(BrokerService):
    """Commits `late` (straight through the core, as an arrival does) in the loop step right
    after the receive's first take, before the receive can go on to wait."""

    late: list = []

    def _take(self, *args, **kwargs):
        taken = super()._take(*args, **kwargs)
        if self.late:
            ops, self.late = self.late, []
            asyncio.get_running_loop().call_soon(self.core.apply, ops)
        return taken


def test_a_message_landing_between_a_receives_take_and_its_wait_wakes_it(tmp_path):
    async def main() -> list:
        service = LandsAfterTheTake("waits", str(tmp_path / "b.sqlite"))
        try:
            for d in (Queue("I"), Service("Init", "I"), Queue("T"), Service("T", "T", ["DEFAULT"])):
                await service.define(kind_of(d), to_record(d), new_request_id())
            begin = Begin("Init", "T")
            await service.apply(pack_ops([begin]), new_request_id())
            service.late = [Send(begin.handle, "DEFAULT", b"late")]
            receive = service.receive("T", WAIT_S, {"max_groups": 1})
            got = await asyncio.wait_for(receive, WITHIN_S)
            assert not service.late  # it did land after the first take
            return unpack_received(got)
        finally:
            await service.close()

    [group] = asyncio.run(main())
    assert [m.body for m in group.messages] == [b"late"]
