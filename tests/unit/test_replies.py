"""A lock-taking call runs once per (client, number) and its answer is kept for the call's other
arrivals (actors.service.replies): the rules alone, then a broker whose receive answer was sent over
a real socket and lost, asked again with the same number, and one whose answer to a receive under
a held lock could not be sent."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from actors.calls import frames
from actors.calls.envelope import NOTHING_RECEIVED, unpack_received
from actors.errors import InvalidArgument
from actors.service import channel as srv
from actors.service.replies import KEEP_S, Replies, took

TOOK = b"groups"  # stands for a receive's answer that took something


def run(coro):
    return asyncio.run(coro)


class Taker:
    """A call's run: counts its runs; waits for `release` when `slow`; returns `answer`."""

    def __init__(self, answer=TOOK, slow: bool = False) -> None:
        self.answer, self.slow, self.runs = answer, slow, 0
        self.release = asyncio.Event()

    async def __call__(self):
        self.runs += 1
        if self.slow:
            await self.release.wait()
        return self.answer


def test_later_arrivals_get_the_first_ones_answer_without_running_again():
    async def main():
        replies, take = Replies(), Taker(slow=True)
        first = asyncio.ensure_future(replies.once(("c", 3, 3), take))
        await asyncio.sleep(0)  # the first is running
        second = asyncio.ensure_future(replies.once(("c", 3, 3), take))  # waits for it
        take.release.set()
        answers = [await first, await second]
        answers.append(await replies.once(("c", 3, 3), take))  # after it ended: kept
        return answers, take.runs, replies.repeats, len(replies)

    assert run(main()) == ([TOOK, TOOK, TOOK], 1, 2, 1)


def test_what_took_something_is_told_from_what_took_nothing():
    assert took(TOOK) and took(("group-id", "lock-id"))
    assert took([(True, {"sent": 1}), (True, TOOK)])  # a batch whose receive took a group
    assert not took(NOTHING_RECEIVED) and not took(None)
    assert not took([(True, {"sent": 1}), (True, NOTHING_RECEIVED), (False, InvalidArgument("x"))])


def test_an_answer_that_took_nothing_is_not_kept():
    async def main():
        replies, take = Replies(), Taker(NOTHING_RECEIVED)
        await replies.once(("c", 0, 0), take)
        await replies.once(("c", 0, 0), take)
        return take.runs, len(replies)

    assert run(main()) == (2, 0)


def test_the_clients_floor_passing_a_number_forgets_its_answer_and_refuses_it_late():
    async def main():
        replies, take = Replies(), Taker()
        await replies.once(("c", 0, 0), take)
        await replies.once(("c", 1, 0), take)
        replies.passed("c", 1)  # the client has answer 0, not yet 1
        kept = len(replies)
        await replies.once(("c", 1, 1), take)  # still kept: not run again
        replies.passed("other", 5)  # another client's floor forgets nothing of this one's
        with pytest.raises(InvalidArgument, match="answered already"):
            await replies.once(("c", 0, 1), take)  # a late copy of call 0: nobody waits for it
        return kept, len(replies), take.runs

    assert run(main()) == (1, 1, 2)


def test_a_run_the_floor_passed_is_still_given_back_when_its_answer_cannot_be_sent():
    """A caller that stopped waiting moves its floor on; what the run then takes is its
    answer's only way back."""

    async def main():
        replies, take = Replies(), Taker(slow=True)
        running = asyncio.ensure_future(replies.once(("c", 0, 0), take))
        await asyncio.sleep(0)
        replies.passed("c", 1)  # the caller gave up on call 0
        take.release.set()
        await running
        return replies.lost(("c", 0, 0)), len(replies)

    assert run(main()) == (True, 0)


def test_a_lost_answer_is_given_back_only_when_no_other_arrival_has_it():
    async def main():
        replies, take = Replies(), Taker()
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


def test_a_cancelled_waiter_does_not_count_as_having_the_answer():
    async def main():
        replies, take = Replies(), Taker(slow=True)
        first = asyncio.ensure_future(replies.once(("c", 0, 0), take))
        await asyncio.sleep(0)
        waiter = asyncio.ensure_future(replies.once(("c", 0, 0), take))
        await asyncio.sleep(0)
        waiter.cancel()
        take.release.set()
        await first
        return replies.lost(("c", 0, 0))  # the first's write failed: nobody else has it

    assert run(main()) is True


def test_a_refused_first_arrival_refuses_the_waiting_ones():
    async def main():
        replies, release = Replies(), asyncio.Event()

        async def refused():
            await release.wait()
            raise InvalidArgument("no such queue")

        arrivals = [asyncio.ensure_future(replies.once(("c", 0, 0), refused)) for _ in range(3)]
        await asyncio.sleep(0)
        release.set()
        results = await asyncio.gather(*arrivals, return_exceptions=True)
        return [type(r).__name__ for r in results], len(replies)

    assert run(main()) == (["InvalidArgument"] * 3, 0)


def test_after_a_cancelled_first_run_the_waiting_arrivals_run_it_once_between_them():
    async def main():
        replies, take = Replies(), Taker(slow=True)
        slow = asyncio.ensure_future(replies.once(("c", 1, 1), asyncio.Event().wait))
        await asyncio.sleep(0)
        waiting = [asyncio.ensure_future(replies.once(("c", 1, 1), take)) for _ in range(3)]
        await asyncio.sleep(0)
        slow.cancel()
        for _ in range(3):
            await asyncio.sleep(0)  # the waiters wake; one runs, the others wait for it
        take.release.set()
        return await asyncio.gather(*waiting), take.runs

    assert run(main()) == ([TOOK] * 3, 1)


def test_kept_answers_go_keep_s_after_they_were_answered():
    now = [0.0]

    async def main():
        replies, take = Replies(clock=lambda: now[0]), Taker()
        await replies.once(("c", 0, 0), take)
        now[0] = KEEP_S / 2
        await replies.once(("d", 0, 0), take)
        now[0] = KEEP_S + 1
        await replies.once(("c", 0, 0), take)  # c's went: run again
        await replies.once(("d", 0, 0), take)  # d's is younger than KEEP_S: kept
        return take.runs

    assert run(main()) == 3


def test_the_oldest_kept_answers_go_past_the_byte_budget():
    async def main():
        replies, take = Replies(keep_bytes=2 * len(TOOK)), Taker()
        for seq in range(3):
            await replies.once(("c", seq, 0), take)
        before = take.runs
        for seq in (2, 1, 0):
            await replies.once(("c", seq, 0), take)
        return before, take.runs

    assert run(main()) == (3, 4)  # calls 1 and 2 kept; call 0, the oldest, ran again


@pytest.fixture
def broker(tmp_path):
    """A broker service with three one-message conversation groups on queue T."""
    from actors import Begin, Queue, Send, Service
    from actors.calls.envelope import pack_ops
    from actors.ids import new_request_id
    from actors.model.catalog import kind_of, to_record
    from actors.service.broker import BrokerService

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
        server = srv.ChannelServer(service.dispatch, "127.0.0.1", service.undelivered)
        host, port, ticket = await server.ticket(None)
        reader, writer = await asyncio.open_connection(host, port)
        order = ("client-1", 0, 0)
        args = ("T", 0.0, OPTIONS, OWNER, None, None)
        call = (1, order, "receive", pickle.dumps(args))
        writer.writelines([frames.LENGTH.pack(len(ticket)), ticket.encode(), *frames.frame(call)])
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


def test_an_unsent_answer_to_a_receive_under_a_held_lock_is_kept_for_the_retry(broker):
    """Such a receive moved its caller's lock on past what it read; giving back cannot undo
    that, so its answer waits for the call again rather than a second read past it."""

    async def main():
        service = await broker()
        group_id, lock_id = await service.get_conversation_group("T", 0.0, None, OWNER)
        order = ("client-2", 0, 0)
        args = ("T", 0.0, dict(OPTIONS, lock_id=lock_id), OWNER, None, None)
        blob = await service.dispatch(order, "receive", args)
        given = service.undelivered(order, "receive", args, blob)  # the channel could not send
        again = await service.dispatch(order, "receive", args)
        await service.close()
        return blob, given, again, group_id

    blob, given, again, group_id = run(main())
    [group] = unpack_received(blob)
    assert group.group_id == group_id and len(group.messages) == 1
    assert given == 0 and again == blob  # the same message, not a read past it
