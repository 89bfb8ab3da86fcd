"""The transmission queue kept a run at a time (actors.store.transmission): one transaction's
messages on one endpoint are one row; acknowledgements that cover part of a row keep the rest;
what goes in comes out, in order. Real SQLite, no Ray."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.store import transmission
from actors.store.database import Store
from actors.store.segments import MAX_BYTES, MAX_MESSAGES
from actors.store.transmission import DUE_PROBE, ROW_BYTES, ROW_MESSAGES, rows_of
from actors.transport.outbound import Outbound


@pytest.fixture
def store() -> Iterator[Store]:
    s = Store(":memory:")
    yield s
    s.close()


@pytest.fixture(params=[DUE_PROBE, 1], ids=["few-due-by-index", "many-due-in-row-order"])
def probe(request, monkeypatch) -> int:
    """Both ways a pass finds due rows: by the due-time index when few are due, else in row
    order (with a probe of 1, any due row makes it "many")."""
    monkeypatch.setattr(transmission, "DUE_PROBE", request.param)
    return request.param


def _run(ep: int, first: int, bodies: list[bytes], mt: str = "M", status: str = "w") -> tuple:
    return (ep, first, mt, bodies, "There", None, status, 1.0)


def _messages(store: Store, ep: int) -> list[tuple[int, str, bytes]]:
    return [
        (seq, mt, body)
        for row in store.endpoint_transmission(ep)
        for seq, mt, body in zip(row.seqs, row.types, row.bodies, strict=True)
    ]


def test_one_transactions_runs_on_one_endpoint_are_one_row_and_other_endpoints_their_own():
    rows = rows_of(
        [
            _run(1, 0, [b"a", b"b"]),
            _run(2, 7, [b"x"]),
            _run(1, 2, [b"c"], mt="N"),  # goes on from the first: same row, its own type
            _run(1, 5, [b"f"]),  # a gap: a row of its own
            _run(2, 8, [b"y"], status="other"),  # another status: a row of its own
        ]
    )
    assert [(r[0], r[1], r[2]) for r in rows] == [(1, 0, 2), (2, 7, 7), (1, 5, 5), (2, 8, 8)]


def test_a_batch_of_a_thousand_is_one_row_though_it_is_four_segments_long(store):
    # a row's messages go and are retried together: a sender's batch is written, read back,
    # sent and deleted as one row (a queue cuts the same run into segments of 256)
    bodies = [b"x" * 100] * 1000
    assert len(bodies) > 3 * MAX_MESSAGES and 100 * len(bodies) > MAX_BYTES
    with store.tx():
        store.insert_transmission([_run(1, 0, bodies)])
    [row] = store.endpoint_transmission(1)
    assert (row.first_seq, row.last_seq, row.bodies) == (0, 999, bodies)


def test_a_run_longer_than_a_row_is_cut_where_the_limits_say(store):
    bodies = [b"%d" % i for i in range(ROW_MESSAGES * 2 + 3)]
    big = [b"x" * (ROW_BYTES // 2 + 1)] * 3  # two of them do not fit one row
    with store.tx():
        store.insert_transmission([_run(1, 0, bodies), _run(2, 0, big)])
    spans = [(r.first_seq, r.last_seq) for r in store.endpoint_transmission(1)]
    n = ROW_MESSAGES
    assert spans == [(0, n - 1), (n, 2 * n - 1), (2 * n, 2 * n + 2)]
    assert [len(r.bodies) for r in store.endpoint_transmission(2)] == [1, 1, 1]
    assert [b for _, _, b in _messages(store, 1)] == bodies
    assert store.transmission_depth() == len(bodies) + 3


@pytest.mark.parametrize(
    "acked, left",
    [
        ((0, 3), [4, 5, 6, 7, 8, 9]),  # a prefix: the usual partial answer
        ((6, 9), [0, 1, 2, 3, 4, 5]),
        ((3, 5), [0, 1, 2, 6, 7, 8, 9]),  # inside the row: it is cut in two
        ((0, 9), []),
        ((12, 15), list(range(10))),  # another row's numbers: nothing of this one goes
    ],
)
def test_an_acknowledgement_of_part_of_a_row_keeps_exactly_the_rest_in_order(store, acked, left):
    with store.tx():
        store.insert_transmission([_run(1, 0, [b"m%d" % i for i in range(10)])])
        store.insert_transmission([_run(1, 10, [b"m10", b"m11"])])  # a newer row
        store.fail_transmission([r.id for r in store.endpoint_transmission(1)], "down", 5.0)
    with store.tx():
        store.delete_acknowledged([(1, *acked)])
    kept = [seq for seq, _, _ in _messages(store, 1)]
    assert kept == [*left, 10, 11]
    assert [b for seq, _, b in _messages(store, 1)] == [b"m%d" % s for s in kept]
    assert store.endpoint_transmission(1)[0].first_seq == kept[0]
    # what is left keeps its status and attempts (it is the same messages' history)
    assert {r[7] for r in store.transmission_messages(100)} == {"down"}
    assert {r[9] for r in store.transmission_messages(100)} == {1}
    if left:  # the rest answered in a later range of the same answer
        with store.tx():
            store.delete_acknowledged([(1, left[0], left[-1]), (1, 10, 10)])
        assert [seq for seq, _, _ in _messages(store, 1)] == [11]


def test_a_batch_knows_which_acknowledged_ranges_begin_and_end_on_its_rows_edges():
    batch = Outbound([], spans=[(1, 0, 4), (1, 5, 9), (2, 0, 0)])
    ranges = [(1, 0, 9), (1, 5, 9), (1, 0, 3), (1, 2, 9), (2, 0, 0), (3, 0, 0), (2, 0, 4)]
    assert batch.on_edges(ranges) == {(1, 0, 9), (1, 5, 9), (2, 0, 0)}


def test_one_answer_whose_ranges_together_cover_a_row_takes_it_all(store):
    with store.tx():
        store.insert_transmission([_run(1, 0, [b"m%d" % i for i in range(10)])])
    with store.tx():  # neither range covers the row alone
        store.delete_acknowledged([(1, 0, 5), (1, 6, 9)])
    assert store.endpoint_transmission(1) == [] and store.transmission_depth() == 0


def test_due_rows_come_in_queue_order_up_to_about_the_limit_and_skip_endpoints_being_sent(
    store, probe
):
    with store.tx():
        store.insert_transmission([_run(1, 0, [b"a"] * 5), _run(2, 0, [b"b"] * 5)])
        store.insert_transmission([_run(3, 0, [b"c"] * 5)])
    assert [r.endpoint_no for r in store.due_transmission(10.0, 6)] == [1, 2]
    assert [r.endpoint_no for r in store.due_transmission(10.0, 100, skip=[2])] == [1, 3]
    with store.tx():
        store.fail_transmission([r.id for r in store.endpoint_transmission(1)], "x", 10.0)
    assert [r.endpoint_no for r in store.due_transmission(10.0, 100)] == [2, 3]
    with store.tx():
        assert store.retry_now(1) == 5  # messages, not rows
    assert [r.endpoint_no for r in store.due_transmission(10.0, 100)] == [1, 2, 3]


def test_rows_behind_an_older_row_still_backing_off_are_not_due(store, probe):
    with store.tx():
        store.insert_transmission([_run(1, 0, [b"a0", b"a1"]), _run(2, 0, [b"x"])])
    with store.tx():
        store.insert_transmission([_run(1, 2, [b"a2"])])
    [_, behind] = store.endpoint_transmission(1)
    with store.tx():  # the second row of dialog 1 failed; a newer one comes after it
        store.fail_transmission([behind.id], "down", 10.0)
        store.insert_transmission([_run(1, 3, [b"a3"])])
    due = store.due_transmission(10.0, 100)
    assert [(r.endpoint_no, r.first_seq) for r in due] == [(1, 0), (2, 0)]
    later = store.due_transmission(20.0, 100)  # its backoff over: all of it, in order
    assert [(r.endpoint_no, r.first_seq) for r in later] == [(1, 0), (2, 0), (1, 2), (1, 3)]


def test_among_many_rows_backing_off_the_few_due_come_back_in_row_order(store, probe):
    # a far broker down: its dialogs' rows back off; another's rows are due between them
    with store.tx():
        store.insert_transmission([_run(ep, 0, [b"x"]) for ep in range(1, 301)])
        down = [r.id for ep in range(1, 301) if ep % 100 for r in store.endpoint_transmission(ep)]
        store.fail_transmission(down, "down", 10.0)
    due = store.due_transmission(10.0, 100)
    assert [r.endpoint_no for r in due] == [100, 200, 300]
    assert store.due_transmission(10.0, 100, skip=[200]) == [due[0], due[2]]
    assert len(store.due_transmission(10.0 + 3600, 10**6)) == 300  # every backoff over


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.integers(1, 300), st.sampled_from(["M", "N"])),
        min_size=1,
        max_size=12,
    ),
    st.lists(st.tuples(st.integers(1, 3), st.integers(0, 400), st.integers(0, 60)), max_size=6),
    st.booleans(),
)
def test_every_message_put_in_comes_out_once_in_order_whatever_is_acknowledged(
    sends, acks, sent_as_batch
):
    store = Store(":memory:")
    try:
        next_seq: dict[int, int] = {}
        sent: dict[int, list[tuple[int, str, bytes]]] = {}
        for k in range(0, len(sends), 3):  # a few sends per transaction
            with store.tx():
                runs = []
                for ep, n, mt in sends[k : k + 3]:
                    first = next_seq.get(ep, 0)
                    bodies = [b"%d-%d" % (ep, first + i) for i in range(n)]
                    runs.append(_run(ep, first, bodies, mt))
                    sent.setdefault(ep, []).extend((first + i, mt, b) for i, b in enumerate(bodies))
                    next_seq[ep] = first + n
                store.insert_transmission(runs)
        ranges = [(ep, first, first + n) for ep, first, n in acks]
        on_edges: set[tuple[int, int, int]] = set()
        if sent_as_batch:  # the rows went out as one batch: the ranges on its rows' edges
            rows = store.due_transmission(0.0, 10**9)
            batch = Outbound([], spans=[(r.endpoint_no, r.first_seq, r.last_seq) for r in rows])
            on_edges = batch.on_edges(ranges)
        with store.tx():  # one answer: its ranges in one call
            store.delete_acknowledged(ranges, on_edges)
        for ep, first, length in acks:
            sent[ep] = [m for m in sent.get(ep, []) if not first <= m[0] <= first + length]
        for ep, msgs in sent.items():
            assert _messages(store, ep) == msgs
        assert store.transmission_depth() == sum(map(len, sent.values()))
    finally:
        store.close()
