"""The Spark bridge's planner (spark_bridge/plan.py): how a partition's Arrow rows become batched,
idempotent `apply` calls. No Spark, no Ray: the calls are applied to an in-process BrokerCore."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zlib
from collections import defaultdict

import msgpack
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.calls.envelope import MAX_HANDLE, Begin, Send
from actors.errors import InvalidArgument
from actors.model.catalog import MessageType
from spark_bridge.plan import (
    DIGEST_IDS,
    MAX_INGEST_ID,
    ORDERED_IDS,
    RANKED_IDS,
    IngestSpec,
    Pace,
    PartitionPlanner,
    Rejected,
    broker_of,
    call_rows,
    check_ingest_id,
    dialog_id,
    digest_span,
    encode_bodies,
    group_id,
    ids_of,
    key_text,
    rank_span,
    request_id,
    slices,
    whole_number,
)

from .test_core_dialogs import receive_all

# --- helpers -----------------------------------------------------------------------------------


def make_spec(**changes) -> IngestSpec:
    fields = {
        "ingest_id": "ing1",
        "run": "run1",
        "from_service": "Init",
        "to_service": "Target",
        "contract": "C",
        "message_type": MessageType("Req"),
        "body": "body",
    }
    fields.update(changes)
    return IngestSpec(**fields)


def make_batch(rows, key_type=None) -> pa.RecordBatch:
    """A record batch of (key, body) rows, in the order given (sorted by key then order)."""
    return pa.record_batch(
        {
            "key": pa.array([k for k, _ in rows], key_type),
            "body": pa.array([b for _, b in rows], pa.binary()),
        }
    )


def apply_all(core, planner: PartitionPlanner, batches) -> list[dict]:
    """Plan every batch and apply every call to `core`; the apply results, in order."""
    results = []
    for batch in batches:
        for call in planner.calls(batch):
            assert call.sender == 0  # senders=1: every key goes through broker 0
            results.append(core.apply(call.ops, request_id=call.request_id))
    return results


def received_by_key(core, ingest_id: str, keys) -> dict[str, list[tuple[int, bytes]]]:
    """Everything waiting on TargetQ, as {key: [(sequence number, body), ...]} in receive order."""
    key_of = {dialog_id(ingest_id, k): k for k in keys}
    out: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
    for m in receive_all(core, "TargetQ"):
        out[key_of[m.conversation_id]].append((m.sequence_number, m.body))
    return dict(out)


# Two batches, sorted by key; key "b" spans both.
ROWS_1 = [("a", b"a0"), ("a", b"a1"), ("b", b"b0"), ("b", b"b1"), ("b", b"b2")]
ROWS_2 = [("b", b"b3"), ("b", b"b4"), ("c", b"c0")]
EXPECTED = {
    "a": [(0, b"a0"), (1, b"a1")],
    "b": [(i, b"b%d" % i) for i in range(5)],
    "c": [(0, b"c0")],
}


# --- slices ------------------------------------------------------------------------------------


def test_slices_cut_at_rows():
    assert list(slices([b"x"] * 7, rows=3, max_bytes=1000)) == [(0, 3), (3, 6), (6, 7)]


def test_slices_cut_before_a_body_would_exceed_max_bytes():
    bodies = [b"aaa", b"bbb", b"cc", b"dddd", b"e"]
    # 3+3=6 fits in 7, +2 would be 8; 2+4=6 fits, +1=7 fits
    assert list(slices(bodies, rows=100, max_bytes=7)) == [(0, 2), (2, 5)]


def test_slices_exactly_max_bytes_stays_in_one_slice():
    assert list(slices([b"ab", b"cd"], rows=100, max_bytes=4)) == [(0, 2)]


def test_a_body_bigger_than_max_bytes_is_its_own_slice():
    bodies = [b"a", b"x" * 50, b"b", b"c"]
    assert list(slices(bodies, rows=100, max_bytes=10)) == [(0, 1), (1, 2), (2, 4)]


def test_null_bodies_count_as_rows_but_no_bytes():
    assert list(slices([None, None, None], rows=2, max_bytes=0)) == [(0, 2), (2, 3)]


def test_slices_of_nothing_yield_nothing():
    assert list(slices([], rows=10, max_bytes=10)) == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=60),
    st.integers(1, 10),
    st.integers(0, 100),
)
def test_slices_cover_every_index_once_within_bounds_and_cut_only_when_needed(
    bodies, rows, max_bytes
):
    def size(start, stop):
        return sum(len(b) for b in bodies[start:stop] if b is not None)

    got = list(slices(bodies, rows, max_bytes))

    # consecutive, non-empty, together every index exactly once
    assert [i for start, stop in got for i in range(start, stop)] == list(range(len(bodies)))
    assert all(stop > start for start, stop in got)
    for k, (start, stop) in enumerate(got):
        assert stop - start <= rows
        assert stop - start == 1 or size(start, stop) <= max_bytes
        if k < len(got) - 1:  # a cut is made only when the next body would not fit
            assert stop - start == rows or size(start, stop + 1) > max_bytes


# --- dialog ids and brokers --------------------------------------------------------------------


def test_dialog_id_is_the_ingest_id_and_the_key_in_its_own_order():
    digest = hashlib.sha256("kéy".encode()).hexdigest()[:32]
    head = "kéy".encode().hex().ljust(32, "0")
    assert dialog_id("ing1", "kéy") == f"ing1/t{head}{digest}"
    long_text = "customer-000000123456"  # its first 16 bytes only, then the digest
    digest = hashlib.sha256(long_text.encode()).hexdigest()[:32]
    assert dialog_id("ing1", long_text) == f"ing1/t{long_text[:16].encode().hex()}{digest}"
    assert dialog_id("ing1", "0") == "ing1/n8000000000000000"  # the number plus 2**63, in hex
    assert dialog_id("ing1", "-1") == "ing1/n7fffffffffffffff"
    assert dialog_id("ing1", str(2**63 - 1)) == "ing1/nffffffffffffffff"


def test_dialog_ids_of_earlier_releases_are_made_as_they_made_them():
    digest = hashlib.sha256("kéy".encode()).hexdigest()[:32]
    rank = f"{zlib.crc32('kéy'.encode()):08x}"
    assert dialog_id("ing1", "kéy", RANKED_IDS) == f"ing1/k{rank}{digest}"
    assert dialog_id("ing1", "kéy", DIGEST_IDS) == f"ing1/{digest}"


@pytest.mark.parametrize(
    ("text", "number"),
    [("0", 0), ("42", 42), ("-42", -42), (str(2**63 - 1), 2**63 - 1), (str(-(2**63)), -(2**63))]
    + [(t, None) for t in ("", "-", "-0", "007", "+5", " 5", "5 ", "1e3", "4.0", "٥", "0x1f")]
    + [(str(2**63), None), (str(-(2**63) - 1), None), ("9" * 5000, None)],
)
def test_a_whole_number_is_text_as_spark_writes_a_64_bit_number(text, number):
    assert whole_number(text) == number


def test_dialog_ids_sort_as_spark_sorts_whole_numbers_and_text():
    numbers = sorted([-(2**63), -1000, -7, -1, 0, 1, 9, 10, 99, 12345, 2**40, 2**63 - 1])
    ids = [dialog_id("ing1", str(n)) for n in numbers]
    assert ids == sorted(ids)
    texts = sorted(f"{p}-{i:06d}" for p in ("customer", "order", "zé") for i in range(300))
    texts = sorted(texts + ["", "a", "a\x00", "b" * 40], key=str.encode)  # byte by byte
    ids = [dialog_id("ing1", t) for t in texts]
    assert ids == sorted(ids) and len(set(ids)) == len(texts)
    # whole numbers written as text sort as text: in order within each length
    for digits in (1, 3, 5):
        same_length = [str(i) for i in range(10 ** (digits - 1), min(10**digits, 3000))]
        ids = [dialog_id("ing1", t) for t in sorted(same_length, key=str.encode)]
        assert ids == sorted(ids)


def test_ids_of_tells_the_kind_of_a_dialog_id_and_of_nothing_else():
    for kind in (DIGEST_IDS, RANKED_IDS, ORDERED_IDS):
        for key in ("k", "12", "customer-000001"):
            assert ids_of(dialog_id("ing1", key, kind), "ing1") == kind
            assert ids_of(dialog_id("ing1", key, kind), "ing") is None  # another ingest's
    for other in ("ing1/", "ing1/g/" + "0" * 32, "ing1/" + "A" * 32, "x/" + "0" * 32, "ing1"):
        assert ids_of(other, "ing1") is None
    for other in ("ing1/n" + "0" * 15, "ing1/n" + "g" * 16, "ing1/t" + "0" * 63, "ing1/0-mine"):
        assert ids_of(other, "ing1") is None
    # the kinds' ids lie apart, digest ids first, then ranked ones, then ordered ones
    # (`spark_bridge.ingest`, `spark_bridge.reconcile`)
    first, end = digest_span("ing1")
    ranked_first, ranked_end = rank_span("ing1")
    for key in ("k", "0", "zz" * 50, str(-(2**63))):
        assert first <= dialog_id("ing1", key, DIGEST_IDS) < end <= ranked_first
        assert ranked_first <= dialog_id("ing1", key, RANKED_IDS) < ranked_end
        assert ranked_end <= dialog_id("ing1", key)


@pytest.mark.parametrize("kind", [DIGEST_IDS, RANKED_IDS, ORDERED_IDS])
def test_the_planner_names_its_dialogs_as_its_spec_says(kind):
    spec = make_spec(ids=kind)
    calls = list(PartitionPlanner(spec).calls(make_batch([("a", b"1"), ("b", b"2")])))

    begun = [op.handle for c in calls for op in c.ops if isinstance(op, Begin)]

    assert begun == [dialog_id("ing1", "a", kind), dialog_id("ing1", "b", kind)]


def test_dialog_id_differs_per_key_and_per_ingest_id():
    ids = {dialog_id(i, k) for i in ("ing1", "ing2") for k in ("a", "b", "1", "")}
    assert len(ids) == 8


def test_dialog_and_group_ids_fit_a_handle_for_the_longest_ingest_id():
    longest = "x" * MAX_INGEST_ID
    assert check_ingest_id(longest) == longest
    assert len(dialog_id(longest, "k" * 10_000)) <= MAX_HANDLE
    assert len(group_id(longest, "g" * 10_000)) <= MAX_HANDLE
    Begin(
        "Init",
        "Target",
        "C",
        handle=dialog_id(longest, "k"),
        conversation_id=dialog_id(longest, "k"),
        related_group=group_id(longest, "g"),
    )  # accepted as a handle, conversation id and group id


def test_group_id_differs_from_the_dialog_id_of_the_same_text():
    assert group_id("ing1", "a") != dialog_id("ing1", "a")
    assert group_id("ing1", "a") != group_id("ing1", "b")


def test_broker_of_is_in_range_and_spreads_keys_over_every_broker():
    keys = [f"key-{i}" for i in range(400)]
    for brokers in (1, 2, 3, 7):
        got = [broker_of(k, brokers) for k in keys]
        assert all(0 <= b < brokers for b in got)
        assert set(got) == set(range(brokers))


def test_broker_of_is_stable():
    # pinned: the same key must go through the same broker in every process and every run
    # (a sha256 prefix, not Python's randomised hash)
    assert [broker_of(k, 7) for k in ("a", "b", "key-1", "42")] == [
        int(hashlib.sha256(k.encode()).hexdigest()[:8], 16) % 7 for k in ("a", "b", "key-1", "42")
    ]
    assert broker_of("a", 1000) == 0xCA978112 % 1000


# --- keys and ingest ids -----------------------------------------------------------------------


@pytest.mark.parametrize("value, text", [("k", "k"), ("", ""), (42, "42"), (-7, "-7"), (0, "0")])
def test_key_text_takes_strings_and_whole_numbers(value, text):
    assert key_text(value) == text


@pytest.mark.parametrize("value", [True, False, 1.0, 1.5, None, b"k", ["k"]])
def test_key_text_refuses_anything_else(value):
    with pytest.raises(InvalidArgument, match="conversation key"):
        key_text(value)


@pytest.mark.parametrize("ingest_id", ["ing-1", "a", "x" * MAX_INGEST_ID, "a b"])
def test_check_ingest_id_takes_a_plain_id(ingest_id):
    assert check_ingest_id(ingest_id) == ingest_id


@pytest.mark.parametrize(
    "ingest_id", ["", "a/b", " a", "a ", "\ta", "x" * (MAX_INGEST_ID + 1), None, 5, b"ing"]
)
def test_check_ingest_id_refuses_bad_ids(ingest_id):
    with pytest.raises(InvalidArgument, match="ingest_id"):
        check_ingest_id(ingest_id)


# --- body encoding -----------------------------------------------------------------------------


@pytest.mark.parametrize("body_type", [pa.binary(), pa.large_binary()])
def test_binary_bodies_are_kept_as_they_are(body_type):
    column = pa.array([b"\x00\xff", b"", None], body_type)
    assert encode_bodies(column, "json") == [b"\x00\xff", b"", None]


@pytest.mark.parametrize("body_type", [pa.string(), pa.large_string()])
def test_string_bodies_are_utf8_encoded(body_type):
    column = pa.array(["héllo", "", None], body_type)
    assert encode_bodies(column, "json") == ["héllo".encode(), b"", None]


STRUCTS = pa.array(
    [{"n": 1, "s": "é", "xs": [1, 2]}, None, {"n": None, "s": "t", "xs": []}],
    pa.struct([("n", pa.int64()), ("s", pa.string()), ("xs", pa.list_(pa.int64()))]),
)


def test_struct_bodies_as_compact_json():
    got = encode_bodies(STRUCTS, "json")

    assert got[0] == '{"n":1,"s":"é","xs":[1,2]}'.encode()
    assert got[1] is None
    assert json.loads(got[2]) == {"n": None, "s": "t", "xs": []}


def test_struct_bodies_as_msgpack():
    got = encode_bodies(STRUCTS, "msgpack")

    assert msgpack.unpackb(got[0]) == {"n": 1, "s": "é", "xs": [1, 2]}
    assert got[1] is None
    assert msgpack.unpackb(got[2]) == {"n": None, "s": "t", "xs": []}


def test_list_bodies_as_json():
    column = pa.array([[1, 2], None], pa.list_(pa.int64()))
    assert encode_bodies(column, "json") == [b"[1,2]", None]


@pytest.mark.parametrize("column", [pa.array([1, 2]), pa.array([1.5]), pa.array([True])])
def test_other_body_columns_are_refused(column):
    with pytest.raises(InvalidArgument, match="body column"):
        encode_bodies(column, "json")


# --- request ids -------------------------------------------------------------------------------


def test_request_id_is_the_same_for_the_same_spec_and_sends():
    sends = [("ing1/abc", 0, 3), ("ing1/def", 2, 1)]
    assert request_id(make_spec(), sends) == request_id(make_spec(), list(sends))
    assert request_id(make_spec(), sends).startswith("ingest/ing1/run1/")


def test_request_id_differs_per_run_ingest_and_sends():
    sends = [("ing1/abc", 0, 3)]
    base = request_id(make_spec(), sends)
    others = [
        request_id(make_spec(run="run2"), sends),
        request_id(make_spec(ingest_id="ing2"), sends),
        request_id(make_spec(), [("ing1/abc", 1, 3)]),
        request_id(make_spec(), [("ing1/abc", 0, 2)]),
        request_id(make_spec(), [("ing1/abd", 0, 3)]),
        request_id(make_spec(), [("ing1/abc", 0, 3), ("ing1/def", 0, 1)]),
    ]
    assert len({base, *others}) == 1 + len(others)


def test_planners_of_the_same_run_give_the_same_request_ids_and_a_new_run_new_ones():
    batches = [make_batch(ROWS_1), make_batch(ROWS_2)]

    def ids(spec):
        planner = PartitionPlanner(spec)
        return [c.request_id for b in batches for c in planner.calls(b)]

    first = ids(make_spec(batch_rows=2))
    assert ids(make_spec(batch_rows=2)) == first
    rerun = ids(make_spec(batch_rows=2, run="run2"))
    assert len(rerun) == len(first)
    assert not set(rerun) & set(first)


# --- the planner's calls -----------------------------------------------------------------------


def test_a_key_is_one_dialog_begun_if_absent_then_sent_at_its_first_sequence_number():
    planner = PartitionPlanner(make_spec())

    (call,) = planner.calls(make_batch(ROWS_1))
    handle_a, handle_b = dialog_id("ing1", "a"), dialog_id("ing1", "b")

    assert call.ops == [
        Begin("Init", "Target", "C", handle=handle_a, conversation_id=handle_a, if_absent=True),
        Send(handle_a, "Req", [b"a0", b"a1"], at=0),
        Begin("Init", "Target", "C", handle=handle_b, conversation_id=handle_b, if_absent=True),
        Send(handle_b, "Req", [b"b0", b"b1", b"b2"], at=0),
    ]
    assert (call.sender, call.rows) == (0, 5)

    (call,) = planner.calls(make_batch(ROWS_2))  # "b" continues at 3
    assert call.ops[1] == Send(handle_b, "Req", [b"b3", b"b4"], at=3)
    assert (planner.dialogs, planner.rows) == (3, 8)


def test_calls_are_cut_at_batch_rows_and_call_bytes():
    planner = PartitionPlanner(make_spec(batch_rows=2))
    calls = list(planner.calls(make_batch(ROWS_1)))
    assert [c.rows for c in calls] == [2, 2, 1]
    sends = [op for c in calls for op in c.ops if isinstance(op, Send)]
    assert [(s.bodies, s.at) for s in sends] == [
        ((b"a0", b"a1"), 0),
        ((b"b0", b"b1"), 0),
        ((b"b2",), 2),
    ]

    planner = PartitionPlanner(make_spec(call_bytes=5))  # bodies are 2 bytes: 2 per call
    assert [c.rows for c in planner.calls(make_batch(ROWS_1))] == [2, 2, 1]


def test_keys_are_spread_over_senders_by_broker_of():
    keys = [f"k{i}" for i in range(20)]
    planner = PartitionPlanner(make_spec(senders=3))

    calls = list(planner.calls(make_batch([(k, b"x") for k in keys])))

    assert sorted(c.sender for c in calls) == sorted({broker_of(k, 3) for k in keys})
    for call in calls:
        handles = {op.handle for op in call.ops if isinstance(op, Begin)}
        assert handles == {dialog_id("ing1", k) for k in keys if broker_of(k, 3) == call.sender}
        assert call.rows == len(handles)


def test_a_group_column_relates_each_dialog_to_the_groups_id():
    batch = make_batch(ROWS_1).append_column("grp", pa.array(["g1", "g1", "g2", "g2", "g2"]))
    (call,) = PartitionPlanner(make_spec(group="grp")).calls(batch)
    begins = [op for op in call.ops if isinstance(op, Begin)]
    assert [b.related_group for b in begins] == [group_id("ing1", "g1"), group_id("ing1", "g2")]


def test_whole_number_keys_name_the_dialog_of_their_text():
    batch = make_batch([(7, b"x"), (8, b"y")], key_type=pa.int64())
    (call,) = PartitionPlanner(make_spec()).calls(batch)
    assert [op.handle for op in call.ops if isinstance(op, Begin)] == [
        dialog_id("ing1", "7"),
        dialog_id("ing1", "8"),
    ]


# --- end to end against a core -----------------------------------------------------------------


def test_each_keys_rows_arrive_in_order_once_even_when_a_key_spans_batches(core):
    batches = [make_batch(ROWS_1), make_batch(ROWS_2)]

    results = apply_all(core, PartitionPlanner(make_spec(batch_rows=2)), batches)

    assert sum(r["sent"] for r in results) == 8
    assert received_by_key(core, "ing1", "abc") == EXPECTED


@pytest.mark.parametrize("batch_rows", [2, 3, 1000])
def test_a_rerun_sends_nothing_twice_however_it_cuts_the_rows(core, batch_rows):
    batches = [make_batch(ROWS_1), make_batch(ROWS_2)]
    apply_all(core, PartitionPlanner(make_spec(batch_rows=2)), batches)
    assert received_by_key(core, "ing1", "abc") == EXPECTED

    rerun = PartitionPlanner(make_spec(batch_rows=batch_rows, run="run2"))
    results = apply_all(core, rerun, batches)

    assert results and all(r["sent"] == 0 for r in results)
    assert receive_all(core, "TargetQ") == []


def test_a_retried_task_of_the_same_run_gets_its_first_answers_and_sends_nothing(core):
    batches = [make_batch(ROWS_1), make_batch(ROWS_2)]
    first = apply_all(core, PartitionPlanner(make_spec(batch_rows=2)), batches)
    receive_all(core, "TargetQ")

    again = apply_all(core, PartitionPlanner(make_spec(batch_rows=2)), batches)

    assert again == first
    assert receive_all(core, "TargetQ") == []


def test_a_rerun_after_a_partial_run_sends_exactly_the_rest(core):
    batches = [make_batch(ROWS_1), make_batch(ROWS_2)]
    planner = PartitionPlanner(make_spec(batch_rows=2))
    first_call = next(planner.calls(batches[0]))  # a0, a1: then the task dies
    core.apply(first_call.ops, request_id=first_call.request_id)

    results = apply_all(core, PartitionPlanner(make_spec(batch_rows=3, run="run2")), batches)

    assert sum(r["sent"] for r in results) == 6
    assert received_by_key(core, "ing1", "abc") == EXPECTED


# --- rejected rows -----------------------------------------------------------------------------


def test_rejected_rows_are_listed_and_the_rest_of_the_key_is_sent_consecutively(core):
    spec = make_spec(message_type=MessageType("Json", "json"), batch_rows=2)
    batches = [
        make_batch([("a", b"1"), ("k", b'{"i":0}'), ("k", b"not json")]),
        make_batch([("k", None), ("k", b'{"i":3}'), ("k", b'{"i":4}'), ("z", b"[]")]),
    ]
    planner = PartitionPlanner(spec)

    apply_all(core, planner, batches)

    # positions count every row of the key, rejected ones too, across batches
    assert [(r.key, r.position) for r in planner.rejected] == [("k", 1), ("k", 2)]
    not_json, null = planner.rejected
    assert "JSON" in not_json.reason
    assert null == Rejected("k", 2, "the body is null")
    assert received_by_key(core, "ing1", "akz") == {
        "a": [(0, b"1")],
        "k": [(0, b'{"i":0}'), (1, b'{"i":3}'), (2, b'{"i":4}')],
        "z": [(0, b"[]")],
    }
    assert planner.rows == 7


def test_a_rerun_rejects_the_same_rows_and_sends_nothing(core):
    spec = make_spec(message_type=MessageType("Json", "json"))
    batch = make_batch([("k", b"0"), ("k", b"bad"), ("k", b"2")])
    apply_all(core, PartitionPlanner(spec), [batch])
    receive_all(core, "TargetQ")

    rerun = PartitionPlanner(dataclasses.replace(spec, run="run2", batch_rows=1))
    results = apply_all(core, rerun, [batch])

    assert [(r.key, r.position) for r in rerun.rejected] == [("k", 1)]
    assert all(r["sent"] == 0 for r in results)
    assert receive_all(core, "TargetQ") == []


def test_a_key_whose_rows_are_all_rejected_makes_no_call():
    planner = PartitionPlanner(make_spec())
    assert list(planner.calls(make_batch([("k", None), ("k", None)]))) == []
    assert [(r.key, r.position) for r in planner.rejected] == [("k", 0), ("k", 1)]


def test_a_body_over_max_body_bytes_is_rejected_naming_the_limit(core):
    planner = PartitionPlanner(make_spec(max_body_bytes=4))
    batch = make_batch([("k", b"1234"), ("k", b"12345"), ("k", b"5678")])

    apply_all(core, planner, [batch])

    (rejected,) = planner.rejected
    assert (rejected.key, rejected.position) == ("k", 1)
    assert "max_body_bytes" in rejected.reason
    assert received_by_key(core, "ing1", "k") == {"k": [(0, b"1234"), (1, b"5678")]}


def test_map_bodies_as_json_objects():
    column = pa.array([[("a", 1), ("b", 2)], None], type=pa.map_(pa.string(), pa.int64()))
    assert encode_bodies(column, "json") == [b'{"a":1,"b":2}', None]


def test_a_key_whose_rows_come_back_later_in_a_partition_is_refused():
    planner = PartitionPlanner(make_spec())
    list(planner.calls(make_batch([("a", b"1"), ("b", b"2")])))

    with pytest.raises(InvalidArgument, match="not together"):
        list(planner.calls(make_batch([("a", b"3")])))


@pytest.mark.parametrize("body_type", [pa.binary(), pa.string()])
def test_bodies_of_a_slice_of_a_column_are_the_slices_own(body_type):
    values = [b"zero", b"", b"two", b"three!"]
    column = pa.array([v.decode() if body_type == pa.string() else v for v in values], body_type)

    assert encode_bodies(column.slice(1, 3), "json") == values[1:]
    assert encode_bodies(column.slice(4, 0), "json") == []


def test_a_pace_holds_each_call_until_the_rows_before_it_are_due():
    pace = Pace(100.0, start=10.0)
    assert pace.wait_s(0, now=10.0) == 0.0  # the first call goes at once
    assert pace.wait_s(50, now=10.2) == pytest.approx(0.3)  # 50 rows are due at 10.5
    assert pace.wait_s(50, now=11.0) == 0.0  # behind: no wait, and no burst saved up either
    assert pace.wait_s(200, now=11.0) == pytest.approx(1.0)


@pytest.mark.parametrize("rate", [0, -5.0, float("nan")])
def test_a_pace_needs_a_rate_above_zero(rate):
    with pytest.raises(InvalidArgument, match="above 0 rows a second"):
        Pace(rate, start=0.0)


def test_a_paced_sender_calls_ten_times_a_second_unless_told_its_call_size():
    assert call_rows(None, None) == 4000  # unpaced: as many rows a call as the default allows
    assert call_rows(None, 1500.0) == 150  # 1,500 rows a second: calls of 150, ten a second
    assert call_rows(None, 4.0) == 1  # never a call of no rows
    assert call_rows(20, 1500.0) == 20  # what the caller asked for
