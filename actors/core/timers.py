"""Time: conversation timers, dialog lifetimes, lock leases, purges of closed endpoints, and the
pruning of bounded tables. `tick` fires whatever is due and says when to look again."""

from __future__ import annotations

from actors.core.changes import Changes
from actors.core.delivery import Delivery
from actors.core.receiving import Receiving
from actors.core.state import Due
from actors.core.work import Part, UnitOfWork
from actors.model.catalog import DIALOG_TIMER
from actors.model.dialogs import (
    CLOSED,
    CONVERSING,
    DISCONNECTED_INBOUND,
    LIFETIME_EXPIRED,
    STARTED_OUTBOUND,
)

LIVE = (STARTED_OUTBOUND, CONVERSING, DISCONNECTED_INBOUND)


class Timers(Part):
    def __init__(self, uow: UnitOfWork, delivery: Delivery, receiving: Receiving) -> None:
        super().__init__(uow)
        self.delivery = delivery
        self.receiving = receiving
        self.next_prune = 0.0

    def tick(self) -> float | None:
        """Fire what is due: conversation timers, lifetime expiries, expired leases, purges.
        Returns when something next falls due (None: nothing scheduled)."""
        st = self.state
        now = self.uow.clock()
        due: list[Due] = []
        for d in st.pop_due(now):
            ep = st.endpoints.get(d.endpoint_no)
            if ep is None:
                continue
            current = {
                "timer": ep.timer_at,
                "lifetime": ep.expires_at,
                "purge": ep.closed_at and ep.closed_at + st.limits.closed_retention_s,
            }
            if d.kind == "purge-retry" or current[d.kind] == d.at:
                due.append(d)
        if due:
            try:
                self.uow.run(lambda w: self._fire(w, due))
            except Exception:
                st.unpop(due)  # not lost: they fire on a later tick
                raise
        expired = st.locks.expired(now)
        if expired:
            self.receiving.rollback(expired, "abandoned when their lease ran out")
        if now >= self.next_prune:
            self.uow.run(self._prune)
        nexts = [
            t for t in (st.next_due(), st.locks.next_expiry(), self.next_prune) if t is not None
        ]
        return min(nexts) if nexts else None

    def _fire(self, w: Changes, due: list[Due]) -> None:
        st, delivery = self.state, self.delivery
        for d in due:
            ep = st.endpoints[d.endpoint_no]
            if d.kind == "timer" and ep.state is not CLOSED:
                w.touch(ep)
                ep.timer_at = None
                delivery.enqueue_own(w, ep, DIALOG_TIMER, b"")
            elif d.kind == "lifetime" and ep.state in LIVE:
                w.touch(ep)
                ep.expires_at = None
                delivery.post_error(w, ep, LIFETIME_EXPIRED, "the dialog's lifetime ran out")
                self.store.delete_endpoint_transmission(ep.no)  # nothing more goes out
            elif d.kind.startswith("purge") and (
                st.locks.is_locked(ep.group_no) or ep.no in self.store.with_transmission([ep.no])
            ):
                # locked, or its last messages (an EndDialog, an Error) are still on their way
                retry = w.now + st.limits.closed_retention_s
                w.after.append(lambda no=ep.no, at=retry: st.schedule_purge(no, at, "purge-retry"))
            elif d.kind in ("purge", "purge-retry"):
                delivery.remove_messages(w, ep)
                self.store.delete_endpoint_transmission(ep.no)
                w.dead_endpoints.append(ep)

    def _prune(self, w: Changes) -> None:
        limits = self.state.limits
        self.store.prune("audit", limits.audit_rows)
        self.store.prune("events", limits.event_rows)
        self.store.prune_requests(w.now - limits.request_retention_s)
        self.store.prune_ended(w.now - limits.ended_retention_s)
        self.next_prune = w.now + limits.prune_every_s
