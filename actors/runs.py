"""Messages by the run: what one receive takes from a conversation group travels and is audited
as runs, a run being messages that follow each other on one endpoint with one type and the same
times, so that no Python object is made per message between the store and the answer unless
someone asks for one (`rows_of`, `ReceivedGroup.messages`). Plain Python."""

from __future__ import annotations

from collections.abc import Sequence

# Per message: (queuing_order, endpoint_no, seq, message_type, body, sent_at, arrived_at).
Row = tuple[int, int, int, str, bytes, float, float]
# Per run of messages that follow each other on one endpoint, with one type and the same times:
# (first queuing_order, endpoint_no, first seq, message_type, bodies, sent_at, arrived_at). The
# messages' queuing orders and sequence numbers count up from the first; a first seq of -1
# (the broker's own messages) is -1 for each.
Run = tuple[int, int, int, str, Sequence[bytes], float, float]


def count(runs: Sequence[Run]) -> int:
    """How many messages `runs` hold."""
    return len(runs[0][4]) if len(runs) == 1 else sum(len(r[4]) for r in runs)


def rows_of(runs: Sequence[Run]) -> list[Row]:
    """The messages of `runs`, a row each."""
    out: list[Row] = []
    for qo, ep, seq, mt, bodies, sent, arrived in runs:
        if seq < 0:
            out += [(qo + i, ep, -1, mt, b, sent, arrived) for i, b in enumerate(bodies)]
        else:
            out += [(qo + i, ep, seq + i, mt, b, sent, arrived) for i, b in enumerate(bodies)]
    return out


def runs_of(rows: Sequence[Row]) -> list[Run]:
    """`rows` as runs: each row joins the run before it when it goes on from it (the next
    queuing order and sequence number, the same endpoint, type and times)."""
    out: list[Run] = []
    bodies: list[bytes] = []
    for row in rows:
        qo, ep, seq, mt, body, sent, arrived = row
        if out:
            q0, e0, s0, m0, _, se0, a0 = out[-1]
            k = len(bodies)
            if (
                qo == q0 + k
                and ep == e0
                and (seq == s0 + k if s0 >= 0 else seq < 0)
                and mt == m0
                and sent == se0
                and arrived == a0
            ):
                bodies.append(body)
                continue
        bodies = [body]
        out.append((qo, ep, seq if seq >= 0 else -1, mt, bodies, sent, arrived))
    return out
