"""BrokerCore, property-based: any interleaving of sends, receives, commits and rollbacks over
several dialogs (some sharing a conversation group) delivers every message exactly once, and each
dialog's messages in sequence order. No Ray: a :memory: store and a fake clock."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from actors.calls.envelope import Begin, Send
from actors.core import BrokerCore
from actors.model.catalog import Queue, Service
from actors.store.database import Store
from tests.fakes import FakeClock

# Dialogs 0-2 share group "g0" on the receiving queue, 3 is alone in "g1", 4 has its own group.
GROUPS = ["g0", "g0", "g0", "g1", None]
N = len(GROUPS)


class DeliveryMachine(RuleBasedStateMachine):
    """Messages flow from each dialog's target (service "Out") to its initiator on queue "In",
    where the initiators were begun in related groups."""

    def __init__(self) -> None:
        super().__init__()
        self.core = core = BrokerCore(Store(":memory:"), FakeClock())
        core.create(Queue("In", poison_limit=0))  # rollbacks here are the test, not poison
        core.create(Queue("OutQ"))
        core.create(Service("In", "In"))
        core.create(Service("Out", "OutQ", ("DEFAULT",)))
        begins = [Begin("In", "Out", related_group=g) for g in GROUPS]
        core.apply([*begins, *(Send(b.handle, "DEFAULT", b"open") for b in begins)])
        got = core.receive("OutQ", max_groups=N)
        core.settle(commit=[g.lock_id for g in got])
        by_init = {b.handle: i for i, b in enumerate(begins)}
        self.dialog_of_init = by_init  # initiator handle -> dialog number
        self.target = [""] * N
        for g in got:
            for m in g.messages:
                conv = m.conversation_id
                init = next(
                    e["conversation_handle"]
                    for e in core.endpoints_view()
                    if e["conversation_id"] == conv and e["is_initiator"]
                )
                self.target[by_init[init]] = m.conversation_handle
        self.sent: list[list[bytes]] = [[] for _ in range(N)]
        self.held: dict[str, list] = {}  # lock id -> received messages
        self.committed: list[tuple[int, int, bytes]] = []  # (dialog, sequence number, body)
        self.next_body = 0

    # --- steps -----------------------------------------------------------------------------

    @rule(dialog=st.integers(0, N - 1), n=st.integers(1, 3))
    def send(self, dialog: int, n: int) -> None:
        bodies = [f"{dialog}:{self.next_body + k}".encode() for k in range(n)]
        self.next_body += n
        self.core.apply([Send(self.target[dialog], "DEFAULT", bodies)])
        self.sent[dialog] += bodies

    @rule(k=st.integers(1, 3), top=st.none() | st.integers(1, 3))
    def receive(self, k: int, top: int | None) -> None:
        held_groups = {m[0].conversation_group_id for m in self.held.values()}
        got = self.core.receive("In", max_groups=k, top=top)
        assert len(got) <= k
        for g in got:
            assert g.group_id not in held_groups, "a locked group was received again"
            assert g.messages and (top is None or len(g.messages) <= top)
            assert {m.conversation_group_id for m in g.messages} == {g.group_id}
            dialogs = {self.dialog_of_init[m.conversation_handle] for m in g.messages}
            assert len({GROUPS[d] or d for d in dialogs}) == 1, "dialogs of two groups mixed"
            held_groups.add(g.group_id)
            self.held[g.lock_id] = g.messages

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        locks = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, unique=True))
        result = self.core.settle(commit=locks)
        assert result["committed"] == sum(len(self.held[lk]) for lk in locks)
        for lk in locks:
            self.committed += [
                (self.dialog_of_init[m.conversation_handle], m.sequence_number, m.body)
                for m in self.held.pop(lk)
            ]

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        locks = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, unique=True))
        self.core.settle(rollback=locks)
        for lk in locks:
            del self.held[lk]

    @invariant()
    def depth_is_sent_minus_committed(self) -> None:
        sent = sum(map(len, self.sent))
        assert self.core.queues_view()["In"]["depth"] == sent - len(self.committed)
        locked = sum(1 for r in self.core.queue_view("In") if r["status"] == "locked")
        assert locked == sum(map(len, self.held.values()))

    # --- the end: drain, then every message was committed once, in order -------------------

    def teardown(self) -> None:
        try:
            self.core.settle(commit=list(self.held))
            self.committed += [
                (self.dialog_of_init[m.conversation_handle], m.sequence_number, m.body)
                for msgs in self.held.values()
                for m in msgs
            ]
            while got := self.core.receive("In", max_groups=N):
                self.core.settle(commit=[g.lock_id for g in got])
                self.committed += [
                    (self.dialog_of_init[m.conversation_handle], m.sequence_number, m.body)
                    for g in got
                    for m in g.messages
                ]
            assert Counter(b for _, _, b in self.committed) == Counter(
                b for bodies in self.sent for b in bodies
            ), "not every message was committed exactly once"
            for d in range(N):
                mine = [(seq, body) for dd, seq, body in self.committed if dd == d]
                assert mine == list(enumerate(self.sent[d])), f"dialog {d} out of order"
            assert self.core.queues_view()["In"]["depth"] == 0
        finally:
            self.core.store.close()


DeliveryMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_every_message_is_committed_exactly_once_and_in_sequence_order = DeliveryMachine.TestCase
