"""Roles: who is principal of a mirrored broker, as the witness records it, and when that changes.

The witness holds one `Roles` record per mirrored broker and changes it only by compare-and-set
on the `epoch`: a partner acts on the epoch it was given, and a change asked on an old epoch is
refused (`StaleEpoch`). That is what rules out a split brain:

- the principal answers a caller only once the mirror holds the caller's transaction, or, when
  the mirror cannot be reached, once the witness has recorded `synchronized=False` at the
  principal's epoch ("exposed": running alone);
- the mirror is promoted only while `synchronized` is true (it then holds every answered
  transaction), and a promotion moves the epoch on;
- so an old principal can neither have the mirror apply its writes (the new principal refuses its
  stale epoch) nor answer a caller alone (its compare-and-set fails): it learns it is no longer
  principal and rejoins as mirror, rebuilt from the new principal.

Plain Python; `actors.remote.mirrored` keeps the record in a Ray actor backed by Ray's KV.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from actors.errors import MirrorMismatch, NoFailover, StaleEpoch


@dataclass(frozen=True)
class Roles:
    """One mirrored broker's record at the witness."""

    broker: str  # the mirrored broker's name (what clients connect to)
    principal: str  # the partner that takes writes
    mirror: str  # the other partner
    epoch: int = 1
    synchronized: bool = False  # the mirror holds every transaction answered to a caller
    failovers: int = 0
    last_failover: dict[str, Any] | None = None  # {"at", "from", "to", "manual", "reason"}

    def role_of(self, partner: str) -> str:
        if partner == self.principal:
            return "principal"
        if partner == self.mirror:
            return "mirror"
        raise MirrorMismatch(
            f"{partner!r} is not a partner of mirrored broker {self.broker!r} (its partners are "
            f"{self.principal!r} and {self.mirror!r})"
        )

    def partner_of(self, partner: str) -> str:
        return self.mirror if self.role_of(partner) == "principal" else self.principal

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def first(broker: str, principal: str, mirror: str) -> Roles:
    """The record of a new mirrored broker. Its partners must differ."""
    if principal == mirror:
        raise MirrorMismatch(
            f"mirrored broker {broker!r}: principal and mirror are both {principal!r}; a "
            "mirror needs two partners, each with its own store"
        )
    return Roles(broker, principal, mirror)


def check_epoch(roles: Roles, partner: str, epoch: int) -> None:
    """`partner` acts as principal on `epoch`: refused unless both are current."""
    if epoch != roles.epoch or partner != roles.principal:
        raise StaleEpoch(partner, epoch, roles.epoch)


def set_synchronized(roles: Roles, partner: str, epoch: int, synchronized: bool) -> Roles:
    """The principal says whether its mirror holds everything it answered (compare-and-set)."""
    check_epoch(roles, partner, epoch)
    return dataclasses.replace(roles, synchronized=synchronized)


def promote(
    roles: Roles,
    candidate: str,
    epoch: int,
    *,
    principal_answers: bool,
    manual: bool,
    at: float,
    reason: str,
) -> Roles:
    """Make the mirror `candidate` the principal (the old principal becomes the mirror).

    Automatic (the mirror lost the principal): only if the witness cannot reach the principal
    either. Manual (an operator's failover): the principal may be running; it is fenced by the
    epoch. Either way only a synchronized mirror is promoted: it holds every answered write."""
    if roles.role_of(candidate) != "mirror" or epoch != roles.epoch:
        raise StaleEpoch(candidate, epoch, roles.epoch)
    if not roles.synchronized:
        raise NoFailover(
            roles.broker,
            f"mirror {candidate!r} is not synchronized (it may lack transactions the principal "
            f"{roles.principal!r} answered); bring the principal back, or wait until the mirror "
            "has caught up",
        )
    if principal_answers and not manual:
        raise NoFailover(
            roles.broker,
            f"the principal {roles.principal!r} still answers the witness; a failover while it "
            "runs is an operator's decision (failover)",
        )
    moved = {"at": at, "from": roles.principal, "to": candidate, "manual": manual}
    return dataclasses.replace(
        roles,
        principal=candidate,
        mirror=roles.principal,
        epoch=roles.epoch + 1,
        synchronized=False,  # nobody mirrors the new principal until the old one rejoins
        failovers=roles.failovers + 1,
        last_failover=moved | {"reason": reason},
    )


class FailureDetector:
    """The mirror's view of the principal: promote after `after_s` seconds in which every ping
    failed (one success resets it).

    A ping whose timeout the mirror itself heard late tells nothing: the mirror's own event loop
    was busy (applying a ship of the log), and the answer may have been waiting for it. Counted as
    failures, such pings made a mirror under load promote itself while its principal was well.
    They restart the count, as a success does: once the principal is really gone, the mirror has
    nothing left to apply and hears its timeouts on time."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self.failing_since: float | None = None

    def observe(self, answered: bool | None, now: float) -> bool:
        """Record one ping (`now`: when it was sent; `answered` None: it could not tell); whether
        the principal is now taken for lost."""
        if answered is None or answered:
            self.failing_since = None
            return False
        if self.failing_since is None:
            self.failing_since = now
        return now - self.failing_since >= self.after_s
