"""Monitoring views of one broker, as plain rows: conversation endpoints, queues and their
messages, conversation groups, the transmission queue, operator events and the delivery audit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgpack

from .locks import QueueIndex

if TYPE_CHECKING:
    from .core import BrokerCore


def endpoints(core: BrokerCore) -> list[dict[str, Any]]:
    """sys.conversation_endpoints."""
    return [
        {
            "conversation_handle": ep.handle,
            "conversation_id": ep.conversation_id,
            "is_initiator": ep.is_initiator,
            "service": ep.service,
            "far_service": ep.far_service,
            "far_broker": ep.far_broker,
            "contract": ep.contract,
            "conversation_group_id": core._groups[ep.group_no].group_id,
            "state": ep.state.value,
            "send_sequence": ep.send_seq,
            "receive_sequence": ep.recv_seq,
            "lifetime_expires_at": ep.expires_at,
            "timer_due_at": ep.timer_at,
        }
        for ep in core._eps.values()
    ]


def queue(core: BrokerCore, queue: str, limit: int = 1000) -> list[dict[str, Any]]:
    """The rows of one queue, in queue order, with each message's status."""
    core.catalog.queue(queue)
    groups = [g.no for g in core._groups.values() if g.queue == queue]
    out = []
    for qo, ep_no, seq, mt, body, sent, arrived, g, status in core.store.queue_rows(groups, limit):
        ep = core._eps.get(ep_no)
        locked = core.locks.by_group.get(g)
        out.append(
            {
                "queuing_order": qo,
                "status": "received"
                if status
                else (
                    "locked" if locked and locked.first_id <= qo <= locked.last_id else "waiting"
                ),
                "conversation_group_id": core._groups[g].group_id,
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


def queues(core: BrokerCore) -> dict[str, dict[str, Any]]:
    """Per queue: depth, locked groups, enabled, and the poison count."""
    out = {}
    for name, q in core.catalog.queues.items():
        idx = core._index.get(name, QueueIndex())
        out[name] = {
            "depth": idx.depth,
            "locked_groups": sum(1 for lk in core.locks.by_id.values() if lk.queue == name),
            "enabled": q.enabled,
            "retention": q.retention,
            "poison_limit": q.poison_limit,
            "rollbacks_in_a_row": core.poison.count(name),
        }
    return out


def groups(core: BrokerCore, queue: str | None = None) -> list[dict[str, Any]]:
    """Conversation groups: queue, waiting messages, lock, and the group's state."""
    out = []
    for g in core._groups.values():
        if queue is not None and g.queue != queue:
            continue
        lock = core.locks.by_group.get(g.no)
        out.append(
            {
                "conversation_group_id": g.group_id,
                "queue": g.queue,
                "conversations": g.members,
                "waiting": core._index.get(g.queue, QueueIndex()).pending.get(g.no, 0),
                "locked_by": lock.lock_id if lock else None,
                "state": core.store.group_state(g.no),
            }
        )
    return out


def transmission(core: BrokerCore, limit: int = 1000) -> list[dict[str, Any]]:
    """sys.transmission_queue: messages waiting to leave this broker, and why."""
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
    ) in core.store.transmission_rows(limit):
        ep = core._eps.get(ep_no)
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


def events(core: BrokerCore, after_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
    return [
        {"id": i, "at": at, "kind": kind, "subject": subject, "detail": detail}
        for i, at, kind, subject, detail in core.store.events(after_id, limit)
    ]


def audit(core: BrokerCore, after_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
    """Delivery records, one per committed message, oldest first (`limit` commit batches)."""
    out = []
    for _aid, _at, payload in core.store.audit_rows(after_id, limit):
        for rec in msgpack.unpackb(payload, raw=False, strict_map_key=False):
            broker, queue, received, committed, convs, ep_nos, seqs, types, sent, arr = rec
            for i, no in enumerate(ep_nos):
                conv, from_initiator = convs[no]
                out.append(
                    {
                        "broker_id": broker,
                        "queue": queue,
                        "conversation_id": conv,
                        "from_initiator": from_initiator,
                        "sequence_number": seqs[i],
                        "message_type": types[i],
                        "sent_at": sent[i],
                        "arrived_at": arr[i],
                        "received_at": received,
                        "committed_at": committed,
                    }
                )
    return out
