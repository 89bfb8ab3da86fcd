"""Exactly-once and per-conversation order over what consumers acknowledged (pure).

Input: how many messages each conversation was sent (numbered 0..n-1 by the producer) and the
acknowledged log, (conversation, seq) in the order acknowledgements were confirmed.
- lost: a sent message never acknowledged;
- doubled: an acknowledgement beyond the first of a message, or of a message never sent (it was
  delivered more often than sent);
- out of order: a message first acknowledged after a later message of its conversation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from actors.tools.bench.peers.workloads import Pair

EXAMPLES = 5  # ids shown per kind of fault


@dataclass(frozen=True)
class Verdict:
    lost: int
    doubled: int
    out_of_order: int
    examples: dict[str, list[Pair]] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not (self.lost or self.doubled or self.out_of_order)

    def describe(self) -> str:
        """'' when clean, else e.g. 'lost (3, 7), (3, 8); doubled (1, 0)'."""
        parts = []
        for kind, ids in self.examples.items():
            if ids:
                parts.append(f"{kind.replace('_', ' ')} " + ", ".join(map(str, ids)))
        return "; ".join(parts)


def check(expected: Mapping[int, int], acked: Iterable[Pair]) -> Verdict:
    seen: set[Pair] = set()
    highest: dict[int, int] = {}  # per conversation, the highest seq acknowledged so far
    doubled: list[Pair] = []
    inverted: list[Pair] = []
    for conv, seq in acked:
        if (conv, seq) in seen or not 0 <= seq < expected.get(conv, 0):
            doubled.append((conv, seq))
            continue
        seen.add((conv, seq))
        if seq < highest.get(conv, -1):
            inverted.append((conv, seq))
        else:
            highest[conv] = seq
    lost_n = sum(expected.values()) - len(seen)
    lost = _first_lost(expected, seen) if lost_n else []
    return Verdict(
        lost_n,
        len(doubled),
        len(inverted),
        {"lost": lost, "doubled": doubled[:EXAMPLES], "out_of_order": inverted[:EXAMPLES]},
    )


def _first_lost(expected: Mapping[int, int], seen: set[Pair]) -> list[Pair]:
    found: list[Pair] = []
    for conv in sorted(expected):
        for seq in range(expected[conv]):
            if (conv, seq) not in seen:
                found.append((conv, seq))
                if len(found) == EXAMPLES:
                    return found
    return found
