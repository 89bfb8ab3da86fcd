"""Monitoring views of one broker, as plain rows: conversation endpoints, queues and their
messages, conversation groups, the transmission queue, operator events and the delivery audit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actors.core.state import group_of
from actors.errors import InvalidArgument
from actors.model import checks
from actors.store import audit as audit_format
from actors.store.database import Store

if TYPE_CHECKING:
    from actors.core.state import BrokerState


VIEW_PAGE = 10_000  # rows an endpoints or groups view answers at most, unless asked for fewer


def _cursor(what: str, after: Any, limit: Any) -> None:
    """A page of a view listed in `what` order: after that `what` (None: from the first)."""
    if after is not None and not isinstance(after, str):
        raise InvalidArgument(f"after must be a {what} (the last of the page before) or None")
    checks.page(0, limit)


def endpoints(
    state: BrokerState, after: str | None = None, limit: int = VIEW_PAGE
) -> list[dict[str, Any]]:
    """sys.conversation_endpoints, in handle order: the first `limit` after handle `after`
    (a broker may hold millions: page with the last handle, or count them with `dialogs`).
    `encryption`: begun with ENCRYPTION on; `secured`: the dialog has a session key here (its
    messages cross between brokers sealed)."""
    _cursor("conversation handle", after, limit)
    return [
        {
            "conversation_handle": ep.handle,
            "conversation_id": ep.conversation_id,
            "is_initiator": ep.is_initiator,
            "service": ep.service,
            "far_service": ep.far_service,
            "far_broker": ep.far_broker,
            "contract": ep.contract,
            "conversation_group_id": state.groups[ep.group_no].group_id,
            "state": ep.state.value,
            "send_sequence": ep.send_seq,
            "receive_sequence": ep.recv_seq,
            "lifetime_expires_at": ep.expires_at,
            "timer_due_at": ep.timer_at,
            "encryption": ep.encryption,
            "secured": secured,
        }
        for ep, secured in state.endpoints_after(after, limit)
    ]


def rerunnable(
    store: Store, after: str | None = None, limit: int = VIEW_PAGE
) -> list[dict[str, Any]]:
    """The dialogs begun with `if_absent` that a re-run of their Begin finds, in handle order (a
    page after handle `after`): live, or ended and remembered (`ended_retention_s`), so that the
    re-run begins nothing again."""
    _cursor("conversation handle", after, limit)
    return [
        {"conversation_handle": handle, "ended_at": ended_at}
        for handle, ended_at in store.reruns_after(after, limit)
    ]


def dialogs(state: BrokerState, store: Store, now: float) -> dict[str, Any]:
    """How many dialog endpoints are in each state and how many are secured, counted in the
    store; counting millions takes a while, so a count is reused a while (actors.core.recount)."""

    def count() -> dict[str, Any]:
        by_state, secured = store.dialog_counts()
        return {"by_state": by_state, "secured": secured, "counted_at": now}

    return state.dialog_counts.get(now, count)


def transmission_depth(state: BrokerState, store: Store, now: float) -> int:
    """Messages waiting in the transmission queue, counted in the store (reused a while: a
    peer that is down for long can leave millions parked)."""
    return state.transmission_count.get(now, store.transmission_depth)


def queue(state: BrokerState, store: Store, queue: str, limit: int = 1000) -> list[dict[str, Any]]:
    """The rows of one queue, in queue order, with each message's status."""
    checks.page(0, limit)
    state.catalog.queue(queue)
    groups = store.group_nos_of_queue(queue)
    out = []
    for qo, ep_no, seq, mt, body, sent, arrived, g, status in store.queue_rows(groups, limit):
        ep = state.endpoints.get(ep_no)
        locked = state.locks.by_group.get(g)
        out.append(
            {
                "queuing_order": qo,
                "status": "received"
                if status
                else (
                    "locked" if locked and locked.first_id <= qo <= locked.last_id else "waiting"
                ),
                "conversation_group_id": state.groups[g].group_id,
                "conversation_handle": ep.handle if ep else None,
                "service": ep.service if ep else None,
                "message_type": mt,
                "sequence_number": seq,
                "body_size": len(body),
                "sent_at": sent,
                "arrived_at": arrived,
            }
        )
    return out


def queues(state: BrokerState) -> dict[str, dict[str, Any]]:
    """Per queue: depth, messages removed since the broker started (received and committed,
    or ended with their dialog), locked groups, enabled, and the poison count."""
    out = {}
    for name, q in state.catalog.queues.items():
        idx = state.queue_index(name)
        out[name] = {
            "depth": idx.depth,
            "removed": idx.removed,
            "locked_groups": sum(1 for lk in state.locks.by_id.values() if lk.queue == name),
            "enabled": q.enabled,
            "retention": q.retention,
            "poison_limit": q.poison_limit,
            "rollbacks_in_a_row": state.poison.count(name),
        }
    return out


def groups(
    state: BrokerState,
    store: Store,
    queue: str | None = None,
    after: str | None = None,
    limit: int = VIEW_PAGE,
) -> list[dict[str, Any]]:
    """Conversation groups (of `queue`), in group id order, the first `limit` after group id
    `after`: queue, waiting messages, lock, and the group's state."""
    if queue is not None and not isinstance(queue, str):
        raise InvalidArgument(f"queue must be a queue's name (or None for all), not {queue!r}")
    _cursor("conversation group id", after, limit)
    out = []
    for row in store.groups_after(queue, after, limit):
        g = state.groups.peek(row[0]) or group_of(row[:5])
        lock = state.locks.by_group.get(g.no)
        out.append(
            {
                "conversation_group_id": g.group_id,
                "queue": g.queue,
                "conversations": g.members,
                "waiting": state.queue_index(g.queue).pending.get(g.no, 0),
                "locked_by": lock.lock_id if lock else None,
                "state": row[5],
            }
        )
    return out


def transmission(state: BrokerState, store: Store, limit: int = 1000) -> list[dict[str, Any]]:
    """sys.transmission_queue: messages waiting to leave this broker, and why."""
    checks.page(0, limit)
    out = []
    for (
        tid,
        ep_no,
        seq,
        mt,
        size,
        to_service,
        to_broker,
        status,
        at,
        attempts,
        next_at,
    ) in store.transmission_messages(limit):
        ep = state.endpoints.get(ep_no)
        out.append(
            {
                "id": tid,
                "conversation_handle": ep.handle if ep else None,
                "to_service": to_service,
                "to_broker": to_broker,
                "message_type": mt,
                "sequence_number": seq,
                "body_size": size,
                "transmission_status": status,
                "attempts": attempts,
                "next_attempt_at": next_at,
                "enqueued_at": at,
            }
        )
    return out


def router_mappings(store: Store, queue: str, limit: int = 100) -> tuple[int, list[str]]:
    """A router replica's live mappings on `queue`: how many, and the first `limit` of them
    (the JSON its handler keeps; `actors.ddr.views.router` reads them)."""
    if not isinstance(queue, str):
        raise InvalidArgument(f"queue must be a queue's name, not {queue!r}")
    checks.page(0, limit)
    return store.router_mappings(queue, limit)


def events(
    store: Store, after_id: int = 0, limit: int = 1000, newest: bool = False
) -> list[dict[str, Any]]:
    """Operator events after `after_id`, oldest first: the first `limit`, or with `newest`
    the last `limit` (the most recent, as a status line shows them)."""
    checks.page(after_id, limit)
    if not isinstance(newest, bool):
        raise InvalidArgument(f"newest must be True or False, not {newest!r}")
    return [
        {"id": i, "at": at, "kind": kind, "subject": subject, "detail": detail}
        for i, at, kind, subject, detail in store.events(after_id, limit, newest)
    ]


def audit(store: Store, after_id: int = 0, limit: int = 1000) -> tuple[list[dict[str, Any]], int]:
    """Delivery records after audit row `after_id`, oldest first, whole commits: at most `limit`
    commits, and none after the one that brings the records to `limit` (a commit of a busy
    broker holds thousands; a page of a thousand of them, built and sent in one answer, held the
    broker for seconds). Also the last audit row id read (0: none)."""
    checks.page(after_id, limit)
    out: list[dict[str, Any]] = []
    last = 0
    for aid, _at, payload in store.audit_rows(after_id, limit):
        recs = audit_format.records(payload)
        for r in recs:
            r["audit_id"] = aid  # the commit's place in this broker's audit
        out += recs
        last = aid
        if len(out) >= limit:
            break
    return out, last
