"""Who may make a mirrored broker's internal calls: the key its start shares among its actors.

`start_mirrored_broker` makes a random key and hands it to the witness and to both partners as it
starts them. Every call they make to each other that changes something (the principal's ships and
rebuilds to the mirror; a partner's `set_synchronized` and `promote` at the witness) carries the
caller's name and a proof: an HMAC of the key over that name and the method. The callee checks the
proof before doing anything, so a Ray client that does not hold this start's key (a script, a
partner or witness left from another start under the same names) is refused with
`MirrorCallerRefused` and changes nothing. What this does not stop, and why: docs/mirroring.md.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from actors.errors import MirrorCallerRefused

KEY_BYTES = 32


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


class PairKey:
    """One mirrored broker's key, held by its witness and its two partners (`members`)."""

    def __init__(self, broker: str, key: bytes, members: tuple[str, str]) -> None:
        if not isinstance(key, bytes) or len(key) != KEY_BYTES:
            raise ValueError(f"a mirrored broker's key is {KEY_BYTES} random bytes (new_key())")
        self.broker, self.members = broker, members
        self._key = key
        self._proofs: dict[tuple[str, str], bytes] = {}

    def __repr__(self) -> str:  # never the key itself (logs, tracebacks)
        return f"PairKey({self.broker!r}, members={self.members!r})"

    def prove(self, caller: str, method: str) -> bytes:
        """The proof `caller` sends with a call to `method`."""
        proof = self._proofs.get((caller, method))
        if proof is None:
            message = f"{self.broker}\0{caller}\0{method}".encode()
            proof = self._proofs[(caller, method)] = hmac.digest(self._key, message, hashlib.sha256)
        return proof

    def check(self, caller: object, method: str, proof: object) -> None:
        """Raise `MirrorCallerRefused` unless `caller` is a partner of this pair and `proof` is
        the one this key makes for it and `method`."""
        name = caller if isinstance(caller, str) else repr(caller)
        if (
            name not in self.members
            or not isinstance(proof, bytes)
            or not hmac.compare_digest(proof, self.prove(name, method))
        ):
            raise MirrorCallerRefused(self.broker, name[:200], method)
