"""The broker's keys: the master key (read once, when first needed) and the certificates this
broker makes for its own services, their private keys sealed under the master key before the
store sees them. Plain Python, no Ray."""

from __future__ import annotations

from dataclasses import replace

from actors.errors import SecurityError
from actors.model.credentials import Certificate
from actors.model.limits import Limits
from actors.security import certificates


class Keyring:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._master: bytes | None = None

    def master(self) -> bytes:
        """The master key; SecurityError saying how to give one if the broker has none."""
        if self._master is None:
            self._master = certificates.master_key(self.limits.master_key_file)
        if self._master is None:
            raise SecurityError(
                "this broker has no master key to seal private keys under: start it with "
                f"limits master_key_file=PATH, or with ${certificates.MASTER_KEY_FILE} in its "
                "environment (a file of at least 16 random bytes: head -c 32 /dev/urandom | "
                "base64 > master.key)"
            )
        return self._master

    def make(self, defn: Certificate, now: float) -> Certificate:
        """`defn` (a certificate of this broker's own, without a PEM) made: a new key pair and
        self-signed certificate, the private key sealed."""
        master = self.master()  # before the key is made: without one nothing is
        pem, key = certificates.make(defn.subject or str(defn.owner), defn.days, now)
        subject = certificates.read(pem).subject
        return replace(defn, certificate=pem, subject=subject,
                       private_key=certificates.seal_key(key, master))  # fmt: skip
