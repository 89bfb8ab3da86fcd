"""The direct channel (actors.client.channel) on real loopback sockets, with a stand-in broker:
calls answered by id, errors raised as themselves, tickets required, the lock holder's handle
carried by reference, and a broken connection failing its calls with ChannelBroken."""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import struct
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.calls import frames
from actors.client import channel as ch
from actors.errors import InvalidArgument
from actors.service import channel as srv
from tests.polling import apoll, wait_until
from tests.ports import free_port


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


async def _server(broker: Broker) -> srv.ChannelServer:
    return srv.ChannelServer(broker.dispatch, "127.0.0.1")


async def _channel(server: srv.ChannelServer, handle=None, token=None) -> ch.Channel:
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
        for opener in (forged, reused):
            other = await ch.Channel.open(opener, None)
            with pytest.raises(ch.ChannelBroken):
                await other.send(("d", 0, 0), "apply", (2,))
        first.close()
        server.close()
        return broker

    broker = asyncio.run(main())
    assert [args for _, _, args in broker.seen] == [(1,)]  # nothing ran for the refused ones


def test_calls_on_a_connection_that_ends_fail_with_channel_broken_and_later_ones_at_once():
    async def main():
        broker = Broker()
        server = await _server(broker)
        channel = await _channel(server)
        pending = channel.send(("c", 0, 0), "slow", ())
        await apoll(lambda: broker.seen, "the call at the broker")
        # the connection ends under the call (as when the broker's process dies)
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
        with pytest.raises(RuntimeError, match="answer to unpicklable cannot be sent"):
            await channel.send(("c", 0, 0), "unpicklable", ())
        answer = await channel.send(("c", 1, 0), "apply", (7,))
        channel.close()
        server.close()
        return answer

    assert asyncio.run(main()) == ("apply", (7,))


def test_a_slot_opens_in_the_background_and_waits_retry_s_after_a_failed_open(monkeypatch):
    async def main():
        broker = Broker()
        server = await _server(broker)
        opened = []

        async def opener():
            opened.append("ok")
            return await server.ticket(None)

        slot = ch.ChannelSlot(opener, None)
        assert slot.get() is None  # not open yet: the caller goes another way meanwhile
        channel = await apoll(slot.get, "the channel open")
        assert slot.get() is channel and opened == ["ok"]

        async def refused():
            opened.append("refused")
            raise ConnectionRefusedError("no broker there")

        waiting = ch.ChannelSlot(refused, None)
        assert waiting.get() is None
        await apoll(lambda: opened.count("refused") == 1 and waiting.opening is None, "a try")
        assert waiting.get() is None and waiting.opening is None  # not again within RETRY_S
        monkeypatch.setattr(ch, "RETRY_S", 0.0)
        eager = ch.ChannelSlot(refused, None)
        assert eager.get() is None
        await apoll(lambda: opened.count("refused") == 2 and eager.opening is None, "a try")
        assert eager.get() is None
        await apoll(lambda: opened.count("refused") == 3, "a second try, RETRY_S being 0")
        slot.close()
        server.close()

    asyncio.run(main())


def _explode():
    raise ValueError("only the client has this")


class OnlyHere:
    """Pickles fine; cannot be unpickled (as a class defined in the client's __main__)."""

    def __reduce__(self):
        return _explode, ()


def test_a_call_the_broker_cannot_read_fails_alone_and_did_not_run():
    async def main():
        broker = Broker()
        server = await _server(broker)
        channel = await _channel(server)
        with pytest.raises(ch.ChannelBroken, match="could not read the call"):
            await channel.send(("c", 0, 0), "apply", (OnlyHere(),))
        answer = await channel.send(("c", 1, 0), "apply", (2,))  # the connection goes on
        channel.close()
        server.close()
        return broker, answer

    broker, answer = asyncio.run(main())
    assert answer == ("apply", (2,))
    assert [args for _, _, args in broker.seen] == [(2,)]


def test_a_call_whose_answer_cannot_be_sent_is_handed_to_undelivered():
    async def main():
        broker = Broker()
        lost = []
        server = srv.ChannelServer(broker.dispatch, "127.0.0.1", lambda *a: lost.append(a))
        channel = await _channel(server)
        pending = channel.send(("c", 0, 0), "slow", ("took",))
        await apoll(lambda: broker.seen, "the call at the broker")
        channel.close()  # the client's end goes while the broker still runs the call
        await apoll(lambda: server.connections == 0, "the broker to see the connection end")
        broker.release.set()
        await apoll(lambda: lost, "the undelivered answer")
        server.close()
        with pytest.raises(ch.ChannelBroken):
            await pending
        return lost

    assert asyncio.run(main()) == [(("c", 0, 0), "slow", ("took",), ("slow", ("took",)))]


class OpenTransport:
    def is_closing(self) -> bool:
        return False


class Collected(frames.Framed):
    """Frames as a connection reads them, without a connection."""

    def __init__(self) -> None:
        super().__init__()
        self.transport = OpenTransport()
        self.frames: list[bytes] = []

    def frame(self, data: memoryview) -> None:
        self.frames.append(bytes(data))  # the view is the connection's buffer: copied to keep


def _feed(framed: frames.Framed, stream: bytes, cuts: list[int]) -> None:
    """Hand `stream` to `framed` as asyncio's socket reads would: into its own buffer, in reads
    of at most the sizes in `cuts` (then what is left)."""
    at = 0
    sizes = iter(cuts)
    while at < len(stream):
        room = framed.get_buffer(-1)
        n = min(len(room), next(sizes, len(stream)), len(stream) - at)
        room[:n] = stream[at : at + n]
        room.release()
        framed.buffer_updated(n)
        at += n


@settings(max_examples=150, deadline=None)
@given(
    bodies=st.lists(
        st.one_of(st.binary(max_size=300), st.integers(0, 3 * frames.READ_BYTES).map(bytes)),
        max_size=12,
    ),
    cuts=st.lists(st.integers(1, 2 * frames.READ_BYTES), max_size=40),
)
def test_frames_come_out_whole_and_in_order_however_the_stream_is_cut(bodies, cuts):
    framed = Collected()
    stream = b"".join(struct.pack("<I", len(b)) + b for b in bodies)
    _feed(framed, stream, cuts)
    assert framed.frames == bodies
    assert framed._start == framed._end == 0  # nothing left over, and a large frame's room
    assert len(framed._buf) <= frames.KEEP_BYTES  # is not kept once it is read


def test_a_frame_is_its_length_and_pickle_in_pieces_with_a_large_payload_not_copied():
    blob = bytes(range(256)) * 1024  # 256 KiB: a call's own pickle, as a large call carries it
    obj = (7, ("c", 1, 0), "apply", blob)
    pieces = frames.frame(obj)
    data = b"".join(pieces[1:])
    assert pieces[0] == struct.pack("<I", len(data)) and pickle.loads(data) == obj
    assert any(p is blob for p in pieces)  # handed on as it is
    stream = b"".join(pieces) + b"".join(frames.frame((8, None, "view", b"small")))
    framed = Collected()
    _feed(framed, stream, [1000, 70_000])
    assert [pickle.loads(f) for f in framed.frames] == [obj, (8, None, "view", b"small")]


def test_large_and_many_small_calls_travel_on_one_connection():
    async def main():
        server = await _server(Broker())
        channel = await _channel(server)
        big = bytes(range(256)) * (3 * frames.READ_BYTES // 256 + 7)  # several buffers' worth
        args = [(big if i % 50 == 7 else i,) for i in range(400)]
        answers = await asyncio.gather(
            *(channel.send(("c", i, 0), "apply", a) for i, a in enumerate(args))
        )
        channel.close()
        server.close()
        return args, answers

    args, answers = asyncio.run(main())
    assert answers == [("apply", a) for a in args]


def test_before_its_ticket_a_connection_may_not_send_a_large_frame(monkeypatch):
    monkeypatch.setattr(srv, "CONNECT_S", 60.0)  # so only the frame's size can close it soon

    async def main():
        server = await _server(Broker())
        host, port, _ticket = await server.ticket(None)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(struct.pack("<I", 1 << 20) + b"x" * 1000)  # claims a megabyte
        got = await _closed(reader)
        writer.close()
        server.close()
        return got, server.connections

    assert asyncio.run(main()) == (b"", 0)


def test_concurrent_first_tickets_share_one_listener():
    async def main():
        server = await _server(Broker())
        tickets = await asyncio.gather(*(server.ticket(None) for _ in range(5)))
        server.close()
        return tickets

    tickets = asyncio.run(main())
    assert len({(host, port) for host, port, _ in tickets}) == 1
    assert len({t for _, _, t in tickets}) == 5


def test_a_loops_channels_are_shared_by_broker_and_closed_when_the_loop_ends():
    channels = ch.Channels()
    server_loop = asyncio.new_event_loop()  # the broker, on a thread of its own
    threading.Thread(target=server_loop.run_forever, daemon=True).start()
    server = asyncio.run_coroutine_threadsafe(_server(Broker()), server_loop).result(5)

    async def opener():
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(server.ticket(None), server_loop)
        )

    async def main():
        one = channels.slot("broker-a", None, opener)
        assert channels.slot("broker-a", None, opener) is one  # a second handle: the same
        assert channels.slot("broker-b", None, opener) is not one
        channel = await apoll(one.get, "the channel open")
        await apoll(lambda: server.connections == 1, "the broker to count it")
        # nothing of the channels is a task a shutdown that gathers the loop's tasks waits for
        others = asyncio.all_tasks() - {asyncio.current_task()}
        await asyncio.wait_for(asyncio.gather(*others), 5)
        return channel

    channel = asyncio.run(main())
    assert channel.broken  # closed as asyncio.run ended
    wait_until(lambda: server.connections == 0, 5, "the broker to see it close")
    server_loop.call_soon_threadsafe(server_loop.stop)


def test_the_broker_gives_back_what_an_undelivered_answer_took_without_poison(tmp_path):
    """`BrokerService.undelivered`: a receive (alone, in a batch, or a conversation group's
    lock) whose answer was lost is given back, not rolled back: the group is receivable again
    and the poison limit (2 here) is not reached however often it happens."""
    from actors import Begin, Queue, Send, Service
    from actors.calls.envelope import pack_ops, unpack_received
    from actors.calls.ordering import Issuer
    from actors.ids import new_request_id
    from actors.model.catalog import kind_of, to_record
    from actors.service.broker import BrokerService

    options = {"max_groups": 1, "top": None, "group_id": None, "handle": None, "lease_s": None}
    owner = ("holder-1", [None])

    async def main():
        service = BrokerService("b", str(tmp_path / "b.sqlite"))
        for d in (Queue("T", poison_limit=2), Service("S", "T", ["DEFAULT"])):
            await service.define(kind_of(d), to_record(d), new_request_id())
        [handle] = (await service.apply(pack_ops([Begin("S", "S")]), new_request_id()))["handles"]
        ops = pack_ops([Send(handle, "DEFAULT", [b"m"])])
        await service.apply(ops, new_request_id())
        issuer, given = Issuer(), []
        for _ in range(3):
            order = issuer.order(issuer.issue())
            blob = await service.receive("T", 0.0, options, owner)
            given.append(service.undelivered(None, "receive", ("T", 0.0, options, owner), blob))
            batch = [("receive", ("T", 0.0, options, owner, None, None))]
            [(ok, value)] = await service.calls(order, batch)
            given.append(service.undelivered(order, "calls", (batch,), [(ok, value)]))
            found = await service.get_conversation_group("T", 0.0, None, owner)
            given.append(service.undelivered(None, "get_conversation_group", (), found))
        assert service.undelivered(None, "apply", (), {"handles": []}) == 0  # took nothing
        # a receive under a lock the client already holds made no lock: it keeps its lock
        group_id, lock_id = await service.get_conversation_group("T", 0.0, None, owner)
        under = dict(options, lock_id=lock_id)
        blob = await service.receive("T", 0.0, under, owner)
        kept = service.undelivered(None, "receive", ("T", 0.0, under, owner), blob)
        locked = unpack_received(await service.receive("T", 0.0, options, owner))
        given.append(service.undelivered(None, "get_conversation_group", (), (group_id, lock_id)))
        last = unpack_received(await service.receive("T", 0.0, options, owner))
        queues = await service.view("queues", {})
        await service.close()
        return given, last, queues, kept, locked

    given, last, queues, kept, locked = asyncio.run(main())
    assert (kept, locked) == (0, [])  # the group stayed locked to its holder
    assert given == [1] * 10
    assert [m.body for g in last for m in g.messages] == [b"m"]
    assert queues["T"]["enabled"]


# What a connection may make the broker do (docs/security.md, the direct channel) ------------


def _wrote_marker(path: str) -> None:  # what a frame naming code would have the broker run
    with open(path, "w") as f:
        f.write("ran")


class NamesCode:
    """Pickles as a call of `_wrote_marker`, as a hostile client's argument would."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return _wrote_marker, (self.path,)


def test_a_call_naming_code_is_not_run_nor_anything_imported(tmp_path):
    marker = str(tmp_path / "marker")

    async def main():
        broker = Broker()
        server = await _server(broker)
        channel = await _channel(server)
        with pytest.raises(ch.ChannelBroken, match="may not travel on a direct channel"):
            await channel.send(("c", 0, 0), "apply", (NamesCode(marker),))
        answer = await channel.send(("c", 1, 0), "apply", ({"plain": [1, 2.5, b"x"]},))
        channel.close()
        server.close()
        return broker, answer

    broker, answer = asyncio.run(main())
    assert not os.path.exists(marker)  # the broker did not run it
    assert answer == ("apply", ({"plain": [1, 2.5, b"x"]},))
    assert [args for _, _, args in broker.seen] == [({"plain": [1, 2.5, b"x"]},)]


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("os", "system"),
        ("builtins", "eval"),
        ("builtins", "getattr"),
        ("subprocess", "Popen"),
        ("actors.calls.frames", "loads"),  # a function of the project's own
        ("actors.client.local", "LocalBroker"),  # a class of its own that is not a value
        ("actors.model.catalog", "Queue.__init__"),  # a dotted path into one
        ("actors.not_a_module", "Thing"),  # a module not loaded is not imported
    ],
)
def test_a_frame_may_not_name_functions_or_classes_that_are_not_plain_values(module, name):
    import actors.client.local  # noqa: F401 (loaded: refused for what it is, not as unknown)

    with pytest.raises(pickle.UnpicklingError, match="may not travel on a direct channel"):
        frames.wire_class(module, name)
    assert "actors.not_a_module" not in sys.modules


def test_a_frame_may_carry_the_projects_value_types_and_plain_builtins():
    from actors import Activation, Queue
    from actors.calls.envelope import Message
    from actors.errors import InvalidArgument

    values = (Queue("Q", activation=Activation("m:f")), Message, InvalidArgument("x"), {1, 2})
    assert repr(frames.loads(pickle.dumps(values, protocol=5))) == repr(values)
    assert frames.wire_class("builtins", "ValueError") is ValueError
    assert frames.wire_class("builtins", "frozenset") is frozenset


async def _raw_client(broker: Broker):
    """A server for `broker` and a plain connection to it that has shown its ticket."""
    server = await _server(broker)
    host, port, ticket = await server.ticket(None)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(struct.pack("<I", len(ticket)) + ticket.encode())
    return server, reader, writer


def test_a_frame_naming_code_ends_its_connection_and_runs_nothing(tmp_path):
    marker = str(tmp_path / "marker")

    async def main():
        broker = Broker()
        server, reader, writer = await _raw_client(broker)
        evil = pickle.dumps((0, ("c", 0, 0), "apply", NamesCode(marker)))
        writer.write(struct.pack("<I", len(evil)) + evil)
        got = await _closed(reader)
        writer.close()
        server.close()
        return got, broker.seen

    assert asyncio.run(main()) == (b"", [])
    assert not os.path.exists(marker)


def test_a_ticket_is_refused_once_it_is_older_than_ticket_s(monkeypatch):
    async def main():
        broker = Broker()
        server = await _server(broker)
        host, port, ticket = await server.ticket(None)
        monkeypatch.setattr(srv, "TICKET_S", 0.0)  # expired by the time it is shown

        async def stale():
            return host, port, ticket

        late = await ch.Channel.open(stale, None)
        with pytest.raises(ch.ChannelBroken):
            await late.send(("c", 0, 0), "apply", (1,))
        server.close()
        return broker.seen

    assert asyncio.run(main()) == []


def _connect_from(source: str, port: int) -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def test_connections_without_a_ticket_are_capped_per_source_and_a_ticket_holder_still_gets_in():
    """Connections from 127.0.0.2 past UNTICKETED_PER_SOURCE are closed at once; one from
    another address with a ticket is served meanwhile, and the slots come back as they close."""

    async def main():
        broker = Broker()
        server = await _server(broker)
        await server.ticket(None)  # listening
        loop = asyncio.get_running_loop()
        flood = [
            await loop.run_in_executor(None, _connect_from, "127.0.0.2", server.port)
            for _ in range(srv.UNTICKETED_PER_SOURCE + 10)
        ]
        await apoll(lambda: server.refused == 10, "the connections past the cap refused")
        assert server.unticketed == {"127.0.0.2": srv.UNTICKETED_PER_SOURCE}
        channel = await _channel(server)  # from 127.0.0.1, with its ticket
        answer = await channel.send(("c", 0, 0), "apply", (1,))
        for s in flood:
            s.close()
        await apoll(lambda: not server.unticketed, "the flood's slots given back")
        channel.close()
        server.close()
        return answer, server.refused

    assert asyncio.run(main()) == (("apply", (1,)), 10)


def test_connections_without_a_ticket_are_capped_in_all(monkeypatch):
    monkeypatch.setattr(srv, "UNTICKETED_PER_SOURCE", 1000)

    async def main():
        server = await _server(Broker())
        await server.ticket(None)
        loop = asyncio.get_running_loop()
        flood = [
            await loop.run_in_executor(None, _connect_from, "127.0.0.3", server.port)
            for _ in range(srv.UNTICKETED_MAX + 5)
        ]
        await apoll(lambda: server.refused == 5, "the connections past the cap refused")
        held = sum(server.unticketed.values())
        for s in flood:
            s.close()
        server.close()
        return held

    assert asyncio.run(main()) == srv.UNTICKETED_MAX


def test_a_frame_is_bounded_by_max_call_bytes_and_its_buffer_grows_as_it_arrives():
    class Limited(Collected):
        max_frame = 10_000 + frames.FRAME_SLACK

    framed = Limited()
    framed.transport = Closing()
    _feed(framed, struct.pack("<I", 512 << 20) + b"x" * 1000, [])  # claims half a gigabyte
    assert framed.transport.closed and not framed.frames
    assert len(framed._buf) <= frames.READ_BYTES  # nothing allocated for what did not come

    framed = Limited()
    _feed(framed, struct.pack("<I", frames.FRAME_SLACK) + b"y" * 100_000, [])  # allowed, part sent
    assert not framed.frames and len(framed._buf) < 4 * 100_000
    server = srv.ChannelServer(Broker().dispatch, "127.0.0.1", max_call_bytes=10_000)
    assert server.max_frame == 10_000 + frames.FRAME_SLACK


class Closing(OpenTransport):
    closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def test_a_client_that_does_not_read_its_answers_is_not_read_from_until_it_does():
    """Write back-pressure: answers waiting for a client that does not read stop the broker
    reading its calls; what waits stays bounded, and every call is answered once it reads."""
    calls, body = 400, b"z" * (256 << 10)  # 100 MiB of answers in all

    async def main():
        broker = Broker()
        server, reader, writer = await _raw_client(broker)
        for i in range(calls):
            frame = pickle.dumps((i, ("c", i, 0), "apply", pickle.dumps((body,))))
            writer.write(struct.pack("<I", len(frame)) + frame)
        # the client reads nothing: the broker stops taking calls well short of all of them
        conn = await apoll(lambda: next(iter(server.served), None), "the connection served")
        await apoll(lambda: "writes" in conn._paused, "reading paused for the unread answers")
        stalled = len(broker.seen)
        waiting = sum(c.transport.get_write_buffer_size() for c in server.served)
        got = 0
        while got < calls:  # now it reads: every call is answered
            (size,) = struct.unpack("<I", await reader.readexactly(4))
            await reader.readexactly(size)
            got += 1
        writer.close()
        server.close()
        return stalled, waiting, len(broker.seen)

    stalled, waiting, seen = asyncio.run(main())
    assert stalled < calls / 2 and 0 < waiting < 64 << 20, (stalled, waiting)
    assert seen == calls


def test_the_channel_port_comes_from_the_operators_range():
    assert srv.channel_ports(None) == range(0, 1) and srv.channel_ports(" ") == range(0, 1)
    assert srv.channel_ports("7100") == range(7100, 7101)
    assert srv.channel_ports("7100-7199") == range(7100, 7200)
    for bad in ("x", "0", "7200-7100", "70000", "1-2-3"):
        with pytest.raises(InvalidArgument, match="RAYBROKER_CHANNEL_PORTS must be a port"):
            srv.channel_ports(bad)

    async def main():
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = srv.ChannelServer(Broker().dispatch, "127.0.0.1", ports=range(port, port + 1))
        with pytest.raises(ch.ChannelRefused, match="no port of"):
            await server.ticket(None)
        free = free_port()
        server = srv.ChannelServer(Broker().dispatch, "127.0.0.1", ports=range(free, free + 1))
        _, got, _ = await server.ticket(None)
        server.close()
        taken.close()
        return got, free

    got, free = asyncio.run(main())
    assert got == free


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """What is left to read once the broker closes the connection: b"" (closed, or reset since
    what it had not read was dropped)."""
    try:
        return await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        return b""


def test_a_large_frame_is_read_in_place_and_still_refuses_what_may_not_travel():
    pad = bytes(range(256)) * 512  # past IN_PLACE_BYTES: read where it is in the buffer
    plain = (5, ("c", 2, 0), "apply", pad)
    view = memoryview(bytearray(pickle.dumps(plain, protocol=5)))
    assert len(view) >= frames.IN_PLACE_BYTES and frames.loads(view) == plain
    hostile = memoryview(bytearray(pickle.dumps((pad, os.system), protocol=5)))
    with pytest.raises(pickle.UnpicklingError, match="may not travel on a direct channel"):
        frames.loads(hostile)


def test_a_large_frame_of_text_opcodes_reads_its_lines_in_place():
    # protocol 0 reads a string as a line: here longer than one look for its newline, and
    # followed by others
    text = "".join(chr(32 + i % 90) for i in range(70_000))
    plain = (5, [text, "second line", text[:10]])
    view = memoryview(bytearray(pickle.dumps(plain, protocol=0)))
    assert len(view) >= frames.IN_PLACE_BYTES and frames.loads(view) == plain


def test_a_frame_is_handed_over_as_a_view_that_ends_with_the_call():
    kept: list[memoryview] = []

    class Keeping(Collected):
        def frame(self, data: memoryview) -> None:
            kept.append(data)
            super().frame(data)

    framed = Keeping()
    _feed(framed, struct.pack("<I", 3) + b"abc", [100])
    assert framed.frames == [b"abc"]
    with pytest.raises(ValueError):  # released: nothing reads the buffer once it is reused
        bytes(kept[0])
