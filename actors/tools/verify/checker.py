"""The checker of `raybroker verify`, pure: what the workload sent against what came back.

Every message carries an id the workload generator made; the handler that receives it answers
with a reply carrying that id, in the same commit as its receive, so a reply exists exactly when
the message was received and committed. The driver records each reply once its own commit of it
succeeded. From those two lists: a message with no reply is lost, one with two or more is
doubled, and one whose reply comes after the reply of a message sent later on the same stream
(conversation) is out of order. Nothing here reads the brokers' audit.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from actors.errors import InvalidArgument

INJECTIONS = ("lose", "double", "invert")
SHOWN = 20  # offending messages listed per count in a report


@dataclass(frozen=True)
class Sent:
    """A message the broker accepted: its id, the stream (one conversation, as the workload
    names it: "direct/3", "spark/17") and its place in that stream's order, from 0."""

    id: str
    stream: str
    position: int
    conversation: str | None = None  # the conversation id, when the sender knows it


@dataclass(frozen=True)
class Reply:
    """A reply the driver received and committed: the id it carries, the conversation it came
    back on, its sequence number there and when its commit was confirmed (monotonic s)."""

    id: str
    conversation: str
    sequence: int
    at: float


@dataclass
class Verdict:
    messages: int
    delivered: int = 0
    lost: list[dict[str, Any]] = field(default_factory=list)
    doubled: list[dict[str, Any]] = field(default_factory=list)
    out_of_order: list[dict[str, Any]] = field(default_factory=list)
    unexpected: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.doubled or self.out_of_order or self.unexpected)

    def as_dict(self, shown: int = SHOWN) -> dict[str, Any]:
        """Counts, and the first `shown` offenders of each kind by id and conversation."""
        return {
            "messages": self.messages,
            "delivered": self.delivered,
            "lost": len(self.lost),
            "doubled": len(self.doubled),
            "out_of_order": len(self.out_of_order),
            "unexpected": len(self.unexpected),
            "lost_ids": self.lost[:shown],
            "doubled_ids": self.doubled[:shown],
            "out_of_order_ids": self.out_of_order[:shown],
            "unexpected_ids": self.unexpected[:shown],
        }


def check(sent: Iterable[Sent], replies: Sequence[Reply]) -> Verdict:
    """Judge `replies` (in the order their commits were confirmed) against `sent`."""
    by_id = {s.id: s for s in sent}
    conversations = {s.stream: s.conversation for s in by_id.values() if s.conversation}
    for r in replies:  # a stream the sender could not name (Spark's) is named by its replies
        s = by_id.get(r.id)
        if s is not None:
            conversations.setdefault(s.stream, r.conversation)
    verdict = Verdict(messages=len(by_id))
    times: Counter[str] = Counter()
    highest: dict[str, Sent] = {}  # per stream, the latest-sent message answered so far
    for r in replies:
        s = by_id.get(r.id)
        if s is None:
            verdict.unexpected.append({"id": r.id, "conversation": r.conversation})
            continue
        times[r.id] += 1
        if times[r.id] > 1:
            continue  # a double is counted once below, not also as out of order
        top = highest.get(s.stream)
        if top is not None and s.position < top.position:
            verdict.out_of_order.append(
                {"id": s.id, "stream": s.stream, "conversation": r.conversation, "after": top.id}
            )
        else:
            highest[s.stream] = s
    verdict.delivered = len(times)
    for s in by_id.values():
        where = {"id": s.id, "stream": s.stream, "conversation": conversations.get(s.stream)}
        if times[s.id] == 0:
            verdict.lost.append(where)
        elif times[s.id] > 1:
            verdict.doubled.append({**where, "times": times[s.id]})
    return verdict


def inject(
    sent: Iterable[Sent], replies: Sequence[Reply], kinds: Iterable[str], seed: int
) -> tuple[list[Reply], list[dict[str, Any]]]:
    """The checker's input made wrong on purpose, to show the checker catches it: "lose" drops one
    reply, "double" repeats one, "invert" swaps two consecutive replies of one stream. Each kind
    acts on a stream of its own. Returns the new replies and what was done (kind, id, stream)."""
    kinds = list(kinds)
    unknown = [k for k in kinds if k not in INJECTIONS]
    if unknown:
        raise InvalidArgument(f"inject: unknown kind(s) {unknown}; choose from {INJECTIONS}")
    stream_of = {s.id: s.stream for s in sent}
    out = list(replies)
    places: dict[str, list[int]] = defaultdict(list)  # stream -> indexes of its replies in out
    for i, r in enumerate(out):
        if r.id in stream_of:
            places[stream_of[r.id]].append(i)
    rng = random.Random(seed)
    streams = sorted(s for s, idx in places.items() if len(idx) >= 2)
    rng.shuffle(streams)
    if len(streams) < len(kinds):
        raise InvalidArgument(
            f"inject: needs {len(kinds)} stream(s) with two replies or more, found {len(streams)}"
        )
    done: list[dict[str, Any]] = []
    drop: set[int] = set()
    extra: dict[int, Reply] = {}  # index -> a copy to put right after it
    for kind, stream in zip(kinds, streams, strict=False):
        idx = places[stream]
        k = rng.randrange(len(idx) - 1)  # a reply with a later one in the same stream
        i, j = idx[k], idx[k + 1]
        if kind == "lose":
            drop.add(i)
        elif kind == "double":
            extra[i] = out[i]
        else:
            out[i], out[j] = out[j], out[i]
        done.append({"kind": kind, "id": out[j if kind == "invert" else i].id, "stream": stream})
    final: list[Reply] = []
    for i, r in enumerate(out):
        if i not in drop:
            final.append(r)
        if i in extra:
            final.append(extra[i])
    return final, done


def self_test(sent: Sequence[Sent], replies: Sequence[Reply], seed: int) -> dict[str, Any]:
    """The checker run once more on this run's own history made wrong on purpose (one reply
    dropped, one repeated, two of one stream swapped, each on a stream of its own): `caught`
    says whether it named exactly those, beyond what it found in the history as it was. A
    checker that could not fail would pass every run; this shows, on every run, that it can."""
    try:
        changed, done = inject(sent, replies, INJECTIONS, seed)
    except InvalidArgument as exc:  # too few streams with two replies to touch
        return {"injected": [], "caught": None, "skipped": str(exc)}
    before, after = check(sent, replies), check(sent, changed)
    found = {
        kind: sorted({x["id"] for x in new} - {x["id"] for x in old})
        for kind, old, new in (
            ("lose", before.lost, after.lost),
            ("double", before.doubled, after.doubled),
            ("invert", before.out_of_order, after.out_of_order),
        )
    }
    wanted = {d["kind"]: [d["id"]] for d in done}
    return {"injected": done, "found": found, "caught": found == wanted}


def first_reply_at(flow: Iterable[tuple[int, float]], mark: int) -> float | None:
    """When the first reply to a message at or after position `mark` was confirmed, from a
    stream's (position, confirmed at) pairs; None if there is none yet."""
    times = [at for position, at in flow if position >= mark]
    return min(times) if times else None


def recovered_at(
    marks: Mapping[str, int],
    sent_upto: Mapping[str, int],
    flow: Mapping[str, Sequence[tuple[int, float]]],
) -> float | None:
    """When every affected stream flowed again after a fault: `marks` gives each stream's first
    position sent after the fault, `sent_upto` how far each has been sent (positions below it),
    `flow` each stream's confirmed replies. A stream with nothing sent after the fault yet does
    not count; None until at least one does and all that do have had such a reply."""
    latest: float | None = None
    for stream, mark in marks.items():
        if sent_upto.get(stream, 0) <= mark:
            continue
        at = first_reply_at(flow.get(stream, ()), mark)
        if at is None:
            return None
        latest = at if latest is None else max(latest, at)
    return latest
