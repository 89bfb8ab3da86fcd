"""Bundles as they travel between brokers (actors.transport.wire): whatever a sender packs, the
far broker reads back the same messages; runs without gaps, one type or one sent time travel as
one value; the far broker takes each run (one type, no gap) at once. No Ray, no store."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.transport.inbound import _run_end
from actors.transport.wire import Bundle, pack_bundles, read_bundle, unpack_bundles


@st.composite
def bundles(draw: st.DrawFn) -> Bundle:
    n = draw(st.integers(1, 30))
    first = draw(st.integers(0, 2**40))
    gaps = draw(st.lists(st.integers(1, 3), min_size=n - 1, max_size=n - 1))
    seqs = [first]
    for g in gaps:
        seqs.append(seqs[-1] + g)
    types = draw(st.lists(st.sampled_from(["Order", "Reply"]), min_size=n, max_size=n))
    sent = draw(st.lists(st.sampled_from([0.0, 1.5, 1700000000.25]), min_size=n, max_size=n))
    bodies = draw(st.lists(st.binary(max_size=20), min_size=n, max_size=n))
    return Bundle("conv", "From", "To", None, "A", True, "C", None, 8, seqs, types, bodies, sent)


@given(st.lists(bundles(), min_size=1, max_size=4))
def test_what_a_sender_packs_the_far_broker_reads_back_message_for_message(sent):
    raws = unpack_bundles(pack_bundles(sent))

    assert [read_bundle(raw) for raw in raws] == sent


def test_a_run_of_one_type_and_one_time_travels_as_three_values_not_three_lists():
    b = Bundle("conv", "From", "To", None, "A", True, "C", None, 8,
               [5, 6, 7], ["Order"] * 3, [b"a", b"b", b"c"], [2.5] * 3)  # fmt: skip

    [raw] = unpack_bundles(pack_bundles([b]))

    assert raw[9:13] == [5, "Order", [b"a", b"b", b"c"], 2.5]
    assert read_bundle(raw) == b


@given(bundles(), st.data())
def test_a_run_ends_at_the_first_gap_or_change_of_type(b, data):
    i = data.draw(st.integers(0, len(b.seqs) - 1))
    j = i
    while j + 1 < len(b.seqs) and b.types[j + 1] == b.types[i] and b.seqs[j + 1] == b.seqs[j] + 1:
        j += 1  # message by message, as the rule reads

    assert _run_end(b.seqs, b.types, i) == j


def test_numbers_that_only_look_like_a_run_at_their_ends_travel_whole_and_are_refused():
    b = Bundle("conv", "From", "To", None, "A", True, "C", None, 8,
               [0, 2, 1, 3], ["Order"] * 4, [b"a", b"b", b"c", b"d"], [2.5] * 4)  # fmt: skip

    [raw] = unpack_bundles(pack_bundles([b]))

    assert raw[9] == [0, 2, 1, 3]
    assert "seqs must be increasing" in read_bundle(raw)
