"""Sample activation handlers shipped with raybroker (used by the benchmarks, the priority
topology and the tests); name them as `actors.activation.handlers:<function>`."""

from __future__ import annotations

import json
import time

from actors.activation import HandlerContext
from actors.calls.envelope import ReceivedGroup


def count_in_order(group: ReceivedGroup, ctx: HandlerContext) -> None:
    """Count each message into the group's state and note any that came out of sequence order
    (per conversation). The state commits with the receive, so a count is kept exactly once."""
    state = json.loads(ctx.state) if ctx.state else {"count": 0, "last": {}, "bad": 0}
    for m in group.messages:
        last = state["last"].get(m.conversation_handle, -1)
        if m.sequence_number != last + 1:
            state["bad"] += 1
        state["last"][m.conversation_handle] = m.sequence_number
        state["count"] += 1
    ctx.set_state(json.dumps(state).encode())


def slow_count(group: ReceivedGroup, ctx: HandlerContext) -> None:
    """`count_in_order` plus 20 ms of simulated work per group, so a queue can outgrow a reader."""
    time.sleep(0.02)
    count_in_order(group, ctx)


def stamp_first_call(group: ReceivedGroup, ctx: HandlerContext) -> None:
    """Record when the handler first saw this group (the activation latency benchmark)."""
    if ctx.state is None:
        ctx.set_state(repr(time.time()).encode())


def discard(group: ReceivedGroup, ctx: HandlerContext) -> None:
    """Do nothing: commit removes the messages (the throughput benchmark's handler)."""


def reply_in_kind(group: ReceivedGroup, ctx: HandlerContext) -> None:
    """Answer each "Order" with a "Reply" carrying the same body, on the same conversation (the
    regional sales services of topologies/sales_by_region.yaml)."""
    for m in group.messages:
        if m.message_type == "Order":
            ctx.send(m.conversation_handle, "Reply", m.body)
