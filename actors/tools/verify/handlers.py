"""The activation handler of `raybroker verify`'s receiving queues (importable on every node)."""

from __future__ import annotations

import json

from actors.activation import HandlerContext
from actors.calls.envelope import ReceivedGroup

REQUEST, REPLY = "VReq", "VReply"


def echo_id(group: ReceivedGroup, ctx: HandlerContext) -> None:
    """Answer each request with a reply carrying its id, on the same conversation, in the same
    commit as the receive: the reply exists exactly when the message was received and committed,
    which is what the checker reads. The group's state keeps what this handler saw, committed
    with it too: {"count", "last": {conversation handle: sequence number}, "bad": messages out
    of sequence order}."""
    state = json.loads(ctx.state) if ctx.state else {"count": 0, "last": {}, "bad": 0}
    for m in group.messages:
        if m.message_type != REQUEST:
            continue  # EndDialog, Error: nothing to answer
        last = state["last"].get(m.conversation_handle, -1)
        if m.sequence_number != last + 1:
            state["bad"] += 1
        state["last"][m.conversation_handle] = m.sequence_number
        state["count"] += 1
        ident = json.loads(m.body)["id"]
        ctx.send(m.conversation_handle, REPLY, json.dumps({"id": ident}).encode())
    ctx.set_state(json.dumps(state).encode())
