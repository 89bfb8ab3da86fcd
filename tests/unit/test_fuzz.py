"""Property-based fuzzing at the two boundaries a broker has: its client verbs and the calls of
other brokers. For arbitrary values of every argument and arbitrary bundles: a typed error
(`BrokerError`) or success, never anything else; the broker still answers; and a refused call
leaves every view as it was. No Ray: a real `LocalBroker` on a SQLite file, and real
`BrokerCore`s with their real couriers over in-process peers."""

from __future__ import annotations

import asyncio
import inspect
import math
import pickle
import struct
import time

import msgpack
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from actors import Contract, LocalBroker, MessageType, Queue, Service
from actors.calls.envelope import Begin, End, Send, Timer
from actors.core import BrokerCore, Limits
from actors.errors import BrokerError
from actors.model.catalog import Activation
from actors.service.calls import BATCH_VERBS, CLIENT_VERBS
from actors.store.database import Store
from actors.transport.wire import Bundle, unpack_reply
from tests.fakes import FakeClock

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),  # NaN and both infinities included
    st.text(max_size=12),
    st.binary(max_size=12),
)


def nested(scalars):
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(st.text(max_size=6), inner, max_size=3),
            st.tuples(inner, inner),
        ),
        max_leaves=6,
    )


anything = nested(scalars)
# Plausible values reach further into a verb than noise does. Definitions and ops are built in
# the test, not while drawing: building one is already a call that may be refused.
HANDLE = "fuzz-dialog"  # a dialog the fixture begins, so verbs on handles reach it
names = st.sampled_from(
    ["Q", "S", "C", "M", HANDLE, "Q ", "Q\n", "", "x" * 300, "ray://nobody", "DEFAULT"]
)
numbers = st.sampled_from([0, 1, 5, 0.5, 30, 1000])


class Build(tuple):
    """(cls, args, kwargs) to construct inside the test."""


def build(cls, *args, **kwargs):
    return st.tuples(st.just(cls), st.tuples(*args), st.fixed_dictionaries(kwargs)).map(Build)


definitions = st.one_of(
    build(Queue, names, enabled=anything, retention=anything, poison_limit=anything),
    build(MessageType, names, anything),
    build(Contract, names, anything),
    build(Service, names, names, anything),
    build(Queue, names, activation=build(Activation, anything, anything, anything)),
)
ops = st.one_of(
    build(Begin, names, names, names, lifetime=anything, related_group=anything),
    build(Send, anything, names, anything),
    build(End, anything, error=anything, description=anything, cleanup=anything),
    build(Timer, anything, anything),
)
plausible = st.one_of(names, numbers, definitions, st.lists(ops, max_size=3), ops)
value = st.one_of(plausible, anything)
# What each parameter plausibly takes, so that calls get past the first check and reach deeper.
TYPED = {
    **dict.fromkeys(
        ["name", "queue", "handle", "from_service", "to_service", "contract", "message_type",
         "group_id", "service_name", "related_conversation", "related_group", "address",
         "mirror_address", "table", "description"],
        names,
    ),
    **dict.fromkeys(
        ["lease", "lifetime", "timeout", "limit", "after_id", "max_groups", "top", "error"],
        numbers,
    ),
    "kind": st.sampled_from(["queue", "service", "contract", "message_type", Queue, "bogus"]),
    "definition": definitions,
    "ops": st.lists(ops, max_size=3),
    "body": st.binary(max_size=20),
    "cleanup": st.booleans(),
    "forwarding": st.booleans(),
    "changes": st.dictionaries(st.sampled_from(["enabled", "address", "poison_limit"]), value),
}  # fmt: skip


def materialize(v):
    """Construct what `v` describes (raising what the constructors raise)."""
    if isinstance(v, Build):
        cls, args, kwargs = v
        return cls(*map(materialize, args), **{k: materialize(x) for k, x in kwargs.items()})
    if isinstance(v, list):
        return [materialize(x) for x in v]
    return v


# `wait` blocks for as long as it says when valid: draw only zero or invalid waits.
waits = st.sampled_from([0, 0.0, math.nan, math.inf, -1, "1", True, None, [1], 2**70])

VERBS = [
    "create", "alter", "drop", "apply", "begin_dialog", "send", "end_conversation",
    "begin_conversation_timer", "move_conversation", "receive", "get_conversation_group",
    "settle", "commit", "rollback", "create_route", "alter_route", "drop_route", "routes",
    "configure", "endpoints", "dialogs", "queue", "queues", "groups", "transmission_queue",
    "events", "audit",
]  # fmt: skip


def snapshot(b: LocalBroker) -> dict:
    key = "conversation_handle"
    return {
        "definitions": b.definitions(),
        "endpoints": sorted(b.endpoints(), key=lambda e: e[key]),
        "queues": b.queues(),
        "groups": sorted(b.groups(), key=lambda g: g["conversation_group_id"]),
        "transmission": b.transmission_queue(),
        "routes": b.routes(),
        "messages": b.queue("Q"),
    }


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "b.sqlite"
    with LocalBroker("fuzz", str(path)) as b:
        b.create(MessageType("M"))
        b.create(Contract("C", {"M": "any"}))
        b.create(Queue("Q"))
        b.create(Service("S", "Q", ["C"]))
        b.apply([Begin("S", "S", "C", handle=HANDLE), Send(HANDLE, "M", b"hello")])
        yield b


@st.composite
def calls(draw):
    verb = draw(st.sampled_from(VERBS))
    params = list(inspect.signature(getattr(LocalBroker, verb)).parameters.values())[1:]
    args, kwargs = [], {}
    noisy = draw(st.booleans())
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            if draw(st.booleans()):
                kwargs[draw(st.sampled_from(["enabled", "address", "bogus", "lifetime"]))] = draw(
                    value
                )
            continue
        optional = p.default is not inspect.Parameter.empty
        if optional and draw(st.booleans()):
            continue  # leave it to its default
        if p.name == "wait":
            v = draw(waits)
        else:  # what the parameter takes; in a noisy call, noise one time in three
            typed = TYPED.get(p.name, value)
            v = draw(st.one_of(typed, typed, value) if noisy else typed)
        if p.kind is p.KEYWORD_ONLY or (optional and draw(st.booleans())):
            kwargs[p.name] = v
        elif not kwargs:
            args.append(v)
        else:
            kwargs[p.name] = v
    return verb, args, kwargs


@FUZZ
@given(call=calls())
def test_any_verb_with_any_arguments_is_done_or_refused_with_a_typed_error(broker, call):
    verb, args, kwargs = call
    before = snapshot(broker)
    try:
        args = [materialize(a) for a in args]
        kwargs = {k: materialize(v) for k, v in kwargs.items()}
        getattr(broker, verb)(*args, **kwargs)
        event("done")
    except BrokerError as exc:
        event(f"refused: {type(exc).__name__}")
        after = snapshot(broker)
        if after != before and _came_due(before, time.time()):
            # an earlier example's timer (or lifetime) fell due meanwhile and the broker's clock
            # acted on it: that change is not the refused call's
            event("a timer fell due during the call")
        else:
            assert after == before, f"{verb} was refused but changed the broker"
    assert broker.info()["name"] == "fuzz"  # it still answers


def _came_due(before: dict, by: float) -> bool:
    """Whether a timer or a dialog lifetime of `before`'s endpoints was due by `by`."""
    return any(
        due is not None and due <= by
        for ep in before["endpoints"]
        for due in (ep["timer_due_at"], ep["lifetime_expires_at"])
    )


# --- the broker-to-broker boundary -----------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    core = BrokerCore(Store(":memory:"), FakeClock(), Limits(), "T")
    core.create(MessageType("M", "json"))
    core.create(Contract("C", {"M": "any"}))
    core.create(Queue("Q"))
    core.create(Service("S", "Q", ["C"]))
    yield core
    core.store.close()


def core_snapshot(core: BrokerCore) -> dict:
    return {
        "endpoints": sorted(core.endpoints_view(), key=lambda e: e["conversation_handle"]),
        "queues": core.queues_view(),
        "groups": sorted(core.groups_view(), key=lambda g: g["conversation_group_id"]),
        "transmission": core.transmission_view(),
        "messages": core.queue_view("Q"),
    }


def good_bundle(core: BrokerCore, conv: str, seq: int = 0, body: bytes = b"{}") -> list:
    return list(
        Bundle(
            conv, "S", "S", core.broker_id, "far", True, "C", None, 8, [seq], ["M"], [body], [0.0]
        )
    )


fields = st.sampled_from(range(len(Bundle._fields)))
wire_values = nested(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**64 - 1),  # what msgpack can carry
        st.floats(),
        st.text(max_size=12),
        st.binary(max_size=12),
    )
)


@st.composite
def blobs(draw, core: BrokerCore):
    """A call from another broker: noise, or bundles of which some fields are replaced."""
    if draw(st.booleans()):
        return draw(st.one_of(st.binary(max_size=40), wire_values.map(msgpack.packb)))
    bundles = []
    for _ in range(draw(st.integers(1, 3))):
        b = good_bundle(core, f"fuzz-{draw(st.integers(0, 3))}", draw(st.integers(-1, 2)))
        for _ in range(draw(st.integers(0, 2))):
            b[draw(fields)] = draw(st.one_of(wire_values, names))
        bundles.append(b)
    return msgpack.packb(bundles, use_bin_type=True)


def _deliver(core: BrokerCore, blob: bytes) -> bytes:
    """The real courier's answer to a call (forwarding is off: it never calls a peer)."""
    return asyncio.run(core.transport.courier(None).deliver(blob))


@FUZZ
@given(data=st.data())
def test_any_call_from_another_broker_is_answered_and_a_refusal_changes_nothing(target, data):
    blob = data.draw(blobs(target))
    before = core_snapshot(target)

    reply = _deliver(target, blob)

    acks, refused = unpack_reply(reply)
    if not acks:
        assert core_snapshot(target) == before
    assert target.queues_view()["Q"]["enabled"] is True  # it still answers


def test_a_good_bundle_beside_a_malformed_one_is_still_taken(target):
    conv = "fuzz-neighbour"
    bad = good_bundle(target, "fuzz-bad")
    bad[Bundle._fields.index("bodies")] = ["not bytes"]
    blob = msgpack.packb([bad, good_bundle(target, conv)], use_bin_type=True)

    acks, refused = unpack_reply(_deliver(target, blob))

    assert [a.code for a in acks if a.conversation_id == conv] == [None]  # taken
    assert refused or [a.code is not None for a in acks if a.conversation_id == "fuzz-bad"] == [
        True
    ]


# --- the broker's raw entry points: what any Ray client can call on the actor ----------------

raw_args = st.lists(st.one_of(names, anything, st.sampled_from([0, 0.0, {}, [], None])), max_size=7)
entries = st.one_of(
    st.tuples(
        st.just("call"), st.one_of(st.sampled_from(sorted(CLIENT_VERBS)), anything), raw_args
    ),
    st.tuples(
        st.just("calls"),
        st.one_of(
            anything,
            st.lists(
                st.one_of(
                    st.tuples(st.one_of(st.sampled_from(sorted(BATCH_VERBS)), anything), raw_args),
                    anything,
                ),
                max_size=3,
            ),
        ),
    ),
    st.tuples(
        st.just("wait_take"),
        st.one_of(names, anything),
        st.one_of(st.sampled_from([0, 0.0, 0.01]), anything),
        st.one_of(anything, st.lists(st.one_of(raw_args, anything), max_size=3)),
    ),
)
orders = st.one_of(
    st.builds(lambda n: (f"fuzz-{n}", 0, 0), st.integers(0, 2**62)),  # a new client's first call
    anything,
)


@FUZZ
@given(entry=entries, order=orders)
def test_any_call_on_the_raw_entry_points_is_done_or_refused_with_a_typed_error(
    broker, entry, order
):
    """`call`, `calls` and `wait_take` as any Ray client can call them on the actor, with any
    arguments: each answers or raises a `BrokerError`; a batch's or a take's own errors too."""
    service = broker.service

    async def go():
        kind, *rest = entry
        if kind == "call":
            method, args = rest
            return await service.call(order, method, *args)
        if kind == "calls":
            return await service.calls(order, rest[0])
        return await service.wait_take(*rest)

    async def bounded():  # a verb told to wait may wait: that is an answer too
        try:
            return await asyncio.wait_for(go(), 0.5)
        except TimeoutError:
            return None

    try:
        result = broker._run(bounded())
        event("done")
    except BrokerError as exc:
        event(f"refused: {type(exc).__name__}")
        return
    if entry[0] in ("calls", "wait_take") and isinstance(result, list):
        for ok, answer in result:  # each call's or take's own outcome
            assert ok or isinstance(answer, BrokerError), answer
    assert broker.info()["name"] == "fuzz"  # it still answers


# The direct channel's frames (actors.client.channel): what any process that reaches the port
# can send, with or without a ticket first.


class _Wire:
    """What the broker does with one connection: the frames it writes, whether it closed it."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def writelines(self, pieces: list[bytes]) -> None:  # a frame, written in pieces
        self.sent.append(b"".join(pieces))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    abort = close

    def pause_reading(self) -> None:
        pass

    resume_reading = pause_reading

    def get_extra_info(self, name: str, default=None):
        return ("127.0.0.1", 40000) if name == "peername" else default


def _pickled(value) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


channel_frames = st.one_of(
    st.binary(max_size=120),  # not a pickle at all, or a truncated one
    anything.map(_pickled),  # a pickle of something else than a call
    st.tuples(anything, anything, st.sampled_from(sorted(CLIENT_VERBS)), anything).map(
        lambda c: _pickled((*c[:3], _pickled(c[3])))  # a call with any arguments
    ),
    st.tuples(anything, anything, st.text(max_size=10), st.binary(max_size=60)).map(_pickled),
)


@FUZZ
@given(frames=st.lists(channel_frames, max_size=6), ticket=st.booleans())
def test_any_frame_on_a_direct_channel_is_answered_or_ends_its_connection(frames, ticket):
    """Each frame after a ticket is answered (a frame of its own: run, refused, or not run
    here) or ends the connection; without a ticket nothing runs; nothing escapes the broker."""
    from actors.calls import frames as fr
    from actors.service import channel as srv

    ran: list[str] = []

    async def dispatch(order, method, args):
        ran.append(method)
        return args

    async def main() -> _Wire:
        server = srv.ChannelServer(dispatch, "127.0.0.1")
        server.tickets["t" * 32] = (time.monotonic(), None)
        conn, wire = srv._Served(server), _Wire()
        conn.connection_made(wire)
        stream = [b"t" * 32] if ticket else []
        for data in [*stream, *frames]:
            if wire.closed:
                break
            whole = struct.pack("<I", len(data)) + data
            room = conn.get_buffer(len(whole))
            while len(room) < len(whole):  # as asyncio reads: what fits, then more room
                n = len(room)
                room[:n] = whole[:n]
                room.release()
                conn.buffer_updated(n)
                whole = whole[n:]
                room = conn.get_buffer(len(whole))
            room[: len(whole)] = whole
            room.release()
            conn.buffer_updated(len(whole))
        await asyncio.gather(*server.running)
        conn.connection_lost(None)
        return wire

    wire = asyncio.run(main())
    answers = [pickle.loads(sent[4:]) for sent in wire.sent]  # every one a whole frame
    assert all(status in (fr.OK, fr.ERROR, fr.NOT_HERE) for _, status, _ in answers)
    if not ticket:
        assert ran == [] and wire.sent == [] and (wire.closed or not frames)
    elif not wire.closed:
        assert len(answers) == len(frames)
    run_answers = sum(status != fr.NOT_HERE for _, status, _ in answers)
    # a call that ran is answered, unless its connection ended first (its answer is then
    # handed to `undelivered`, none here)
    assert len(ran) == run_answers if not wire.closed else len(ran) >= run_answers
