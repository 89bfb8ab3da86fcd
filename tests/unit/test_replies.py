"""A lock-taking call runs once per (client, number) and its answer is kept for the call's other
arrivals (actors.replies): the rules alone, then a broker whose receive answer was sent over a
real socket and lost, asked again with the same number."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from actors import channel as ch
from actors.envelope import NOTHING_RECEIVED, unpack_received
from actors.errors import InvalidArgument
from actors.replies import KEEP_S, Replies

TOOK = b"groups"  # stands for a receive's answer that took something


def run(coro):
    return asyncio.run(coro)


def test_a_second_arrival_gets_the_first_ones_answer_without_running_again():
    async def main():
        replies, ran = Replies(), []
        release = asyncio.Event()

        async def take():
            ran.append(1)
            await release.wait()
            return TOOK

        first = asyncio.ensure_future(replies.once(("c", 3, 3), take))
        await asyncio.sleep(0)  # the first is running
        second = asyncio.ensure_future(replies.once(("c", 3, 3), take))
        release.set()
        third = await replies.once(("c", 3, 3), take)  # after the first ended
        return await first, await second, third, ran, replies.repeats, len(replies)

    assert run(main()) == (TOOK, TOOK, TOOK, [1], 2, 1)


def test_an_answer_that_took_nothing_is_not_kept():
    async def main():
        replies, ran = Replies(), []

        async def take():
            ran.append(1)
            return NOTHING_RECEIVED

        await replies.once(("c", 0, 0), take)
        await replies.once(("c", 0, 0), take)
        return len(ran), len(replies)

    assert run(main()) == (2, 0)


def test_the_clients_floor_passing_a_number_forgets_its_answer():
    async def main():
        replies, ran = Replies(), []

        async def take():
            ran.append(1)
            return TOOK

        await replies.once(("c", 0, 0), take)
        await replies.once(("c", 1, 0), take)
        replies.passed("c", 1)  # the client has answer 0, not yet 1
        kept = len(replies)
        await replies.once(("c", 1, 1), take)  # still kept: not run again
        replies.passed("other", 5)  # another client's floor forgets nothing of this one's
        return kept, len(replies), len(ran)

    assert run(main()) == (1, 1, 2)


def test_a_lost_answer_is_given_back_only_when_no_other_arrival_has_it():
    async def main():
        replies = Replies()

        async def take():
            return TOOK

        await replies.once(("c", 0, 0), take)
        alone = replies.lost(("c", 0, 0))  # nobody else has it: give back, forget
        forgotten = len(replies)
        await replies.once(("c", 1, 1), take)
        await replies.once(("c", 1, 1), take)  # a retry got the answer
        shared = replies.lost(("c", 1, 1))  # the first arrival's write failed: keep the locks
        replies.passed("c", 2)
        passed = replies.lost(("c", 1, 2))  # the floor says the client has it
        unknown = replies.lost(None)  # not a call of this protocol: nothing kept for it
        return alone, forgotten, shared, passed, unknown

    assert run(main()) == (True, 0, False, False, True)


def test_a_refused_first_arrival_refuses_the_waiting_one_and_a_cancelled_one_lets_it_run():
    async def main():
        replies, ran = Replies(), []
        release = asyncio.Event()

        async def refused():
            await release.wait()
            raise InvalidArgument("no such queue")

        async def take():
            ran.append(1)
            return TOOK

        first = asyncio.ensure_future(replies.once(("c", 0, 0), refused))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(replies.once(("c", 0, 0), take))
        await asyncio.sleep(0)
        release.set()
        results = await asyncio.gather(first, second, return_exceptions=True)

        slow = asyncio.ensure_future(replies.once(("c", 1, 1), asyncio.Event().wait))
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(replies.once(("c", 1, 1), take))
        await asyncio.sleep(0)
        slow.cancel()
        return [type(r).__name__ for r in results], await waiting, ran

    assert run(main()) == (["InvalidArgument", "InvalidArgument"], TOOK, [1])


def test_kept_answers_go_after_keep_s():
    now = [0.0]

    async def main():
        replies = Replies(clock=lambda: now[0])

        async def take():
            return TOOK

        await replies.once(("c", 0, 0), take)
        now[0] = KEEP_S / 2
        await replies.once(("d", 0, 0), take)
        before = len(replies)
        now[0] = KEEP_S + 1
        await replies.once(("e", 0, 0), take)  # a call sweeps
        return before, len(replies)

    assert run(main()) == (2, 2)  # c's went; d's is younger than KEEP_S; e's is new


@pytest.fixture
def broker(tmp_path):
    """A broker service with three one-message conversation groups on queue T."""
    from actors import Begin, Queue, Send, Service
    from actors.catalog import kind_of, to_record
    from actors.envelope import pack_ops
    from actors.service import BrokerService
    from actors.verbs import new_request_id

    async def make():
        service = BrokerService("b", str(tmp_path / "b.sqlite"))
        for d in (Queue("T"), Service("S", "T", ["DEFAULT"])):
            await service.define(kind_of(d), to_record(d), new_request_id())
        begins = pack_ops([Begin("S", "S") for _ in range(3)])
        handles = (await service.apply(begins, new_request_id()))["handles"]
        sends = pack_ops([Send(h, "DEFAULT", [h.encode()]) for h in handles])
        await service.apply(sends, new_request_id())
        return service

    return make


OPTIONS = {"max_groups": 1, "top": None, "group_id": None, "handle": None, "lease_s": None}
OWNER = ("holder-1", [None])


def test_a_receive_whose_answer_was_lost_on_the_wire_gets_it_again(broker):
    """The broker sends a receive's answer over a real socket; the client's end closes before
    the client used it. The call again with its number (as through Ray) gets the same group and
    lock, and no other group is locked."""

    async def main():
        service = await broker()
        server = ch.ChannelServer(service.dispatch, "127.0.0.1", service.undelivered)
        host, port, ticket = await server.ticket(None)
        reader, writer = await asyncio.open_connection(host, port)
        order = ("client-1", 0, 0)
        args = ("T", 0.0, OPTIONS, OWNER, None, None)
        call = (1, order, "receive", pickle.dumps(args))
        writer.write(ch._LENGTH.pack(len(ticket)) + ticket.encode() + ch._frame(call))
        head = await asyncio.wait_for(reader.readexactly(4), 5)  # the answer is on the wire
        await reader.readexactly(int.from_bytes(head, "little"))
        writer.close()  # ... and never reaches the caller
        again = unpack_received(await service.call(order, "receive", *args))
        others = [unpack_received(await service.receive("T", 0.0, OPTIONS, OWNER))]
        others.append(unpack_received(await service.receive("T", 0.0, OPTIONS, OWNER)))
        rest = unpack_received(await service.receive("T", 0.0, OPTIONS, OWNER))
        server.close()
        await service.close()
        return again, others, rest, service.replies.repeats

    again, others, rest, repeats = run(main())
    assert repeats == 1
    [group] = again
    assert len(group.messages) == 1
    taken = {group.group_id} | {g.group_id for [g] in others}
    assert len(taken) == 3  # the other two groups were free; the first stayed with its caller
    assert rest == []  # and nothing was left over: no group locked twice, none lost
