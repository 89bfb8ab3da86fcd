"""Each shipped topology of Service Broker's routing scenarios, deployed and carrying dialogs:
load balancing (seed 002), high availability through two forwarders with one of them stopped
mid-stream (seed 002), both combined (four gateways), and the forwarding concentrator (seed 003).
The targets' activated readers count every message into the group's state and note any out of
sequence order, so the checks are exact: every message once, in order."""

from __future__ import annotations

import json

import pytest

from actors import Begin, Send
from tests.polling import wait_until
from topologies.deploy import deploy
from topologies.loader import load

pytestmark = pytest.mark.slow

DIALOGS, MESSAGES = 40, 5  # per initiator


def counted(broker, queue: str) -> tuple[int, int]:
    """(messages counted, messages out of order) over the queue's group states."""
    states = [json.loads(g["state"]) for g in broker.groups(queue) if g["state"]]
    return sum(s["count"] for s in states), sum(s["bad"] for s in states)


def send_dialogs(broker, from_service: str, to_service: str, dialogs=DIALOGS) -> None:
    ops = []
    for i in range(dialogs):
        op = Begin(from_service, to_service)
        ops += [op, Send(op.handle, "DEFAULT", [b"%d-%d" % (i, k) for k in range(MESSAGES)])]
    broker.apply(ops)


@pytest.fixture
def deployed(ray_session, tmp_path):
    running = []

    def up(name: str):
        d = deploy(load(f"topologies/{name}.yaml"), str(tmp_path / "data"))
        running.append(d)
        return d.brokers

    yield up
    for d in running:
        d.stop(delete_stores=True)


def wait_for_all(targets, queue: str, expected: int) -> list[tuple[int, int]]:
    wait_until(
        lambda: sum(counted(t, queue)[0] for t in targets) >= expected,
        timeout=120,
        what=f"{expected} messages counted at the targets",
    )
    return [counted(t, queue) for t in targets]


def test_load_balancing_spreads_dialogs_over_both_targets(deployed):
    b = deployed("load_balancing")

    send_dialogs(b["lb-initiator"], "Initiator", "Target")

    got = wait_for_all([b["lb-target-b"], b["lb-target-c"]], "TargetQueue", DIALOGS * MESSAGES)
    assert [bad for _, bad in got] == [0, 0]
    # round-robin pinning at BEGIN: dialogs alternate, whole dialogs on one target each
    assert [n for n, _ in got] == [DIALOGS * MESSAGES // 2] * 2


def test_high_availability_delivers_everything_with_one_forwarder_stopped(deployed):
    b = deployed("high_availability")
    send_dialogs(b["ha-initiator"], "Initiator", "Target")
    wait_until(lambda: counted(b["ha-target"], "TargetQueue")[0] > 0, what="the first messages")

    b["ha-gateway-a"].stop()  # one forwarder gone: the other carries on
    send_dialogs(b["ha-initiator"], "Initiator", "Target")

    (got,) = wait_for_all([b["ha-target"]], "TargetQueue", 2 * DIALOGS * MESSAGES)
    assert got == (2 * DIALOGS * MESSAGES, 0)
    records = b["ha-target"].audit(limit=100_000)["records"]
    assert len({(r["conversation_id"], r["sequence_number"]) for r in records}) == len(records)


def test_load_balancing_with_high_availability_through_four_gateways(deployed):
    b = deployed("load_balancing_ha")

    send_dialogs(b["lbha-initiator"], "Initiator", "Target")

    targets = [b["lbha-target-b"], b["lbha-target-c"]]
    got = wait_for_all(targets, "TargetQueue", DIALOGS * MESSAGES)
    assert [bad for _, bad in got] == [0, 0] and all(n > 0 for n, _ in got)
    assert sum(n for n, _ in got) == DIALOGS * MESSAGES


def test_a_forwarding_concentrator_carries_many_shops_to_one_target(deployed):
    b = deployed("concentrator")

    for shop in ("cc-shop-1", "cc-shop-2", "cc-shop-3"):
        send_dialogs(b[shop], "Orders", "Fulfilment")

    (got,) = wait_for_all([b["cc-fulfilment"]], "FulfilmentQueue", 3 * DIALOGS * MESSAGES)
    assert got == (3 * DIALOGS * MESSAGES, 0)
    records = b["cc-fulfilment"].audit(limit=100_000)["records"]
    shops = {b[f"cc-shop-{i}"].info()["broker_id"] for i in (1, 2, 3)}
    assert {r["from_broker"] for r in records} == shops  # all three, through the concentrator
