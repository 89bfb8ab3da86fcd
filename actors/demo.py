"""`raybroker demo`: an order-entry pipeline on a local Ray, checked end to end.

Orders go out on dialogs (a header, lines, then Submit), in batches. Reader actors take whole
conversation groups, keep each order's running total in the group's state, and on Submit reply
with a Confirm and end the dialog, all committed with the receive. The driver collects the
confirmations, ends its side, and checks against the broker's delivery audit that every message
was committed exactly once.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid

from . import (
    Activation,
    Begin,
    Contract,
    End,
    MessageType,
    Queue,
    ReceivedGroup,
    Send,
    Service,
    ensure_ray,
    start_broker,
)
from . import audit as audit_format
from .activation import HandlerContext

LINE_SCHEMA = {
    "type": "object",
    "required": ["sku", "qty", "price"],
    "properties": {
        "sku": {"type": "string"},
        "qty": {"type": "integer", "minimum": 1},
        "price": {"type": "number", "minimum": 0},
    },
}


def define(broker) -> None:
    broker.create(MessageType("Order", "json"))
    broker.create(MessageType("Line", "json_schema", schema=LINE_SCHEMA))
    broker.create(MessageType("Submit", "empty"))
    broker.create(MessageType("Confirm", "json"))
    broker.create(
        Contract(
            "OrderContract",
            {"Order": "initiator", "Line": "initiator", "Submit": "initiator", "Confirm": "target"},
        )
    )
    broker.create(Queue("OrdersQueue"))
    broker.create(Queue("FulfilmentQueue"))
    broker.create(Service("Orders", "OrdersQueue"))
    broker.create(Service("Fulfilment", "FulfilmentQueue", ["OrderContract"]))


def fulfil(group: ReceivedGroup, ctx: HandlerContext) -> None:
    """The fulfilment queue's activated handler: keep each order's running total in the group's
    state; on Submit reply with a Confirm and end the dialog, all committed with the receive."""
    state = json.loads(ctx.state) if ctx.state else {"lines": 0, "total": 0.0}
    for m in group.messages:
        if m.message_type == "Order":
            state["order"] = json.loads(m.body)["order"]
        elif m.message_type == "Line":
            line = json.loads(m.body)
            state["lines"] += 1
            state["total"] = round(state["total"] + line["qty"] * line["price"], 2)
        elif m.message_type == "Submit":
            ctx.send(m.conversation_handle, "Confirm", json.dumps(state).encode())
            ctx.end(m.conversation_handle)
        elif m.message_type in ("EndDialog", "Error"):
            ctx.end(m.conversation_handle)
    ctx.set_state(json.dumps(state).encode())


def run(
    orders: int = 2000, readers: int = 2, path: str | None = None, lines: int = 4, batch: int = 250
) -> int:
    t_start = time.perf_counter()
    ensure_ray()
    tmp = None
    if path is None:
        tmp = tempfile.TemporaryDirectory(prefix="raybroker-demo-")
        path = os.path.join(tmp.name, "demo.sqlite")
    broker = start_broker(f"demo-{uuid.uuid4().hex[:8]}", path)
    print(f"broker {broker.name} ({broker.info()['broker_id']}) on {path}")
    try:
        define(broker)
        # the fulfilment queue starts its own readers (up to `readers`) as orders arrive
        activation = Activation("actors.demo:fulfil", max_readers=readers, max_groups=16)
        broker.alter(Queue, "FulfilmentQueue", activation=activation.__dict__)
        expected: dict[str, float] = {}
        t0 = time.perf_counter()
        for first in range(0, orders, batch):
            ops: list = []
            for n in range(first, min(orders, first + batch)):
                b = Begin("Orders", "Fulfilment", "OrderContract")
                items = [{"sku": f"sku-{n}-{i}", "qty": i + 1, "price": 2.5} for i in range(lines)]
                expected[b.handle] = round(sum(x["qty"] * x["price"] for x in items), 2)
                ops += [
                    b,
                    Send(b.handle, "Order", json.dumps({"order": n}).encode()),
                    Send(b.handle, "Line", [json.dumps(x).encode() for x in items]),
                    Send(b.handle, "Submit", b""),
                ]
            broker.apply(ops)
            print(f"  sent {min(orders, first + batch):>6,}/{orders:,} orders", flush=True)
        confirmed: dict[str, float] = {}
        doubled = 0
        last_report = 0
        while len(confirmed) < orders:
            groups = broker.receive("OrdersQueue", max_groups=64, wait=5.0)
            if not groups:
                break
            ends = []
            for g in groups:
                for m in g.messages:
                    if m.message_type == "Confirm":
                        doubled += m.conversation_handle in confirmed
                        confirmed[m.conversation_handle] = json.loads(m.body)["total"]
                    elif m.message_type == "EndDialog":
                        ends.append(End(m.conversation_handle))
            broker.commit(groups, ops=ends)
            if len(confirmed) - last_report >= max(1, orders // 4) or len(confirmed) == orders:
                last_report = len(confirmed)
                print(f"  confirmed {len(confirmed):>6,}/{orders:,} orders", flush=True)
        elapsed = time.perf_counter() - t0
        return _summarise(
            broker,
            orders,
            lines,
            expected,
            confirmed,
            doubled,
            elapsed,
            time.perf_counter() - t_start,
        )
    finally:
        broker.stop()
        if tmp is not None:
            tmp.cleanup()


def _summarise(broker, orders, lines, expected, confirmed, doubled, elapsed, total) -> int:
    wrong = sum(1 for h, t in confirmed.items() if expected.get(h) != t)
    lost = orders - len(confirmed)
    audit, _ = audit_format.read_all(broker.audit)
    keys = [(r["conversation_id"], r["from_initiator"], r["sequence_number"]) for r in audit]
    audit_doubled = len(keys) - len(set(keys))
    messages = orders * (lines + 2)
    rows = [
        ("orders sent", f"{orders:,}"),
        ("orders confirmed", f"{len(confirmed):,}"),
        ("orders lost", f"{lost}"),
        ("confirmations doubled", f"{doubled}"),
        ("totals wrong", f"{wrong}"),
        ("messages committed (audit)", f"{len(keys):,}"),
        ("messages committed twice (audit)", f"{audit_doubled}"),
        ("pipeline time", f"{elapsed:.2f}s ({messages / elapsed:,.0f} order messages/s)"),
        ("whole demo", f"{total:.1f}s"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    for name, q in broker.queues().items():
        print(f"queue {name}: depth {q['depth']}, enabled {q['enabled']}")
    ok = lost == 0 and doubled == 0 and wrong == 0 and audit_doubled == 0
    print("OK: nothing lost, nothing doubled" if ok else "FAILED: see the table above")
    return 0 if ok else 1
