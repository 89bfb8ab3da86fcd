"""The delivery audit's stored format (actors.store.audit): whatever a commit encodes, its records
come back message for message, columns its messages share stored as one value; records written
before (a list per column, no count) read as they did. No Ray, no store."""

from __future__ import annotations

from types import SimpleNamespace

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from actors.runs import runs_of
from actors.store.audit import encode_group, encode_run, pack, records, sender

BROKER = "broker-1"
ENDPOINTS = {
    no: SimpleNamespace(
        no=no,
        conversation_id=f"conv-{no}",
        is_initiator=False,
        far_service="Shop",
        service="Sales",
        far_broker=None,
    )  # fmt: skip
    for no in (1, 2, 3)
}
SENDERS = {no: sender(ep, BROKER) for no, ep in ENDPOINTS.items()}

rows_st = st.lists(
    st.tuples(
        st.sampled_from([1, 2, 3]),  # endpoint
        st.sampled_from([-1, 0, 1, 2, 3, 5, 9]),  # sequence number (-1: the broker's own)
        st.sampled_from(["Order", "EndDialog"]),
        st.sampled_from([1.5, 2.5]),  # sent
        st.sampled_from([3.0, 4.0]),  # arrived
    ),
    min_size=1,
    max_size=12,
)


@given(st.lists(rows_st, min_size=1, max_size=3))
def test_a_commits_groups_come_back_message_for_message(groups):
    encoded = [
        encode_group(
            BROKER,
            "Q",
            10.0,
            11.0,
            SENDERS,
            runs_of(
                [
                    (i, ep, seq, mt, b"body", sent, arrived)
                    for i, (ep, seq, mt, sent, arrived) in enumerate(rows)
                ]
            ),
        )  # fmt: skip
        for rows in groups
    ]

    got = records(pack(encoded))

    expected = [row for rows in groups for row in rows]
    assert [
        (
            int(r["conversation_id"][5:]),
            r["sequence_number"],
            r["message_type"],
            r["sent_at"],
            r["arrived_at"],
        )  # fmt: skip
        for r in got
    ] == expected
    assert all(r["message_id"].endswith(f"/i/{r['sequence_number']}") for r in got)


def test_a_group_of_one_run_is_stored_as_one_value_per_column():
    run = (100, 2, 7, "Order", [b"a", b"b", b"c"], 1.5, 3.0)
    [stored] = msgpack.unpackb(pack([encode_group(BROKER, "Q", 10.0, 11.0, SENDERS, [run])]),
                               raw=False, strict_map_key=False)  # fmt: skip
    assert stored[5:] == [2, 7, "Order", 1.5, 3.0, 3]
    assert [r["sequence_number"] for r in records(pack([encode_group(BROKER, "Q", 10.0, 11.0,
            SENDERS, [run])]))] == [7, 8, 9]  # fmt: skip


def test_a_run_passed_on_is_stored_as_one_value_per_column_and_read_as_its_messages():
    run = encode_run(BROKER, "Q", 7.0, ENDPOINTS[2], "Order", 40, 3, 6.5)

    [stored] = msgpack.unpackb(pack([run]), raw=False, strict_map_key=False)
    got = records(pack([run]))

    assert stored[5:] == [2, 40, "Order", 6.5, 7.0, 3]
    assert [(r["sequence_number"], r["sent_at"], r["committed_at"]) for r in got] == [
        (40, 6.5, 7.0),
        (41, 6.5, 7.0),
        (42, 6.5, 7.0),
    ]


def test_a_record_written_before_the_count_reads_as_it_did():
    old = [[BROKER, "Q", 10.0, 11.0, {1: list(SENDERS[1])}, [1, 1], [0, 1], ["Order"] * 2,
            [1.5, 1.5], [3.0, 3.0]]]  # fmt: skip

    got = records(msgpack.packb(old, use_bin_type=True))

    assert [(r["message_id"], r["received_at"]) for r in got] == [
        ("conv-1/i/0", 10.0),
        ("conv-1/i/1", 10.0),
    ]


def test_a_group_of_several_runs_is_stored_a_value_per_run_not_per_message():
    runs = [
        (100, 1, 0, "Order", [b"a"] * 10, 1.5, 3.0),
        (110, 2, 4, "Order", [b"b"] * 10, 1.5, 3.0),
        (120, 1, 10, "Order", [b"c"] * 10, 2.5, 4.0),  # a later send: other times
    ]
    group = encode_group(BROKER, "Q", 10.0, 11.0, SENDERS, runs)

    [stored] = msgpack.unpackb(pack([group]), raw=False, strict_map_key=False)
    got = records(pack([group]))

    # columns the runs share are one value, the others one per run; the runs' lengths end it
    assert stored[5:] == [[1, 2, 1], [0, 4, 10], "Order", [1.5, 1.5, 2.5], [3.0, 3.0, 4.0],
                          [10, 10, 10]]  # fmt: skip
    assert [(int(r["conversation_id"][5:]), r["sequence_number"], r["sent_at"]) for r in got] == (
        [(1, s, 1.5) for s in range(10)]
        + [(2, s, 1.5) for s in range(4, 14)]
        + [(1, s, 2.5) for s in range(10, 20)]
    )


def test_a_group_of_several_runs_written_a_value_per_message_reads_as_it_did():
    # the previous release's form: a list per message where the messages differ, then the count
    old = [[BROKER, "Q", 10.0, 11.0, {1: list(SENDERS[1]), 2: list(SENDERS[2])}, [1, 2, 2],
            [5, -1, -1], "Order", 1.5, [3.0, 4.0, 4.0], 3]]  # fmt: skip

    got = records(msgpack.packb(old, use_bin_type=True))

    assert [(r["message_id"], r["arrived_at"]) for r in got] == [
        ("conv-1/i/5", 3.0),
        ("conv-2/i/-1", 4.0),
        ("conv-2/i/-1", 4.0),
    ]
