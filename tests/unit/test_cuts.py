"""Long runs cut into segment rows (a queue's) and transmission rows by the limits: each row
holds as many bodies as fit, in order, none lost or repeated, a body over the byte limit in a
row of its own. The cuts are found by bisection; checked here against the rule read body by
body. No Ray, no store."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.store.segments import MAX_BYTES, MAX_MESSAGES, unpack
from actors.store.segments import segments as segments_of_runs
from actors.store.transmission import rows_of, unpack_parts

SIZES = st.one_of(st.integers(0, 600), st.integers(MAX_BYTES - 10, MAX_BYTES + 10))


def body_by_body(
    sizes: list[list[int]],
    held: int = 0,
    held_bytes: int = 0,
    most: int = MAX_MESSAGES,
    most_bytes: int = MAX_BYTES,
) -> list[list[int]]:
    """The rule as it reads: a body joins the open row when the row has room for it (`most`
    messages, `most_bytes` of bodies), or when the row is empty; else it opens a new row. Runs
    that go on from each other share rows."""
    rows: list[list[int]] = [[0] * held] if held else []
    size = held_bytes
    for run in sizes:
        for n in run:
            if rows and len(rows[-1]) < most and (size + n <= most_bytes):
                rows[-1].append(n)
                size += n
            else:
                rows.append([n])
                size = n
    return rows


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(SIZES, min_size=1, max_size=3 * MAX_MESSAGES), min_size=1, max_size=3))
def test_a_queues_runs_are_cut_into_segments_as_the_rule_reads(sizes):
    runs, first = [], 1
    for run in sizes:  # runs of one group and endpoint, each going on from the one before
        bodies = [bytes([len(runs)]) * n for n in run]
        runs.append((first, 1, 1, first - 1, "A", bodies, 0, 1.0, 2.0))
        first += len(run)

    segs = segments_of_runs(runs)

    got = [[len(m[3]) for m in unpack(s[0], s[6])] for s in segs]
    assert got == body_by_body(sizes)
    assert [m[3] for s in segs for m in unpack(s[0], s[6])] == [b for r in runs for b in r[5]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(SIZES, min_size=1, max_size=3 * MAX_MESSAGES), min_size=1, max_size=3))
def test_a_dialogs_runs_are_cut_into_transmission_rows_as_the_rule_reads(sizes):
    runs, first = [], 0
    for run in sizes:  # one endpoint's runs, each going on from the one before
        bodies = [bytes([len(runs)]) * n for n in run]
        runs.append((7, first, "A", bodies, "To", None, "", 1.0))
        first += len(run)

    rows = rows_of(runs, MAX_MESSAGES, MAX_BYTES)  # the rule at a segment's limits: small

    got = [[len(b) for b in unpack_parts(r[3])[1]] for r in rows]
    assert got == body_by_body(sizes)
    assert [r[1] for r in rows] == [sum(map(len, got[:i])) for i in range(len(got))]
    assert [b for r in rows for b in unpack_parts(r[3])[1]] == [b for r in runs for b in r[3]]
