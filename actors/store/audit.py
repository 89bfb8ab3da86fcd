"""The delivery audit's format: one record per committed message, encoded in one place (here, at
commit) and decoded in one place (here, for views, cursors and the Spark bridge).

A commit stores one row per transaction: a msgpack list with one columnar entry per committed
conversation group. Decoded, every message becomes a record with the fields in `FIELDS`; the
same records come out as columns (`columns`) ready for Arrow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgpack

from actors.packing import one_or_all, packb

FIELDS = (
    "message_id",  # "<conversation id>/<i|t>/<sequence>": the same on every broker it crosses
    "conversation_id",
    "from_initiator",
    "sequence_number",
    "message_type",
    "from_service",
    "to_service",
    "from_broker",  # broker id of the sending side (None: not known yet)
    "to_broker",  # broker id of the broker that committed it
    "queue",
    "sent_at",
    "arrived_at",
    "received_at",
    "committed_at",
    "status",  # "committed"
    "hops",  # brokers crossed: 0 when sent on this broker, None when not recorded
    "audit_id",  # the commit's row in the committing broker's audit (its commit order)
)

# Per endpoint, once per group: (conversation_id, from_initiator, from_service, to_service,
# from_broker, hops).
Sender = tuple[str, bool, str, str, "str | None", int]


def sender(ep: Any, broker_id: str) -> Sender:
    """What the audit keeps once per group of the endpoint `ep` (an `Endpoint`) that received."""
    local = ep.far_broker in (None, broker_id)
    return (
        ep.conversation_id,
        not ep.is_initiator,  # sent by the initiator?
        ep.far_service,
        ep.service,
        ep.far_broker or broker_id,
        0 if local else None,
    )


def message_id(conversation_id: str, from_initiator: bool, seq: int) -> str:
    return f"{conversation_id}/{'i' if from_initiator else 't'}/{seq}"


def encode_group(
    broker_id: str,
    queue: str,
    received_at: float,
    committed_at: float,
    senders: Mapping[int, Sender],
    runs: Sequence[Sequence[Any]],
) -> list[Any]:
    """One committed group, as columns. `runs` are received runs (`actors.runs.Run`: first
    queuing order, endpoint no, first seq, message type, bodies, sent_at, arrived_at); bodies
    are not kept. A group of one run is a value per column, its sequence numbers the first, and
    the count of its messages ends the record; a group of several runs is a value per run in
    each column (or one value, when every run has it), the first sequence number of each run,
    and the runs' lengths end the record: no Python step per message either way (see
    `_expanded`)."""
    if len(runs) == 1:
        _, ep, seq, mt, bodies, sent, arrived = runs[0]
        n = len(bodies)
        seqs = seq if seq >= 0 or n == 1 else [-1] * n
        return [broker_id, queue, received_at, committed_at, dict(senders), ep, seqs, mt, sent,
                arrived, n]  # fmt: skip
    return [
        broker_id,
        queue,
        received_at,
        committed_at,
        dict(senders),
        one_or_all([r[1] for r in runs]),
        [r[2] for r in runs],  # each run's first (-1: the broker's own, each of them -1)
        one_or_all([r[3] for r in runs]),
        one_or_all([r[5] for r in runs]),
        one_or_all([r[6] for r in runs]),
        [len(r[4]) for r in runs],
    ]


def encode_run(
    broker_id: str,
    queue: str,
    at: float,
    ep: Any,
    message_type: str,
    first_seq: int,
    count: int,
    sent_at: float,
) -> list[Any]:
    """A run of one endpoint's messages received and committed at `at` with no reader between
    (passed straight on, `Begin.relays`), as `encode_group` columns."""
    senders = {ep.no: sender(ep, broker_id)}
    return [broker_id, queue, at, at, senders, ep.no, first_seq, message_type, sent_at, at, count]


def pack(groups: Sequence[list[Any]]) -> bytes:
    return packb(groups)


def records(payload: bytes) -> list[dict[str, Any]]:
    """The delivery records of one stored commit, in commit order."""
    out = []
    for group in msgpack.unpackb(payload, raw=False, strict_map_key=False):
        broker, queue, received, committed, senders, ep_nos, seqs, types, sent, arrived = _expanded(
            group
        )
        for i, no in enumerate(ep_nos):
            conv, from_initiator, from_service, to_service, from_broker, hops = senders[no]
            out.append(
                {
                    "message_id": message_id(conv, from_initiator, seqs[i]),
                    "conversation_id": conv,
                    "from_initiator": from_initiator,
                    "sequence_number": seqs[i],
                    "message_type": types[i],
                    "from_service": from_service,
                    "to_service": to_service,
                    "from_broker": from_broker,
                    "to_broker": broker,
                    "queue": queue,
                    "sent_at": sent[i],
                    "arrived_at": arrived[i],
                    "received_at": received,
                    "committed_at": committed,
                    "status": "committed",
                    "hops": hops,
                    # kept for readers of the first format
                    "broker_id": broker,
                }
            )
    return out


def _expanded(group: list[Any]) -> list[Any]:
    """A stored group with a list per column. Its last entry says the form: a list, the lengths
    of its runs (a column is a value per run or one for all, the sequence numbers each run's
    first); a number, the count of its messages (a column is a value per message or one for
    all, the sequence numbers the first of a run); none, a record written before either (a list
    per column)."""
    if len(group) == 10:
        return group
    *head, ep_nos, seqs, types, sent, arrived, n = group
    if isinstance(n, list):  # by the run
        out: list[int] = []
        for first, k in zip(seqs, n, strict=True):
            out += range(first, first + k) if first >= 0 else [-1] * k
        return [*head, _per_message(ep_nos, n), out, _per_message(types, n),
                _per_message(sent, n), _per_message(arrived, n)]  # fmt: skip
    return [
        *head,
        ep_nos if isinstance(ep_nos, list) else [ep_nos] * n,
        seqs if isinstance(seqs, list) else range(seqs, seqs + n),
        types if isinstance(types, list) else [types] * n,
        sent if isinstance(sent, list) else [sent] * n,
        arrived if isinstance(arrived, list) else [arrived] * n,
    ]


def _per_message(column: Any, lengths: list[int]) -> list[Any]:
    """A column of a record by the run (a value per run, or one for all) as a value per message."""
    if not isinstance(column, list):
        return [column] * sum(lengths)
    out: list[Any] = []
    for value, k in zip(column, lengths, strict=True):
        out += [value] * k
    return out


def columns(recs: Iterable[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Records as one list per field (the shape Arrow and pandas take)."""
    out: dict[str, list[Any]] = {f: [] for f in FIELDS}
    for r in recs:
        for f in FIELDS:
            out[f].append(r[f])
    return out


def read_all(
    audit: Callable[..., Mapping[str, Any]], after_id: int = 0, page: int = 1000
) -> tuple[list[dict[str, Any]], int]:
    """Every record after `after_id`, paging through a handle's `audit` cursor; returns the
    records and the id to continue from."""
    out: list[dict[str, Any]] = []
    while True:
        got = audit(after_id=after_id, limit=page)
        out += got["records"]
        if got["next"] == after_id:
            return out, after_id
        after_id = got["next"]
