"""Segments (actors.store.segments): runs of message rows packed into one row and back."""

from __future__ import annotations

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from actors.runs import rows_of
from actors.store.segments import MAX_MESSAGES, cut, run_of, unpack, waiting_runs
from actors.store.segments import segments as segments_of_runs


def _row(i, group=1, endpoint=1, seq=None, mt="M", body=None, status=0, sent=1.0, arrived=2.0):
    body = f"m{i}".encode() if body is None else body
    return (i, group, endpoint, i if seq is None else seq, mt, body, status, sent, arrived)


def segments(rows):
    """The segments of message rows, each a run of one (a store upgraded from rows does this)."""
    return segments_of_runs([run_of(r) for r in rows])


def _back(segs) -> list[tuple]:
    """The message rows a list of segment rows holds."""
    out = []
    for first, last, group, endpoint, taken_to, _kept, parts in segs:
        msgs = list(unpack(first, parts))
        assert [m[0] for m in msgs] == list(range(first, last + 1))
        for i, seq, mt, body, sent, arrived in msgs:
            out.append((i, group, endpoint, seq, mt, body, int(i <= taken_to), sent, arrived))
    return out


def test_a_run_of_one_conversation_is_one_segment_with_its_fields_packed_once():
    rows = [_row(i) for i in range(1, 11)]
    [seg] = segments(rows)
    assert seg[:6] == (1, 10, 1, 1, 0, 0)
    assert _back([seg]) == rows


def test_a_new_segment_starts_at_another_group_endpoint_status_or_a_gap_in_ids():
    rows = [
        _row(1),
        _row(2),
        _row(3, endpoint=2),
        _row(4, group=2, endpoint=2),
        _row(6, group=2, endpoint=2),  # a gap
        _row(7, group=2, endpoint=2, status=1),
        _row(8, group=2, endpoint=2, status=1),
    ]
    segs = segments(rows)
    assert [(s[0], s[1]) for s in segs] == [(1, 2), (3, 3), (4, 4), (6, 6), (7, 8)]
    assert segs[-1][4:6] == (8, 1)  # received rows: taken and kept
    assert _back(segs) == rows


def test_messages_that_differ_in_type_sequence_and_times_keep_each_their_own():
    rows = [
        _row(1, seq=5, mt="A", sent=1.0, arrived=9.0),
        _row(2, seq=-1, mt="EndDialog", sent=1.5, arrived=9.0),
        _row(3, seq=7, mt="A", sent=1.0, arrived=9.5),
    ]
    assert _back(segments(rows)) == rows


def test_a_long_run_is_cut_at_the_segment_limit():
    segs = segments([_row(i) for i in range(1, 2 * MAX_MESSAGES + 2)])
    assert [(s[0], s[1]) for s in segs] == [
        (1, MAX_MESSAGES),
        (MAX_MESSAGES + 1, 2 * MAX_MESSAGES),
        (2 * MAX_MESSAGES + 1, 2 * MAX_MESSAGES + 1),
    ]


def test_waiting_runs_skip_what_was_taken_and_what_came_before_a_position():
    [seg] = segments([_row(i) for i in range(1, 6)])
    first, _, _, endpoint, _, _, parts = seg
    assert waiting_runs((first, endpoint, 2, parts)) == [
        (3, 1, 3, "M", [b"m3", b"m4", b"m5"], 1.0, 2.0)
    ]
    assert waiting_runs((first, endpoint, 2, parts), after_id=4) == [
        (5, 1, 5, "M", [b"m5"], 1.0, 2.0)
    ]
    assert waiting_runs((first, endpoint, 5, parts)) == []


def test_a_segment_whose_messages_differ_is_waiting_as_as_many_runs_as_it_takes():
    rows = [
        _row(1, seq=4, mt="A", sent=1.0),
        _row(2, seq=5, mt="A", sent=1.0),
        _row(3, seq=-1, mt="EndDialog", sent=1.5),
        _row(4, seq=6, mt="A", sent=1.5),
    ]
    [seg] = segments([(*r[:6], 0, *r[7:]) for r in rows])
    first, _, _, endpoint, _, _, parts = seg
    runs = waiting_runs((first, endpoint, 1, parts))
    assert [len(r[4]) for r in runs] == [1, 1, 1]
    assert rows_of(runs) == [
        (i, ep, seq, mt, b, se, a) for i, _, ep, seq, mt, b, _, se, a in rows[1:]
    ]


def test_a_cut_segment_is_two_that_hold_the_same_messages_and_marks():
    [seg] = segments([_row(i) for i in range(1, 7)])
    seg = (*seg[:4], 2, 1, seg[6])  # 1 and 2 received and kept
    head, tail = cut(seg, 3)
    assert (head[:6], tail[:6]) == ((1, 2, 1, 1, 2, 1), (3, 6, 1, 1, 2, 1))
    assert _back([head, tail]) == _back([seg])


@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.integers(1, 3), st.booleans(), st.binary(max_size=8)),
        max_size=40,
    )
)
def test_any_rows_come_back_as_they_went_in(spec):
    rows, i = [], 0
    for group, endpoint, gap, body in spec:
        i += 2 if gap else 1
        rows.append(_row(i, group=group, endpoint=endpoint, body=body, seq=i % 5))
    assert _back(segments(rows)) == rows


def test_the_runs_of_one_conversations_sends_join_and_their_fields_are_packed_once():
    runs = [(1, 1, 1, 0, "A", [b"a", b"b"], 0, 1.0, 2.0), (3, 1, 1, 2, "A", [b"c"], 0, 1.0, 2.0)]
    runs.append((4, 1, 1, -1, "EndDialog", [b""], 0, 1.5, 2.0))  # the broker's own: no sequence
    [seg] = segments_of_runs(runs)
    assert seg[:2] == (1, 4)
    assert [m[1:4] for m in unpack(1, seg[6])] == [
        (0, "A", b"a"),
        (1, "A", b"b"),
        (2, "A", b"c"),
        (-1, "EndDialog", b""),
    ]
    [one] = segments_of_runs(runs[:2])
    # bodies, then one type, the first sequence number, one send time, one arrival time
    assert msgpack.unpackb(one[6]) == [[b"a", b"b", b"c"], "A", 0, 1.0, 2.0]


def test_a_run_longer_than_the_limit_is_cut_and_its_sequence_numbers_go_on():
    [a, b] = segments_of_runs([(10, 1, 1, 5, "A", [b"x"] * (MAX_MESSAGES + 3), 0, 1.0, 1.0)])
    assert (a[0], a[1], b[0], b[1]) == (10, 9 + MAX_MESSAGES, 10 + MAX_MESSAGES, 12 + MAX_MESSAGES)
    assert [m[1] for m in unpack(b[0], b[6])] == [5 + MAX_MESSAGES + i for i in range(3)]
