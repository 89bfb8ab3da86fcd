"""The witness's rules for a mirrored broker's roles: compare-and-set on the epoch, promotion only
of a synchronized mirror, never while the principal still answers (unless an operator asks), and
an old principal fenced by its stale epoch. No Ray."""

from __future__ import annotations

import pytest

from actors.errors import MirrorMismatch, NoFailover, StaleEpoch
from actors.mirroring import roles
from actors.mirroring.roles import FailureDetector


def synced() -> roles.Roles:
    r = roles.first("shop", "shop.a", "shop.b")
    return roles.set_synchronized(r, "shop.a", 1, True)


def test_a_new_record_names_two_partners_and_the_principal_at_epoch_one():
    r = roles.first("shop", "shop.a", "shop.b")
    assert (r.role_of("shop.a"), r.role_of("shop.b"), r.epoch, r.synchronized) == (
        "principal", "mirror", 1, False)  # fmt: skip
    with pytest.raises(MirrorMismatch, match="two partners"):
        roles.first("shop", "shop.a", "shop.a")
    with pytest.raises(MirrorMismatch, match="not a partner"):
        r.role_of("other")


def test_a_synchronized_mirror_whose_principal_is_lost_is_promoted_and_the_epoch_moves():
    r = roles.promote(
        synced(), "shop.b", 1, principal_answers=False, manual=False, at=5.0, reason="lost"
    )
    assert (r.principal, r.mirror, r.epoch, r.synchronized, r.failovers) == (
        "shop.b", "shop.a", 2, False, 1)  # fmt: skip
    assert r.last_failover == {"at": 5.0, "from": "shop.a", "to": "shop.b", "manual": False,
                               "reason": "lost"}  # fmt: skip


def test_an_unsynchronized_mirror_is_never_promoted():
    r = roles.first("shop", "shop.a", "shop.b")
    with pytest.raises(NoFailover, match="not synchronized"):
        roles.promote(r, "shop.b", 1, principal_answers=False, manual=True, at=0, reason="")


def test_no_automatic_failover_while_the_principal_answers_the_witness_but_a_manual_one():
    with pytest.raises(NoFailover, match="still answers"):
        roles.promote(synced(), "shop.b", 1, principal_answers=True, manual=False, at=0, reason="")
    r = roles.promote(synced(), "shop.b", 1, principal_answers=True, manual=True, at=0, reason="")
    assert r.principal == "shop.b"


def test_the_old_principal_is_fenced_by_its_stale_epoch():
    r = roles.promote(synced(), "shop.b", 1, principal_answers=False, manual=False, at=0, reason="")
    with pytest.raises(StaleEpoch) as info:  # it may not run alone ("exposed") any more
        roles.set_synchronized(r, "shop.a", 1, False)
    assert (info.value.epoch, info.value.current) == (1, 2)
    with pytest.raises(StaleEpoch):
        roles.check_epoch(r, "shop.a", 2)  # nor act on the new epoch: it is not principal
    roles.check_epoch(r, "shop.b", 2)


def test_a_promotion_asked_on_an_old_epoch_or_by_the_principal_is_refused():
    with pytest.raises(StaleEpoch):
        roles.promote(synced(), "shop.b", 0, principal_answers=False, manual=False, at=0, reason="")
    with pytest.raises(StaleEpoch):
        roles.promote(synced(), "shop.a", 1, principal_answers=False, manual=False, at=0, reason="")


def test_the_failure_detector_waits_out_its_bound_and_a_success_resets_it():
    d = FailureDetector(after_s=1.0)
    assert not d.observe(False, 10.0)
    assert not d.observe(False, 10.5)
    assert not d.observe(True, 10.8)
    assert not d.observe(False, 11.0)
    assert d.observe(False, 12.0)


def test_a_ping_that_could_not_tell_restarts_the_count_and_real_failures_still_promote():
    d = FailureDetector(after_s=1.0)
    assert not d.observe(False, 10.0)
    # the mirror itself was too busy to hear the answer in time: no evidence against the principal
    assert not d.observe(None, 10.6)
    assert not d.observe(False, 11.2)
    assert not d.observe(False, 12.0)
    assert d.observe(False, 12.2)
