"""What a broker reports to its metrics sink: counts of messages sent, received, committed and
rolled back, queue depths, the transmission queue, and each call's duration. A LocalBroker with a
collecting sink; no Ray."""

from __future__ import annotations

import asyncio

from actors import Begin, LocalBroker, Queue, Send, Service
from actors.calls.ordering import Issuer
from actors.service.broker import BrokerService
from actors.service.calls import CLIENT_VERBS
from tests.polling import wait_until


class Collected:
    """A metrics sink that keeps what it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self.snapshots: list[dict] = []

    def observe_call(self, method: str, seconds: float) -> None:
        self.calls.append((method, seconds))

    def sample(self, snapshot: dict) -> None:
        self.snapshots.append(snapshot)


def latest(sink: Collected, check) -> dict:
    """The newest snapshot once one satisfies `check` (polled with a deadline)."""
    return wait_until(lambda: sink.snapshots and check(sink.snapshots[-1]) and sink.snapshots[-1])


def test_the_sink_sees_counts_depths_and_call_times():
    sink = Collected()
    with LocalBroker("metered", metrics=sink) as b:
        b.create(Queue("Q"))
        b.create(Service("S", "Q", ["DEFAULT"]))
        op = Begin("S", "S")
        b.apply([op, Send(op.handle, "DEFAULT", [b"x"] * 10)])
        snap = latest(sink, lambda s: s["queues"].get("Q", {}).get("depth") == 10)
        assert snap["counts"]["sent"] == 10 and snap["counts"]["received"] == 0

        got = b.receive("Q", top=4)
        b.rollback(got)
        got = b.receive("Q", top=10)
        b.commit(got)

        snap = latest(sink, lambda s: s["counts"]["committed"] == 10)
        assert snap["counts"] == {
            "sent": 10,
            "received": 14,
            "committed": 10,
            "rolled_back": 4,
            "forwarded": 0,
            "passed_through": 0,
        }
        assert snap["queues"]["Q"]["depth"] == 0 and snap["transmission"] == 0
    methods = [m for m, _ in sink.calls]
    assert {"apply", "receive", "settle"} <= set(methods)
    assert all(s >= 0 for _, s in sink.calls)


def test_a_batch_of_unknown_methods_is_counted_under_one_label_not_one_each(tmp_path):
    """A client cannot mint metric labels: every method name it sends that is not a verb is
    counted as "other", so the label set stays the verbs' names and one more."""
    sink = Collected()

    async def main() -> list:
        service = BrokerService("labels", str(tmp_path / "b.sqlite"), metrics=sink)
        try:
            issuer = Issuer()
            batch = [(f"no-such-verb-{i}", ()) for i in range(50)] + [("receive", ("Q",))]
            return await service.calls(issuer.order(issuer.issue()), batch)
        finally:
            await service.close()

    outcomes = asyncio.run(main())
    assert [ok for ok, _ in outcomes[:50]] == [False] * 50  # each refused, with its own error
    labels = {m for m, _ in sink.calls}
    assert "other" in labels and labels <= CLIENT_VERBS | {"other"}
