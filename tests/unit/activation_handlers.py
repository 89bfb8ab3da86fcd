"""Test-only activation handlers, importable by path ("tests.unit.activation_handlers:name")."""

from __future__ import annotations

from actors.activation import HandlerContext
from actors.activation.handlers import count_in_order
from actors.calls.envelope import ReceivedGroup

NOT_A_FUNCTION = 42  # resolves, but is not callable


class HandlerFailed(Exception):
    """What `always_fail` raises."""


def always_fail(group: ReceivedGroup, ctx: HandlerContext) -> None:
    """Send and set state, then raise: none of it may commit."""
    for m in group.messages:
        ctx.send(m.conversation_handle, "Reply", b"never")
    ctx.set_state(b"never")
    raise HandlerFailed(f"cannot handle group {group.group_id}")


def reply_or_misbehave(group: ReceivedGroup, ctx: HandlerContext) -> None:
    """Count the group's messages and answer each with a Reply; a message whose body is b"bad" is
    answered with a Req instead, which the target side of contract C may not send (the broker
    refuses this group's output at commit)."""
    count_in_order(group, ctx)
    for m in group.messages:
        kind = "Req" if m.body == b"bad" else "Reply"
        ctx.send(m.conversation_handle, kind, b"re:" + m.body)


def reply_end_and_forward(group: ReceivedGroup, ctx: HandlerContext) -> None:
    """Reply to each message and forward its body on a new dialog Target -> Retain (as a Req),
    then end each conversation the group's messages came on; count them into the group's state."""
    count_in_order(group, ctx)
    for m in group.messages:
        ctx.send(m.conversation_handle, "Reply", b"re:" + m.body)
        handle = ctx.begin("Target", "Retain", "C")
        ctx.send_many(handle, "Req", [b"fwd:" + m.body])
    for handle in dict.fromkeys(m.conversation_handle for m in group.messages):
        ctx.end(handle)


class Counter:
    """A handler written as a method: its bound method is not importable by name."""

    def handle(self, group: ReceivedGroup, ctx: HandlerContext) -> None:
        count_in_order(group, ctx)
