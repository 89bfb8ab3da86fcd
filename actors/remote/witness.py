"""`WitnessActor`: the witness of one mirrored broker, which decides who is principal.

Why a named detached actor on the head node: Ray's GCS is the one part of a cluster both partners
always reach while the cluster is up, and an actor serializes its calls, so every change of the
record is a compare-and-set on the epoch with nothing else in between (`actors.mirroring.roles`).
Ray's own key-value store would also sit in the GCS, but its API is private in this Ray and offers
no compare-and-set across keys. The record is also written to a small JSON file (atomically), so a
witness Ray restarts comes back with it. Before an automatic failover the witness asks the
principal itself: a mirror that merely lost sight of a running principal is not promoted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from typing import Any

import ray

from actors.errors import BrokerError, MirrorMismatch, StoreError
from actors.mirroring import roles
from actors.mirroring.pairkey import PairKey
from actors.mirroring.roles import Roles
from actors.store.file import sync_directory, write_new

PING_S = 0.3  # how long the witness waits for the principal before taking it for lost


def witness_name(broker: str) -> str:
    return f"{broker}.witness"


class WitnessActor:
    def __init__(
        self, broker: str, principal: str, mirror: str, path: str, namespace: str, key: PairKey
    ) -> None:
        self.path, self.namespace, self.key = path, namespace, key
        self.events: list[dict[str, Any]] = []
        # an error here is kept for `get` to raise as itself (Ray would pass on a constructor's
        # error only as text)
        self.start_error: BrokerError | None = None
        try:
            self._open(broker, principal, mirror, path)
        except BrokerError as exc:
            self.start_error = exc

    def _open(self, broker: str, principal: str, mirror: str, path: str) -> None:
        record = _load(path)
        if record is None:
            first = roles.first(broker, principal, mirror)
            self._save(first)
            self.roles = first
        else:
            self.roles = Roles(**record)
            if {self.roles.principal, self.roles.mirror} != {principal, mirror}:
                raise MirrorMismatch(
                    f"mirrored broker {broker!r} has partners {self.roles.principal!r} and "
                    f"{self.roles.mirror!r} (witness file {path!r}), not {principal!r} and "
                    f"{mirror!r}"
                )

    def _save(self, record: Roles) -> None:
        """Write `record` durably (the file and its rename synced) before the witness holds it
        in memory or anyone acts on it: a change that is not on disk is not made, so a witness
        restarted from its file never says less than it said before (an epoch handed out, a
        mirror exposed)."""
        tmp = f"{self.path}.tmp"
        try:
            write_new(tmp, json.dumps(record.as_dict()).encode())
            os.replace(tmp, self.path)
            sync_directory(os.path.dirname(os.path.abspath(self.path)))
        except OSError as exc:
            raise StoreError(
                self.path,
                "write",
                exc.strerror or str(exc),
                "the witness keeps its record there, on the head node: give start_mirrored_broker "
                "a witness_path in a directory that exists and is writable there",
            ) from None

    def get(self) -> dict[str, Any]:
        if self.start_error is not None:
            raise self.start_error
        return self.roles.as_dict()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def set_synchronized(
        self, partner: str, epoch: int, synchronized: bool, proof: bytes
    ) -> dict[str, Any]:
        self.key.check(partner, "set_synchronized", proof)
        changed = roles.set_synchronized(self.roles, partner, epoch, synchronized)
        if changed != self.roles:
            self._save(changed)
            self.roles = changed
            self._event("MirrorSynchronized" if synchronized else "MirrorExposed", partner)
        return self.roles.as_dict()

    async def promote(
        self, candidate: str, epoch: int, manual: bool, reason: str, proof: bytes
    ) -> dict[str, Any]:
        """Make `candidate` principal (see `roles.promote`); raises NoFailover or StaleEpoch,
        or MirrorCallerRefused when the call does not carry a proof made with this start's key
        for `candidate` (which either partner can make: both hold the key)."""
        self.key.check(candidate, "promote", proof)
        answers = False if manual else await self._principal_answers()
        promoted = roles.promote(
            self.roles,
            candidate,
            epoch,
            principal_answers=answers,
            manual=manual,
            at=time.time(),
            reason=reason,
        )
        self._save(promoted)
        self.roles = promoted
        self._event("Failover", f"{self.roles.mirror} -> {candidate}: {reason}")
        return self.roles.as_dict()

    async def _principal_answers(self) -> bool:
        try:
            handle = ray.get_actor(self.roles.principal, namespace=self.namespace)
            claim = await asyncio.wait_for(handle.role.remote(), PING_S)
        except (ValueError, TimeoutError, ray.exceptions.RayError, BrokerError):
            return False
        return bool(claim.get("role") == "principal" and claim.get("epoch") == self.roles.epoch)

    def _event(self, kind: str, detail: str) -> None:
        self.events.append({"at": time.time(), "kind": kind, "detail": detail})
        del self.events[:-100]

    def recent_events(self) -> list[dict[str, Any]]:
        return list(self.events)


def _load(path: str) -> dict[str, Any] | None:
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        return json.load(f)
    return None
