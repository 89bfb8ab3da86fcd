"""The direct channel (actors.channel) on real loopback sockets, with a stand-in broker: calls
answered by id, errors raised as themselves, tickets required, the lock holder's handle carried
by reference, and a broken connection failing its calls with ChannelBroken."""

from __future__ import annotations

import asyncio
import socket

import pytest

from actors import channel as ch
from actors.errors import InvalidArgument
from tests.polling import apoll


class Token:
    """Stands for a lock holder's Ray object (the channel only compares it by identity)."""


class RayThing:
    """Stands for another Ray object, which must not travel over the channel."""


RayThing.__module__ = "ray.fake"


class Broker:
    """Answers `calls` with its arguments (and the order), `slow` after `release` is set, and
    raises for `bad`."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []
        self.release = asyncio.Event()

    async def dispatch(self, order, method, args):
        self.seen.append((order, method, args))
        if method == "bad":
            raise InvalidArgument(f"bad call {args!r}")
        if method == "slow":
            await self.release.wait()
        if method == "unpicklable":
            return lambda: None
        return (method, args)


async def _server(broker: Broker) -> ch.ChannelServer:
    return ch.ChannelServer(broker.dispatch, "127.0.0.1")


async def _channel(server: ch.ChannelServer, handle=None, token=None) -> ch.Channel:
    async def opener():
        return await server.ticket(handle)

    return await ch.Channel.open(opener, token)


def test_concurrent_calls_are_each_answered_with_their_own_result_or_error():
    async def main():
        broker = Broker()
        server = await _server(broker)
        channel = await _channel(server)
        slow = channel.send(("c", 0, 0), "slow", ())
        calls = [channel.send(("c", i, 0), "bad" if i == 3 else "apply", (i,)) for i in range(1, 6)]
        answers = await asyncio.gather(*calls, return_exceptions=True)
        assert not slow.done()  # the later calls were answered while it still ran
        broker.release.set()
        assert await slow == ("slow", ())
        channel.close()
        server.close()
        return broker, answers

    broker, answers = asyncio.run(main())
    assert isinstance(answers[2], InvalidArgument) and "bad call (3,)" in str(answers[2])
    assert [a for i, a in enumerate(answers) if i != 2] == [("apply", (i,)) for i in (1, 2, 4, 5)]
    assert [order for order, _, _ in broker.seen] == [("c", i, 0) for i in range(6)]


def test_the_lock_holder_token_travels_by_reference_and_arrives_as_the_tickets_handle():
    async def main():
        broker = Broker()
        server = await _server(broker)
        token = Token()
        channel = await _channel(server, handle="the holder's handle", token=token)
        answer = await channel.send(("c", 0, 0), "receive", ("Q", ("holder-1", [token])))
        with pytest.raises(ch.ChannelBroken, match="cannot travel"):
            channel.send(("c", 1, 0), "receive", ("Q", ("holder-2", [RayThing()])))
        channel.close()
        server.close()
        return answer

    assert asyncio.run(main()) == ("receive", ("Q", ("holder-1", ["the holder's handle"])))


def test_a_connection_without_a_valid_ticket_is_closed_and_a_ticket_serves_once():
    async def main():
        broker = Broker()
        server = await _server(broker)
        host, port, ticket = await server.ticket(None)

        async def forged():
            return host, port, "0" * 32

        async def reused():
            return host, port, ticket

        first = await ch.Channel.open(reused, None)
        assert await first.send(("c", 0, 0), "apply", (1,)) == ("apply", (1,))
        outcomes = []
        for opener in (forged, reused):
            other = await ch.Channel.open(opener, None)
            with pytest.raises(ch.ChannelBroken):
                await other.send(("d", 0, 0), "apply", (2,))
            outcomes.append(other.broken)
        first.close()
        server.close()
        return broker, outcomes

    broker, outcomes = asyncio.run(main())
    assert outcomes == [True, True]
    assert [args for _, _, args in broker.seen] == [(1,)]  # nothing ran for the refused ones


def test_calls_on_a_connection_that_ends_fail_with_channel_broken_and_later_ones_at_once():
    async def main():
        broker = Broker()
        server = await _server(broker)
        channel = await _channel(server)
        pending = channel.send(("c", 0, 0), "slow", ())
        await apoll(lambda: broker.seen, "the call at the broker")
        # the broker's end goes (as when its process dies): its socket closes under the call
        channel.transport.get_extra_info("socket").shutdown(socket.SHUT_RDWR)
        with pytest.raises(ch.ChannelBroken, match="ended"):
            await pending
        with pytest.raises(ch.ChannelBroken, match="closed"):
            channel.send(("c", 1, 0), "apply", ())
        broker.release.set()
        server.close()

    asyncio.run(main())


def test_an_answer_pickle_cannot_carry_is_an_error_for_its_caller_alone():
    async def main():
        broker = Broker()
        server = await _server(broker)
        channel = await _channel(server)
        with pytest.raises(RuntimeError, match="unpicklable answer"):
            await channel.send(("c", 0, 0), "unpicklable", ())
        answer = await channel.send(("c", 1, 0), "apply", (7,))
        channel.close()
        server.close()
        return answer

    assert asyncio.run(main()) == ("apply", (7,))


def test_a_slot_opens_in_the_background_and_waits_before_trying_again_after_a_failure(
    monkeypatch,
):
    async def main():
        broker = Broker()
        server = await _server(broker)
        opened = []

        async def opener():
            opened.append(1)
            return await server.ticket(None)

        slot = ch.ChannelSlot(opener, None)
        assert slot.get() is None  # not open yet: the caller goes another way meanwhile
        channel = await apoll(slot.get, "the channel open")
        assert slot.get() is channel and len(opened) == 1

        async def refused():
            opened.append(2)
            raise ConnectionRefusedError("no broker there")

        failing = ch.ChannelSlot(refused, None)
        assert failing.get() is None
        await apoll(lambda: 2 in opened and failing._opening is None, "the failed open")
        assert failing.get() is None and opened.count(2) == 1  # not tried again yet
        monkeypatch.setattr(ch.time, "monotonic", lambda: failing._next_try + 1)
        assert failing.get() is None
        await apoll(lambda: opened.count(2) == 2, "a second try after RETRY_S")
        slot.close()
        server.close()

    asyncio.run(main())
