"""`raybroker verify`'s own checker on hand-built histories (lost, doubled, out of order, each by
id and conversation; the deliberate injections; recovery times), its bad input against a real
in-process broker, and the workload's sender and collector end to end on a `LocalBroker`."""

from __future__ import annotations

import random
import time

import pytest

from actors import Activation, Contract, LocalBroker, MessageType, Queue, Service
from actors.calls.envelope import Begin, Send
from actors.errors import InvalidArgument
from actors.tools.verify.checker import (
    Reply,
    Sent,
    check,
    first_reply_at,
    inject,
    recovered_at,
    self_test,
)
from actors.tools.verify.history import History
from actors.tools.verify.malformed import EXPECTED, Malformed
from actors.tools.verify.report import build, failures, handlers_seen, table
from actors.tools.verify.topology import (
    CONTRACT,
    HANDLER,
    HANDLER_MODULE,
    MAX_BODY,
    PATHS,
    REPLY,
    REQUEST,
)
from actors.tools.verify.workload import Collector, Gates, Sender, begin_streams
from tests.polling import wait_until


def history(streams: dict[str, int]) -> tuple[list[Sent], list[Reply]]:
    """Every message of each stream sent and answered once, in order, streams interleaved."""
    sent = [
        Sent(f"{name}:{k}", name, k, f"conv-{name}")
        for name, n in streams.items()
        for k in range(n)
    ]
    replies, t = [], 0.0
    for k in range(max(streams.values())):
        for name, n in streams.items():
            if k < n:
                t += 1.0
                replies.append(Reply(f"{name}:{k}", f"conv-{name}", k, t))
    return sent, replies


def test_a_clean_history_has_nothing_lost_doubled_or_out_of_order():
    sent, replies = history({"direct/0": 5, "routed/1": 3, "spark/0": 4})
    v = check(sent, replies)
    assert v.ok and (v.messages, v.delivered) == (12, 12)
    assert (len(v.lost), len(v.doubled), len(v.out_of_order), len(v.unexpected)) == (0, 0, 0, 0)


def test_a_missing_reply_is_lost_by_id_and_conversation():
    sent, replies = history({"direct/0": 5, "direct/1": 5})
    v = check(sent, [r for r in replies if r.id != "direct/1:3"])
    assert v.lost == [{"id": "direct/1:3", "stream": "direct/1", "conversation": "conv-direct/1"}]
    assert not v.doubled and not v.out_of_order and v.delivered == 9


def test_a_second_reply_is_doubled_and_not_also_out_of_order():
    sent, replies = history({"direct/0": 5})
    v = check(sent, [*replies, replies[1]])
    assert v.doubled == [
        {"id": "direct/0:1", "stream": "direct/0", "conversation": "conv-direct/0", "times": 2}
    ]
    assert not v.lost and not v.out_of_order


def test_a_reply_after_a_later_ones_is_out_of_order_within_its_stream_only():
    sent, replies = history({"a/0": 4, "b/0": 4})
    a = [r for r in replies if r.id.startswith("a/")]
    b = [r for r in replies if r.id.startswith("b/")]
    # all of b before all of a is fine (streams are independent); within a, 2 comes before 1
    v = check(sent, [*b, a[0], a[2], a[1], a[3]])
    assert v.out_of_order == [
        {"id": "a/0:1", "stream": "a/0", "conversation": "conv-a/0", "after": "a/0:2"}
    ]
    assert not v.lost and not v.doubled


def test_a_reply_nobody_sent_is_unexpected():
    sent, replies = history({"a/0": 2})
    v = check(sent, [*replies, Reply("ghost:0", "conv-x", 0, 9.0)])
    assert v.unexpected == [{"id": "ghost:0", "conversation": "conv-x"}] and not v.ok


def test_a_stream_the_sender_cannot_name_is_named_by_its_replies():
    sent = [Sent("spark/3:0", "spark/3", 0), Sent("spark/3:1", "spark/3", 1)]
    v = check(sent, [Reply("spark/3:0", "ingest-1/3", 0, 1.0)])
    assert v.lost == [{"id": "spark/3:1", "stream": "spark/3", "conversation": "ingest-1/3"}]


@pytest.mark.parametrize(
    "kind, count", [("lose", "lost"), ("double", "doubled"), ("invert", "out_of_order")]
)
def test_each_injection_is_reported_exactly_and_by_the_id_it_touched(kind, count):
    sent, replies = history({f"p/{i}": 6 for i in range(4)})
    changed, done = inject(sent, replies, [kind], seed=11)
    report = check(sent, changed).as_dict()
    counts = {k: report[k] for k in ("lost", "doubled", "out_of_order", "unexpected")}
    assert counts == {"lost": 0, "doubled": 0, "out_of_order": 0, "unexpected": 0} | {count: 1}
    [what] = done
    assert what["kind"] == kind and report[f"{count}_ids"][0]["id"] == what["id"]
    assert report[f"{count}_ids"][0]["conversation"] == f"conv-{what['stream']}"


def test_all_three_injections_at_once_touch_three_streams():
    sent, replies = history({f"p/{i}": 6 for i in range(5)})
    changed, done = inject(sent, replies, ["lose", "double", "invert"], seed=2)
    v = check(sent, changed)
    assert (len(v.lost), len(v.doubled), len(v.out_of_order)) == (1, 1, 1)
    assert len({d["stream"] for d in done}) == 3
    assert inject(sent, replies, ["lose", "double", "invert"], seed=2) == (changed, done)


def test_injection_refuses_unknown_kinds_and_too_small_histories():
    sent, replies = history({"p/0": 3})
    with pytest.raises(InvalidArgument, match="steal"):
        inject(sent, replies, ["steal"], 1)
    with pytest.raises(InvalidArgument, match="needs 2 stream"):
        inject(sent, replies, ["lose", "double"], 1)


def test_the_self_test_names_exactly_what_it_put_into_a_copy_of_the_history():
    sent, replies = history({f"p/{i}": 6 for i in range(5)})
    t = self_test(sent, replies, seed=3)
    assert t["caught"] is True and sorted(d["kind"] for d in t["injected"]) == [
        "double",
        "invert",
        "lose",
    ]
    assert t["found"] == {d["kind"]: [d["id"]] for d in t["injected"]}
    assert check(sent, replies).ok  # the history itself is untouched


def test_the_self_test_looks_past_what_the_run_itself_got_wrong():
    sent, replies = history({f"p/{i}": 6 for i in range(5)})
    lossy = [r for r in replies if r.id != "p/0:2"]  # the run lost one message
    t = self_test(sent, lossy, seed=3)
    assert t["caught"] is True and "p/0:2" not in t["found"]["lose"]


def test_a_checker_that_misses_what_was_put_into_its_input_fails_the_run():
    sent, replies = history({"a/0": 3})
    blind = {"injected": [{"kind": "lose", "id": "a/0:1", "stream": "a/0"}], "caught": False}
    r = build(planned=3, verdict=check(sent, replies), faults=[], extra={"errors": [],
              "checker_self_test": blind})  # fmt: skip
    assert not r["passed"] and r["failures"] == [
        "the checker missed a loss, double or inversion put into its input on purpose"
    ]
    assert "MISSED lose put into its input" in "\n".join(table(r))


def test_a_history_too_small_to_touch_skips_the_self_test_and_says_why():
    sent, replies = history({"p/0": 3})
    t = self_test(sent, replies, seed=1)
    assert t["caught"] is None and "needs 3 stream" in t["skipped"]
    r = build(planned=3, verdict=check(sent, replies), faults=[],
              extra={"errors": [], "checker_self_test": t})  # fmt: skip
    assert r["passed"] and "skipped: inject: needs 3 stream" in "\n".join(table(r))


def test_recovery_is_when_every_affected_stream_answered_a_message_sent_after_the_fault():
    flow = {"a": [(0, 1.0), (1, 2.0), (3, 7.0), (2, 6.0)], "b": [(0, 1.5), (1, 4.0)], "c": []}
    assert first_reply_at(flow["a"], 2) == 6.0  # the earliest of those at or after the mark
    marks = {"a": 2, "b": 1, "c": 0}
    # c sent nothing after the fault: it does not count
    assert recovered_at(marks, {"a": 4, "b": 2, "c": 0}, flow) == 6.0
    # b sent more after the fault but none of it was answered yet
    assert recovered_at({"a": 2, "b": 2}, {"a": 4, "b": 3}, flow) is None
    # nothing sent after the fault anywhere: nothing shows recovery yet
    assert recovered_at({"a": 4}, {"a": 4}, flow) is None


def test_history_tracks_flow_and_what_waits_for_a_reply():
    h = History()
    h.record_sent([Sent("direct/0:0", "direct/0", 0), Sent("direct/0:1", "direct/0", 1)])
    h.record_replies([Reply("direct/0:0", "c", 0, 5.0)])
    assert h.unconfirmed() == 1 and h.recovered_at({"direct/0": 1}) is None
    h.record_replies([Reply("direct/0:1", "c", 1, 6.0), Reply("direct/0:1", "c", 1, 7.0)])
    assert h.unconfirmed() == 0 and h.recovered_at({"direct/0": 1}) == 6.0
    assert h.counts() == {"sent": 2, "confirmed": 2, "replies": 3}
    assert h.wait_outstanding_below(0, time.monotonic())


def test_the_report_passes_only_when_every_check_holds():
    sent, replies = history({"a/0": 3})
    ok = build(planned=3, verdict=check(sent, replies), faults=[], extra={"errors": []})
    assert ok["passed"] and ok["failures"] == [] and ok["messages"] == 3
    faults = [{"kind": "node_removed", "target": "vf-store", "at_s": 1.0, "recovered_s": None}]
    extra = {
        "errors": [],
        "malformed_not_refused_count": 2,
        "handlers": handlers_seen([b'{"count": 2, "bad": 1, "last": {}}', None]),
    }
    bad = build(planned=4, verdict=check(sent, replies[:2]), faults=faults, extra=extra)
    assert not bad["passed"]
    assert failures(bad) == [
        "1 lost",
        "1 of 4 messages never sent",
        "fault node_removed on vf-store: no recovery seen",
        "2 malformed send(s) not refused as expected",
        "handlers saw 1 message(s) out of sequence",
        "handlers committed 2 messages, not 3",
    ]
    skipped = {"kind": "reader_killed", "target": "vf-store/DirectQ", "at_s": None}
    shown = "\n".join(
        table(
            build(
                planned=4,
                verdict=check(sent, replies),
                faults=[*faults, {**skipped, "recovered_s": None}],
                extra={"errors": [], "seed": 8},
            )
        )
    )
    assert "vf-store/DirectQ not injected, recovered not seen" in shown
    assert "vf-store at 1.0s, recovered not seen" in shown and "FAILED: 1 of 4" in shown


# --- on a real broker, in this process -----------------------------------------------------------


def verify_catalog(b: LocalBroker) -> None:
    """The verify topology folded into one broker: the shop and every path's service, each
    answered by the verify handler."""
    b.create(MessageType(REQUEST, "json"))
    b.create(MessageType(REPLY, "json"))
    b.create(Contract(CONTRACT, {REQUEST: "initiator", REPLY: "target"}))
    b.create(Queue("ShopQ"))
    b.create(Service("Shop", "ShopQ"))
    for service in PATHS.values():
        b.create(Queue(f"{service}Q", activation=Activation(HANDLER, max_readers=2)))
        b.create(Service(service, f"{service}Q", [CONTRACT]))


@pytest.fixture
def shop(tmp_path):
    path = str(tmp_path / "verify.sqlite")
    with LocalBroker("verify", path, max_body_bytes=MAX_BODY, code_modules=[HANDLER_MODULE]) as b:
        verify_catalog(b)
        yield b


def test_every_malformed_kind_is_refused_with_its_error_and_the_dialog_goes_on(shop):
    op = Begin("Shop", "Direct", CONTRACT)
    shop.apply([op])
    h = op.handle
    good = [Send(h, REQUEST, b'{"id": "d/0:0", "part": "A"}')]
    bad = Malformed(shop, random.Random(1), MAX_BODY)
    deadline = time.monotonic() + 30
    for kind in sorted(EXPECTED):
        for _ in range(3):  # the wrong-type kind has three shapes, drawn at random
            bad.send(kind, h, good, deadline)
    assert bad.wrong == []
    assert bad.report()["refused"] == 3 * len(EXPECTED)
    assert shop.queues()["DirectQ"]["depth"] == 0  # the mixed batches delivered nothing
    shop.apply(good)  # the dialog is still usable
    [reply] = wait_until(lambda: shop.receive("ShopQ", wait=0.5))
    assert [m.body for m in reply.messages] == [b'{"id": "d/0:0"}']


def test_malformed_calls_ride_along_at_their_rate():
    bad = Malformed(None, random.Random(3), MAX_BODY, rate=0.015)
    kinds = [k for _ in range(100) for k in bad.due(100)]
    assert len(kinds) == 150 and set(kinds) == set(EXPECTED)


def test_the_workload_on_a_local_broker_checks_clean_and_waits_at_its_gates(shop):
    h = History()
    streams = begin_streams(shop, dialogs=2)
    gates = Gates([100, 200])
    malformed = Malformed(shop, random.Random(5), MAX_BODY)
    deadline = time.monotonic() + 60
    sender = Sender(shop, streams, 400, 3, h, gates, malformed, 150, deadline)
    collector = Collector(shop, h)
    collector.start()
    sender.start()
    try:
        assert gates.arrived[0].wait(30)
        stuck = sender.allocated
        assert 100 <= stuck < 200 and not gates.arrived[1].is_set()
        marks = sender.marks(["direct"])
        assert sender.allocated == stuck  # it waits there until the fault is in
        gates.released[0].set()
        assert gates.arrived[1].wait(30)
        gates.released[1].set()
        sender.join(30)
        wait_until(lambda: h.unconfirmed() == 0 and len(h.sent) == 400, timeout=30)
        assert h.recovered_at(marks) is not None
    finally:
        sender.stop.set()
        gates.release_all()
        collector.stop.set()
        collector.join(10)
    assert sender.error is None and collector.error is None
    v = check(h.sent, h.replies)
    assert v.ok and v.messages == v.delivered == 400
    assert {s.stream.split("/")[0] for s in h.sent} == set(PATHS)
    assert malformed.wrong == [] and sum(malformed.refused.values()) == 6
    states = [g["state"] for q in PATHS.values() for g in shop.groups(f"{q}Q")]
    assert handlers_seen(states) == {"seen": 400, "out_of_sequence": 0}
