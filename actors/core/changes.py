"""What one verb changes, gathered while its transaction is open (`Changes`), and the records it
gathers: messages that arrived in a group or left it, operator events, new conversation groups.

The unit of work (`actors.core.work`) makes one per verb, commits what it holds and applies it to
the broker's state (`actors.core.state`); the verbs fill it in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from actors.model.dialogs import Endpoint


@dataclass
class Group:
    no: int
    group_id: str
    queue: str
    members: int = 0  # endpoints in the group
    stateful: bool = False  # a state was stored for it (else a receive need not read one)


class Arrived(NamedTuple):
    """Messages committed to a group: where they start, how many, and where their run is in
    `Changes.messages` (-1: not there, e.g. moved from another group)."""

    queue: str
    group: int
    first_id: int
    count: int
    at: int
    nbytes: int


class Removed(NamedTuple):
    """Messages taken off a group; `oldest`: they were its oldest waiting ones (a commit)."""

    queue: str
    group: int
    count: int
    oldest: bool


class Event(NamedTuple):
    at: float
    kind: str
    subject: str
    detail: str


class Changes:
    """What one verb changes, gathered while its transaction is open. (A plain class: two are
    made per message in a busy broker, and a dataclass's field factories cost twice as much.)"""

    __slots__ = (
        "now", "messages", "arrivals", "removals", "transmission", "touched", "settled",
        "new_endpoints", "new_nos", "dead_endpoints", "new_groups", "events", "audit", "undo",
        "after", "sent", "passed", "states", "keys", "_queued", "_queued_n",
    )  # fmt: skip

    def __init__(self, now: float) -> None:
        self.now = now
        # the messages delivered, a run per send (actors.store.segments): store.insert_messages
        self.messages: list[tuple[Any, ...]] = []
        self.arrivals: list[Arrived] = []
        self.removals: list[Removed] = []
        self.transmission: list[tuple[Any, ...]] = []
        self.touched: dict[int, dict[str, Any]] = {}  # no -> its fields before the change
        # those of them changed beyond their sequence numbers (found when written)
        self.settled: list[int] = []
        self.new_endpoints: list[Endpoint] = []
        self.new_nos: set[int] = set()  # their numbers, for touch
        self.dead_endpoints: list[Endpoint] = []
        self.new_groups: list[Group] = []
        self.events: list[Event] = []
        self.audit: list[list[Any]] = []  # committed groups' delivery records (actors.store.audit)
        self.undo: list[Callable[[], None]] = []
        self.after: list[Callable[[], None]] = []
        self.sent = 0  # messages sent (for the broker's counts)
        self.passed = 0  # of those, passed through at arrival (`Delivery.pass_through`)
        # groups' states (state, group no) written after its new groups: a router replica's
        # mapping of a group begun in this unit (`Conversations.route_first`)
        self.states: list[tuple[bytes, int]] | None = None
        # endpoints whose dialog's session key is stored with this unit (one statement for all
        # the dialogs a call opens, not one each)
        self.keys: list[int] = []
        self._queued: set[int] = set()  # groups of the first `_queued_n` arrivals (`queued_groups`)
        self._queued_n = 0

    def touch(self, ep: Endpoint) -> Endpoint:
        """Snapshot `ep`'s fields before it changes (once per unit of work), so a failure
        restores them and a commit tells what changed (`actors.model.dialogs.settings_of`)."""
        no = ep.no
        if no not in self.touched and no not in self.new_nos:
            # the copy of an instance's dict shares its keys and copies only the values
            self.touched[no] = ep.__dict__.copy()
        return ep

    def take_back(self, endpoint_no: int) -> None:
        """Drop the messages this unit delivered to `endpoint_no` (it ended in the same unit, so
        they go with those already stored; written, they would outlive it)."""
        if not any(run[2] == endpoint_no for run in self.messages):
            return
        runs: list[tuple[Any, ...]] = []
        arrivals: list[Arrived] = []
        for a in self.arrivals:  # each of them is one run of one endpoint (`Delivery.enqueue`)
            if a.at < 0:
                arrivals.append(a)
            elif self.messages[a.at][2] != endpoint_no:
                arrivals.append(a._replace(at=len(runs)))
                runs.append(self.messages[a.at])
        self.messages, self.arrivals = runs, arrivals
        self._queued, self._queued_n = set(), 0

    def queued_groups(self) -> set[int]:
        """The conversation groups this unit has queued messages for so far (kept up as
        arrivals are added, so asking after each of a call's thousand bundles stays cheap)."""
        n = len(self.arrivals)
        if n != self._queued_n:
            self._queued.update(a.group for a in self.arrivals[self._queued_n :])
            self._queued_n = n
        return self._queued

    def event(self, kind: str, subject: str, detail: str) -> None:
        """An operator event, written in this transaction and surfaced after it commits."""
        self.events.append(Event(self.now, kind, subject, detail))
