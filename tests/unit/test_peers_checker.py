"""The peers bench's exactly-once / order checker, on hand-built acknowledgement logs."""

from __future__ import annotations

from actors.tools.bench.peers.checker import EXAMPLES, check

EXPECTED = {0: 3, 1: 2}  # conversation 0: seq 0..2, conversation 1: seq 0..1
CLEAN = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]


def test_every_message_once_in_order_is_clean():
    verdict = check(EXPECTED, CLEAN)
    assert (verdict.lost, verdict.doubled, verdict.out_of_order) == (0, 0, 0)
    assert verdict.clean and verdict.describe() == ""


def test_conversations_interleave_freely():
    # order is per conversation: conversation 1 may finish before conversation 0 starts
    assert check(EXPECTED, [(1, 0), (1, 1), (0, 0), (0, 1), (0, 2)]).clean


def test_a_message_never_acknowledged_is_lost():
    verdict = check(EXPECTED, [a for a in CLEAN if a != (0, 1)])
    assert (verdict.lost, verdict.doubled, verdict.out_of_order) == (1, 0, 0)
    assert verdict.examples["lost"] == [(0, 1)]
    assert "lost (0, 1)" in verdict.describe()


def test_a_message_acknowledged_twice_is_doubled():
    verdict = check(EXPECTED, [*CLEAN[:3], (1, 0), *CLEAN[3:]])
    assert (verdict.lost, verdict.doubled, verdict.out_of_order) == (0, 1, 0)
    assert verdict.examples["doubled"] == [(1, 0)]


def test_a_message_never_sent_is_doubled():
    # acknowledged once more than it was sent (zero times): a seq past the end, an unknown conv
    verdict = check(EXPECTED, [*CLEAN, (0, 3), (7, 0)])
    assert (verdict.lost, verdict.doubled, verdict.out_of_order) == (0, 2, 0)
    assert verdict.examples["doubled"] == [(0, 3), (7, 0)]


def test_two_messages_swapped_are_one_out_of_order():
    swapped = [(0, 1), (1, 0), (0, 0), (1, 1), (0, 2)]  # (0, 0) after (0, 1)
    verdict = check(EXPECTED, swapped)
    assert (verdict.lost, verdict.doubled, verdict.out_of_order) == (0, 0, 1)
    assert verdict.examples["out_of_order"] == [(0, 0)]


def test_a_late_message_counts_once_and_the_rest_stay_in_order():
    late = [(0, 1), (0, 2), (0, 0), (1, 0), (1, 1)]
    verdict = check(EXPECTED, late)
    assert verdict.out_of_order == 1 and verdict.examples["out_of_order"] == [(0, 0)]


def test_a_redelivery_after_later_messages_is_doubled_not_out_of_order():
    verdict = check(EXPECTED, [*CLEAN, (0, 0)])
    assert (verdict.lost, verdict.doubled, verdict.out_of_order) == (0, 1, 0)


def test_loss_double_and_inversion_together_are_each_counted():
    log = [(0, 2), (0, 0), (0, 0), (1, 1)]  # (0, 1) and (1, 0) lost; (0, 0) twice and late
    verdict = check(EXPECTED, log)
    assert (verdict.lost, verdict.doubled, verdict.out_of_order) == (2, 1, 1)
    assert verdict.examples == {
        "lost": [(0, 1), (1, 0)],
        "doubled": [(0, 0)],
        "out_of_order": [(0, 0)],
    }


def test_examples_are_capped_but_counts_are_not():
    verdict = check({0: 100}, [])
    assert verdict.lost == 100 and len(verdict.examples["lost"]) == EXAMPLES
