"""Coalescing: a handle's concurrent calls go to the broker as batches, each caller answered with
its own result or error, in the order called; waiting receives share one wait per queue. The
broker here is a small in-memory stand-in with the two calls the coalescer makes (no Ray)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from actors.coalesce import Coalescer
from actors.errors import InvalidArgument
from tests.fakes import apoll


class Broker:
    """Answers batches in order; `apply` appends to a log, `receive` pops a queue."""

    def __init__(self) -> None:
        self.batches: list[list] = []
        self.log: list = []
        self.queue: list[str] = []
        self.ready = asyncio.Event()
        self.waits = 0

    async def send(self, batch):
        self.batches.append(batch)
        await asyncio.sleep(0)  # on the way
        out = []
        for method, args in batch:
            if method == "apply" and args[0] == "bad":
                out.append((False, InvalidArgument("bad input")))
            elif method == "apply":
                self.log.append(args[0])
                out.append((True, len(self.log)))
            else:  # receive: (queue, wait, options, owner, settle, reader)
                out.append((True, [self.queue.pop(0)] if self.queue else []))
        return out

    async def wait(self, queue, timeout):
        self.waits += 1
        if not self.queue:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), timeout)
        self.ready.clear()
        return len(self.queue)

    def put(self, *items):
        self.queue += items
        self.ready.set()


def _receive_args(settle=None):
    return ("Q", 5.0, {}, None, settle, None)


def test_concurrent_calls_go_in_one_batch_each_answered_in_the_order_called():
    broker = Broker()

    async def main():
        c = Coalescer(broker.send, broker.wait)
        return await asyncio.gather(*(c.call("apply", (i,)) for i in range(50)))

    answers = asyncio.run(main())
    assert answers == list(range(1, 51))
    assert broker.log == list(range(50))
    assert len(broker.batches) == 1


def test_a_caller_with_bad_input_gets_its_own_error_and_the_others_their_results():
    broker = Broker()

    async def main():
        c = Coalescer(broker.send, broker.wait)
        calls = [c.call("apply", ("bad" if i == 3 else i,)) for i in range(6)]
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(main())
    assert isinstance(answers[3], InvalidArgument)
    assert [a for i, a in enumerate(answers) if i != 3] == [1, 2, 3, 4, 5]


def test_calls_made_while_batches_are_on_the_way_follow_in_later_batches_in_order():
    broker = Broker()

    async def main():
        c = Coalescer(broker.send, broker.wait, max_inflight=1, max_batch=4)
        return await asyncio.gather(*(c.call("apply", (i,)) for i in range(10)))

    asyncio.run(main())
    assert [len(b) for b in broker.batches] == [4, 4, 2]
    assert broker.log == list(range(10))


def test_a_batch_that_fails_as_a_whole_fails_each_of_its_callers():
    async def down(batch):
        raise ConnectionError("broker gone")

    async def main():
        c = Coalescer(down, Broker().wait)
        return await asyncio.gather(
            *(c.call("apply", (i,)) for i in range(3)), return_exceptions=True
        )

    assert all(isinstance(a, ConnectionError) for a in asyncio.run(main()))


def test_a_call_cancelled_before_its_batch_went_is_never_sent():
    broker = Broker()

    async def main():
        c = Coalescer(broker.send, broker.wait)
        gone = asyncio.ensure_future(c.call("apply", ("cancelled",)))
        kept = asyncio.ensure_future(c.call("apply", ("kept",)))
        gone.cancel()
        await kept

    asyncio.run(main())
    assert broker.log == ["kept"]


def test_waiting_receives_share_one_wait_and_each_gets_a_message_as_it_comes():
    broker = Broker()

    async def main():
        c = Coalescer(broker.send, broker.wait)
        readers = [asyncio.ensure_future(c.receive(_receive_args(), 5.0, _empty)) for _ in range(5)]
        await apoll(lambda: broker.waits, "the readers to find nothing and wait")
        broker.put("m1", "m2", "m3", "m4", "m5")
        return await asyncio.wait_for(asyncio.gather(*readers), 5.0)

    got = asyncio.run(main())
    assert sorted(m for r in got for m in r) == ["m1", "m2", "m3", "m4", "m5"]
    assert broker.waits < 5  # one wait at a time for the queue, not one per reader


def test_a_receive_that_settles_is_answered_at_once_even_with_nothing_to_take():
    broker = Broker()

    async def main():
        c = Coalescer(broker.send, broker.wait)
        return await asyncio.wait_for(c.receive(_receive_args(settle=("lock",)), 30.0, _empty), 5.0)

    assert asyncio.run(main()) == []
    assert broker.waits == 0


@pytest.mark.parametrize("wait", [0.0, 0.05])
def test_a_waiting_receive_returns_nothing_once_its_wait_is_up(wait):
    broker = Broker()

    async def main():
        c = Coalescer(broker.send, broker.wait)
        return await asyncio.wait_for(c.receive(_receive_args(), wait, _empty), 5.0)

    assert asyncio.run(main()) == []


def _empty(result) -> bool:
    return result == []
