"""Coalescing: a handle's concurrent calls go to the broker as batches, each caller answered with
its own result or error, in the order called; waiting receives share one wait per queue. The
broker here is a small in-memory stand-in with the calls the coalescer makes (no Ray)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from actors.client.coalesce import Coalescer, _Waiter
from actors.errors import InvalidArgument
from tests.polling import apoll


class Broker:
    """Answers batches in order; `apply` appends to a log, `receive` pops a queue; `wait` takes
    for the waiting receives it carries (each takes one, in order; one with options
    {"bad": True} fails)."""

    def __init__(self) -> None:
        self.batches: list[list] = []
        self.log: list = []
        self.queue: list[str] = []
        self.ready = asyncio.Event()
        self.waits = 0
        self.taken_in_waits: list[str] = []
        self.given_back: list = []
        self.waits_left: list[float] = []  # each take's wait, as the coalescer sent it

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

    async def wait(self, queue, timeout, takes):
        self.waits += 1
        if not self.queue:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), timeout)
        self.ready.clear()
        out = []
        for take in takes:
            assert take[0] == queue and take[4] is None  # (queue, wait left, ..., no settle, ...)
            self.waits_left.append(take[1])
            if take[2].get("bad"):
                out.append((False, InvalidArgument("no such queue")))
            elif self.queue:
                self.taken_in_waits.append(self.queue.pop(0))
                out.append((True, [self.taken_in_waits[-1]]))
            else:
                out.append((True, []))
        return out

    async def give_back(self, taken):
        self.given_back += taken

    def coalescer(self, **limits) -> Coalescer:
        return Coalescer(self.send, self.wait, self.give_back, **limits)

    def put(self, *items):
        self.queue += items
        self.ready.set()


def _receive_args(settle=None, options=None):
    return ("Q", 5.0, options or {}, None, settle, None)


def test_concurrent_calls_go_in_one_batch_each_answered_in_the_order_called():
    broker = Broker()

    async def main():
        c = broker.coalescer()
        return await asyncio.gather(*(c.call("apply", (i,)) for i in range(50)))

    answers = asyncio.run(main())
    assert answers == list(range(1, 51))
    assert broker.log == list(range(50))
    assert len(broker.batches) == 1


def test_a_caller_with_bad_input_gets_its_own_error_and_the_others_their_results():
    broker = Broker()

    async def main():
        c = broker.coalescer()
        calls = [c.call("apply", ("bad" if i == 3 else i,)) for i in range(6)]
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(main())
    assert isinstance(answers[3], InvalidArgument)
    assert [a for i, a in enumerate(answers) if i != 3] == [1, 2, 3, 4, 5]


def test_calls_made_while_batches_are_on_the_way_follow_in_later_batches_in_order():
    broker = Broker()

    async def main():
        c = broker.coalescer(max_inflight=1, max_batch=4)
        return await asyncio.gather(*(c.call("apply", (i,)) for i in range(10)))

    asyncio.run(main())
    assert [len(b) for b in broker.batches] == [4, 4, 2]
    assert broker.log == list(range(10))


def test_a_batch_that_fails_as_a_whole_fails_each_of_its_callers():
    async def down(batch):
        raise ConnectionError("broker gone")

    async def main():
        idle = Broker()
        c = Coalescer(down, idle.wait, idle.give_back)
        return await asyncio.gather(
            *(c.call("apply", (i,)) for i in range(3)), return_exceptions=True
        )

    assert all(isinstance(a, ConnectionError) for a in asyncio.run(main()))


def test_a_call_cancelled_before_its_batch_went_is_never_sent():
    broker = Broker()

    async def main():
        c = broker.coalescer()
        gone = asyncio.ensure_future(c.call("apply", ("cancelled",)))
        kept = asyncio.ensure_future(c.call("apply", ("kept",)))
        gone.cancel()
        await kept

    asyncio.run(main())
    assert broker.log == ["kept"]


class HeldBroker(Broker):
    """Holds each batch at the broker until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.arrived: list = []

    async def send(self, batch):
        self.arrived.append(batch)
        await self.release.wait()
        return await super().send(batch)


def test_what_a_receive_took_after_its_caller_left_mid_call_is_given_back():
    broker = HeldBroker()
    broker.put("m1")

    async def main():
        c = broker.coalescer()
        applying = asyncio.ensure_future(c.call("apply", (1,)))  # the receive joins its batch
        reader = _reader(c)
        await apoll(lambda: broker.arrived, "the receive to reach the broker")
        reader.cancel()  # its caller leaves while the receive is at the broker
        broker.release.set()
        await apoll(lambda: broker.given_back, "what it took to be given back")
        await applying
        return reader

    reader = asyncio.run(main())
    assert [m for m, _ in broker.arrived[0]] == ["apply", "receive"]
    assert reader.cancelled() and broker.given_back == ["m1"] and not broker.queue


def test_what_a_receive_under_its_callers_own_lock_read_is_never_given_back():
    """Its groups stay under the lock the caller holds, mid-call or while it waited."""
    broker = HeldBroker()
    broker.put("m1")

    async def main():
        c = broker.coalescer()
        reader = _reader(c, options={"lock_id": "L1"})
        await apoll(lambda: broker.arrived, "the receive to reach the broker")
        reader.cancel()  # its caller leaves while the receive is at the broker
        broker.release.set()
        await apoll(lambda: not broker.queue, "the broker to take for it")
        waiting = _reader(c, options={"lock_id": "L1"})  # finds nothing, waits
        await apoll(lambda: broker.waits, "the second receive to wait")
        waiting.cancel()
        broker.put("m2")
        await apoll(lambda: broker.taken_in_waits, "the broker to take for the waiting one")
        # a receive of another caller, not under a lock, after them: given back as ever
        waits = broker.waits
        other = _reader(c)
        await apoll(lambda: broker.waits > waits, "the third receive to wait")
        other.cancel()
        broker.put("m3")
        await apoll(lambda: broker.given_back, "what the third took to be given back")
        return reader, waiting

    reader, waiting = asyncio.run(main())
    assert reader.cancelled() and waiting.cancelled()
    assert broker.taken_in_waits == ["m2", "m3"] and broker.given_back == ["m3"]


def test_waiting_receives_share_one_wait_and_each_gets_a_message_as_it_comes():
    broker = Broker()

    async def main():
        c = broker.coalescer()
        readers = [_reader(c) for _ in range(5)]
        await apoll(lambda: broker.waits, "the readers to find nothing and wait")
        broker.put("m1", "m2", "m3", "m4", "m5")
        return await asyncio.wait_for(asyncio.gather(*readers), 5.0)

    got = asyncio.run(main())
    assert sorted(m for r in got for m in r) == ["m1", "m2", "m3", "m4", "m5"]
    assert broker.waits == 1  # one wait for the readers that began waiting together
    # taken by the broker for them as the messages came: no receive of theirs went after
    assert sorted(broker.taken_in_waits) == ["m1", "m2", "m3", "m4", "m5"]
    assert broker.batches == []  # an idle handle's waiting receives go straight to the wait


def test_a_waiting_receive_on_an_idle_handle_takes_what_is_there_in_one_call():
    broker = Broker()
    broker.put("m1")

    async def main():
        c = broker.coalescer()
        return await asyncio.wait_for(_reader(c), 5.0)

    assert asyncio.run(main()) == ["m1"]
    assert broker.waits == 1 and broker.batches == []


def test_a_waiting_receive_made_while_the_handle_has_calls_on_the_way_joins_a_batch():
    """Another call is on its way: the receive goes in the next batch (and waits only if that
    took nothing), so it shares a call instead of making one of its own."""
    broker = HeldBroker()
    broker.put("m1")

    async def main():
        c = broker.coalescer()
        applying = asyncio.ensure_future(c.call("apply", (1,)))
        await apoll(lambda: broker.arrived, "the apply to reach the broker")
        reader = _reader(c)
        broker.release.set()
        return await asyncio.wait_for(asyncio.gather(applying, reader), 5.0)

    assert asyncio.run(main()) == [1, ["m1"]]
    assert [[m for m, _ in b] for b in broker.batches] == [["apply"], ["receive"]]
    assert broker.waits == 0


def test_a_receive_that_begins_waiting_later_waits_in_a_call_of_its_own():
    broker = Broker()

    async def main():
        c = broker.coalescer()
        first = _reader(c)
        await apoll(lambda: broker.waits, "the first reader to wait")
        second = _reader(c)
        await apoll(lambda: broker.waits == 2, "the second reader to wait")
        broker.put("m1", "m2")
        return await asyncio.wait_for(asyncio.gather(first, second), 5.0)

    assert asyncio.run(main()) == [["m1"], ["m2"]] and broker.waits == 2
    assert broker.taken_in_waits == ["m1", "m2"]  # neither asked again
    assert broker.batches == []  # each went straight to a wait: the handle had nothing on the way


def test_a_waiting_receive_that_others_took_from_waits_on_in_the_next_call():
    broker = Broker()

    async def main():
        c = broker.coalescer()
        readers = [_reader(c) for _ in range(2)]
        await apoll(lambda: broker.waits, "the readers to wait")
        broker.put("m1")  # one message for two: the second reader goes again
        await apoll(lambda: broker.waits == 2, "the second reader to wait again")
        broker.put("m2")
        return await asyncio.wait_for(asyncio.gather(*readers), 5.0)

    assert asyncio.run(main()) == [["m1"], ["m2"]]
    assert broker.taken_in_waits == ["m1", "m2"]


def test_what_the_broker_took_for_a_receive_whose_caller_left_is_given_back():
    broker = Broker()

    async def main():
        c = broker.coalescer()
        reader = _reader(c)
        await apoll(lambda: broker.waits, "the reader to wait")
        reader.cancel()  # its caller leaves while its take is at the broker
        broker.put("m1")
        await apoll(lambda: broker.given_back, "the taken message to be given back")
        return reader

    reader = asyncio.run(main())
    assert reader.cancelled()
    assert broker.taken_in_waits == ["m1"] and broker.given_back == ["m1"]


def test_a_take_that_fails_at_the_broker_raises_in_its_own_receive_only():
    broker = Broker()

    async def main():
        c = broker.coalescer()
        readers = [_reader(c, options={"bad": True}), _reader(c)]
        await apoll(lambda: broker.waits, "the readers to wait")
        broker.put("m1")
        return await asyncio.wait_for(asyncio.gather(*readers, return_exceptions=True), 5.0)

    bad, good = asyncio.run(main())
    assert isinstance(bad, InvalidArgument) and good == ["m1"]
    assert broker.waits == 1  # they waited together


def test_a_short_wait_beside_a_long_one_ends_on_time():
    broker = Broker()

    async def main():
        c = broker.coalescer()
        long = _reader(c, wait=30.0)
        await apoll(lambda: broker.waits, "the long reader to wait")
        short = await asyncio.wait_for(c.receive(_receive_args(), 0.05, []), 5.0)
        long.cancel()
        return short

    assert asyncio.run(main()) == []


def test_a_receive_that_settles_is_answered_at_once_even_with_nothing_to_take():
    broker = Broker()

    async def main():
        c = broker.coalescer()
        return await asyncio.wait_for(c.receive(_receive_args(settle=("lock",)), 30.0, []), 5.0)

    assert asyncio.run(main()) == []
    assert broker.waits == 0


@pytest.mark.parametrize("wait", [0.0, 0.05])
def test_a_waiting_receive_returns_nothing_once_its_wait_is_up(wait):
    broker = Broker()

    async def main():
        c = broker.coalescer()
        return await asyncio.wait_for(c.receive(_receive_args(), wait, []), 5.0)

    assert asyncio.run(main()) == []


def test_a_take_whose_wait_has_just_run_out_asks_for_no_wait_not_a_negative_one():
    broker = Broker()

    async def main():
        watch = broker.coalescer()._watch("Q")
        future = asyncio.get_running_loop().create_future()
        await watch._call([_Waiter(time.monotonic() - 1.0, future, _receive_args(), _empty)])

    asyncio.run(main())
    assert broker.waits_left == [0.0]  # a negative wait would be refused as bad input


def _reader(c: Coalescer, wait: float = 5.0, options=None) -> asyncio.Future:
    """A receive that waits up to `wait` seconds, under way."""
    return asyncio.ensure_future(c.receive(_receive_args(options=options), wait, []))


def _empty(result) -> bool:
    return result == []
