"""What crosses actor calls: operations and received groups packed with msgpack, and back."""

from __future__ import annotations

import dataclasses
import pickle
import threading
import uuid

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors import packing
from actors.calls.envelope import (
    Begin,
    End,
    Message,
    ReceivedGroup,
    Send,
    Timer,
    pack_ops,
    pack_received,
    unpack_ops,
    unpack_received,
)
from actors.errors import InvalidArgument
from actors.model.catalog import DEFAULT, ERROR
from actors.model.dialogs import error_body

# --- operations ------------------------------------------------------------------------------


def test_send_takes_a_single_handle_as_a_one_handle_tuple():
    assert Send("h-1", "M", [b"x"]).handles == ("h-1",)


def test_send_takes_a_single_body_as_a_one_body_tuple():
    assert Send(["h-1"], "M", b"x").bodies == (b"x",)
    assert Send(["h-1"], "M", bytearray(b"x")).bodies == (bytearray(b"x"),)


def test_send_keeps_several_handles_and_bodies_in_order_as_tuples():
    op = Send(["h-1", "h-2"], "M", [b"a", b"b", b"c"])
    assert op.handles == ("h-1", "h-2")
    assert op.bodies == (b"a", b"b", b"c")


def test_a_single_handle_or_body_equals_its_one_element_list_form():
    assert Send("h-1", "M", b"x") == Send(["h-1"], "M", [b"x"])


def test_begin_defaults_to_the_default_contract_and_a_fresh_uuid_handle():
    a, b = Begin("From", "To"), Begin("From", "To")
    assert a.contract == DEFAULT
    assert a.handle != b.handle
    assert str(uuid.UUID(a.handle)) == a.handle


@pytest.mark.parametrize(
    "op",
    [
        Begin("From", "To"),
        Begin("From", "To", "C", "h-1", "0b7e4f0e-2a55-4d39-9f0e-6a8f8c1d2e3f", "c-9", "g-9", 60.0),
        Begin("From", "To", relays="h-0"),
        Send("h-1", "M", b"body"),
        Send(["h-1", "h-2"], "M", [b"", b"\x00\xff", b"x" * 100_000]),
        End("h-1"),
        End("h-1", 42, "bad order"),
        End("h-1", cleanup=True),
        Timer("h-1", 2.5),
        Timer("h-1", 0),
    ],
)
def test_each_operation_survives_pack_and_unpack(op):
    assert unpack_ops(pack_ops([op])) == [op]


def test_a_batch_unpacks_to_the_same_operations_in_the_same_order():
    ops = [
        Begin("From", "To", handle="h-1"),
        Send("h-1", "M", b"a"),
        Timer("h-1", 5.0),
        Send("h-1", "M", b"b"),
        End("h-1"),
    ]
    assert unpack_ops(pack_ops(ops)) == ops


def test_a_begin_from_before_dialog_security_is_read_with_encryption_off():
    op = Begin("A", "B")
    assert op.encryption  # on unless said otherwise, as in Service Broker
    [rec] = msgpack.unpackb(pack_ops([op]), raw=False)
    older = msgpack.packb([rec[:-1]], use_bin_type=True)  # as the previous release packs it
    [back] = unpack_ops(older)
    assert back == dataclasses.replace(op, encryption=False)
    with pytest.raises(InvalidArgument, match="operation 0 is not an operation"):
        unpack_ops(msgpack.packb([rec[:-2]], use_bin_type=True))


def test_an_empty_batch_survives_pack_and_unpack():
    assert unpack_ops(pack_ops([])) == []


def test_bodies_are_bytes_after_unpacking_even_when_sent_as_bytearray():
    (op,) = unpack_ops(pack_ops([Send("h-1", "M", bytearray(b"ab"))]))
    assert op.bodies == (b"ab",)
    assert type(op.bodies[0]) is bytes


@pytest.mark.parametrize("thing", [object(), None, "Send", {"handle": "h-1"}, ("h-1", "M", b"x")])
def test_an_object_that_is_not_an_operation_is_an_invalid_argument(thing):
    with pytest.raises(InvalidArgument, match="is not an operation"):
        pack_ops([Send("h-1", "M", b"x"), thing])


def test_a_subclass_of_an_operation_is_not_an_operation():
    class MySend(Send):
        pass

    with pytest.raises(InvalidArgument, match="is not an operation"):
        pack_ops([MySend("h-1", "M", b"x")])


@pytest.mark.parametrize(
    "body",
    [
        object(),
        {1, 2},
        "text",
        7,
    ],
)
def test_a_body_that_is_not_bytes_is_an_invalid_argument(body):
    with pytest.raises(InvalidArgument, match="bodies must be bytes"):
        pack_ops([Send("h-1", "M", [b"ok", body])])


_name = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.:/\-]{0,19}", fullmatch=True)
_handle = st.text(min_size=1, max_size=20)  # a handle is any non-empty string
_maybe_handle = st.none() | _handle
_broker = st.none() | st.uuids().map(str)
_seconds = st.floats(0, 2**31 - 1)  # what an operation may carry as a time
_code = st.integers(1, 2**31 - 1)
_ops = st.one_of(
    st.builds(
        Begin,
        _name,
        _name,
        _name,
        _handle,
        _broker,
        _maybe_handle,
        _maybe_handle,
        st.none() | _seconds.filter(lambda x: x > 0),
    ),
    st.builds(
        Send,
        _handle | st.lists(_handle, min_size=1, max_size=3),
        _name,
        st.binary(max_size=50) | st.lists(st.binary(max_size=50), max_size=3),
    ),
    st.builds(End, _handle, st.none(), st.text(max_size=20), st.booleans()),
    st.builds(End, _handle, _code, st.text(min_size=1, max_size=20), st.just(False)),
    st.builds(Timer, _handle, _seconds | st.integers(0, 2**31 - 1)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_ops, max_size=8))
def test_any_batch_of_operations_survives_pack_and_unpack(ops):
    assert unpack_ops(pack_ops(ops)) == ops


# --- received messages -----------------------------------------------------------------------


def _group(group_id: str = "g-1", state: bytes | None = b"st") -> ReceivedGroup:
    return ReceivedGroup(
        group_id=group_id,
        lock_id="lock-1",
        state=state,
        endpoints={
            3: ("h-3", "c-3", "Here", "There", "C"),
            5: ("h-5", "c-5", "Here", "Elsewhere", DEFAULT),
        },
        runs=[
            (10, 3, 0, "M", [b"first"], 1.0, 2.0),
            (11, 5, 0, ERROR, [error_body(42, "bad order")], 3.0, 4.0),
            (12, 3, 1, "M", [b""], 5.0, 6.0),
        ],
    )


def test_a_received_group_turns_each_row_into_a_message_with_its_endpoint():
    assert _group().messages[0] == Message(
        queuing_order=10,
        conversation_handle="h-3",
        conversation_id="c-3",
        conversation_group_id="g-1",
        message_type="M",
        body=b"first",
        sequence_number=0,
        service_name="Here",
        far_service="There",
        contract="C",
        sent_at=1.0,
        arrived_at=2.0,
    )


def test_a_received_group_keeps_its_messages_in_queue_order():
    group = _group()
    assert len(group) == 3
    assert [m.queuing_order for m in group.messages] == [10, 11, 12]
    assert [m.conversation_handle for m in group.messages] == ["h-3", "h-5", "h-3"]


def test_an_error_message_decodes_its_code_and_description():
    assert _group().messages[1].error == (42, "bad order")


def test_a_message_of_another_type_has_no_error_even_if_its_body_looks_like_one():
    message = Message(1, "h", "c", "g", "M", error_body(1, "x"), 0, "S", "F", "C", 0.0, 0.0)
    assert message.error is None


@pytest.mark.parametrize("state", [b"st", b"", None])
def test_received_groups_survive_pack_and_unpack(state):
    groups = [_group("g-1", state), _group("g-2", None)]
    back = unpack_received(pack_received(groups))
    assert len(back) == 2
    for got, sent in zip(back, groups, strict=True):
        assert (got.group_id, got.lock_id, got.state) == (sent.group_id, sent.lock_id, sent.state)
        assert got.endpoints == sent.endpoints
        assert got.messages == sent.messages
        assert len(got) == len(sent)


def test_an_empty_receive_survives_pack_and_unpack():
    assert unpack_received(pack_received([])) == []


def test_a_received_groups_messages_are_made_once_and_travel_with_it():
    group = _group()
    messages = group.messages
    assert group.messages is messages  # made on first use, then the group's own
    copy = pickle.loads(pickle.dumps(group))
    assert copy == group and copy.messages == messages
    assert "messages" not in pickle.loads(pickle.dumps(_group())).__dict__  # not made yet


def test_a_received_run_is_its_messages_numbered_from_its_first():
    group = ReceivedGroup(
        "g-1", "lock-1", None, {3: ("h-3", "c-3", "Here", "There", "C")},
        [(20, 3, 5, "M", [b"a", b"b"], 1.0, 2.0), (22, 3, -1, "EndDialog", [b"", b""], 3.0, 4.0)],
    )  # fmt: skip
    assert len(group) == 4
    assert [(m.queuing_order, m.sequence_number, m.body) for m in group.messages] == [
        (20, 5, b"a"), (21, 6, b"b"), (22, -1, b""), (23, -1, b""),
    ]  # fmt: skip
    assert group.rows[1] == (21, 3, 6, "M", b"b", 1.0, 2.0)
    assert [group.message(i) for i in range(4)] == group.messages
    with pytest.raises(IndexError):
        group.message(4)
    back = unpack_received(pack_received([group]))[0]
    assert back.messages == group.messages


def test_a_received_group_with_no_rows_has_no_messages():
    group = ReceivedGroup("g-1", "lock-1", None, {}, [])
    assert unpack_received(pack_received([group]))[0].messages == []


@pytest.mark.parametrize(
    "make",
    [
        lambda: Begin("A", "B", lifetime=float("nan")),
        lambda: Begin("A", "B", lifetime=float("inf")),
        lambda: Begin("A", "B", lifetime=True),
        lambda: Begin("A", "B", lifetime=0),
        lambda: Begin("A", "B", lifetime=2.0**40),
        lambda: Timer("h", float("nan")),
        lambda: Timer("h", -1),
        lambda: Timer("h", True),
        lambda: End("h", error=0),
        lambda: End("h", error=2**70),
        lambda: End("h", cleanup="no"),
    ],
)
def test_an_operation_with_a_bad_time_code_or_flag_is_refused_when_made(make):
    with pytest.raises(InvalidArgument):
        make()


def test_the_per_thread_packer_packs_as_msgpack_does_and_recovers_from_a_failed_pack():
    value = [1, "two", b"three", None, {"four": [4.5]}]
    assert packing.packb(value) == msgpack.packb(value, use_bin_type=True)
    with pytest.raises(TypeError):
        packing.packb([object()])
    assert packing.packb(value) == msgpack.packb(value, use_bin_type=True)  # nothing left over


def test_threads_pack_with_packers_of_their_own():
    results: dict[int, list[bytes]] = {}

    def pack_many(n: int) -> None:
        results[n] = [packing.packb([n, i, bytes(n)]) for i in range(2000)]

    threads = [threading.Thread(target=pack_many, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n, packed in results.items():
        assert packed == [msgpack.packb([n, i, bytes(n)]) for i in range(2000)]


def test_a_packer_that_packed_something_big_is_not_kept_for_the_thread():
    packing.packb([1])
    small = packing._local.packer
    packing.packb([1])
    assert packing._local.packer is small  # kept while what it packs is small
    packing.packb(bytes(packing.KEEP_BYTES + 1))
    assert getattr(packing._local, "packer", None) is not small


def test_a_send_names_a_bad_handle_anywhere_in_its_list():
    with pytest.raises(InvalidArgument, match="conversation handle"):
        Send(["h-1", "h-2", ""], "M", b"x")
    with pytest.raises(InvalidArgument, match="conversation handle"):
        Send(["h-1", 7], "M", b"x")


def test_a_send_takes_a_bytearray_body_in_a_list_as_bytes():
    op = Send(["h-1"], "M", [bytearray(b"ab")])
    assert op.bodies == (b"ab",) and type(op.bodies[0]) is bytes
