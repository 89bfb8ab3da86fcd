"""Every tunable of one broker, in one place, with the defaults a serious deployment starts from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from actors.errors import InvalidArgument
from actors.model import checks
from actors.model.code_names import check_code_modules

_ZERO_OK = frozenset(
    {"read_cache_bytes", "closed_retention_s", "ended_retention_s"}
)  # 0: off / at once


@dataclass(frozen=True)
class Limits:
    # --- messages and the store ---
    max_body_bytes: int = 4 << 20
    max_call_bytes: int = 64 << 20  # the bodies of one call (apply, settle), summed
    lease_s: float = 30.0  # how long a receive holds its groups when the caller names no lease
    closed_retention_s: float = 60.0  # closed endpoints linger so late use gets a clear error
    # a target endpoint of another broker's dialog removed here is remembered this long (as
    # Service Broker keeps closed endpoints about half an hour), so a late resend of what it took
    # is not delivered again; so is a dialog begun if absent, so a re-run does not begin it again
    ended_retention_s: float = 1800.0
    audit_rows: int = 100_000  # committed receive batches kept in the delivery audit
    event_rows: int = 10_000
    request_retention_s: float = 600.0  # how long a retried call is recognised
    read_cache_bytes: int = 256 << 20  # waiting messages kept in memory for receive
    # dialog endpoints (and as many conversation groups) kept in memory; the rest stay in the
    # store and are read back by key when used: memory follows the dialogs in use
    endpoint_cache: int = 100_000
    prune_every_s: float = 60.0
    # --- between brokers ---
    forward_buffer: int = 10_000  # messages a forwarding broker holds in memory at once
    hop_limit: int = 16  # a bundle forwarded this many times is dropped: a routing loop ends
    batch_rows: int = 4096  # messages per call to a far broker; more make several calls in flight
    dispatch_rows: int = 20_000  # waiting messages routed per dispatch pass (whole rows)
    retry_min_s: float = 0.05  # an unacknowledged message is retried after this, doubling ...
    retry_max_s: float = 5.0  # ... up to this
    send_timeout_s: float = 30.0  # a far broker that takes longer is treated as unreachable
    # --- the actor's clock ---
    tick_max_s: float = 0.25  # the longest the clock sleeps between looks at timers and leases
    owner_check_s: float = 1.0  # how often holders of locks are checked for being alive
    # --- activation ---
    growth_check_s: float = 0.5  # how often a running pool looks at whether its queue grows
    failed_start_backoff_s: float = 5.0  # no new reader for this long after one could not start
    backlog_target_s: float = 2.0  # a backlog the readers would need longer than this wants more
    # --- code named by definitions (actors.model.code_names) ---
    code_modules: tuple[str, ...] = ()  # modules or packages handlers and classifiers may be in
    # --- dialog security (actors.security) ---
    # the file holding the master key this broker's private keys are sealed under (else
    # $RAYBROKER_MASTER_KEY_FILE or $RAYBROKER_MASTER_KEY in its process); a path, never the key
    master_key_file: str | None = None
    # transport security: take calls from other brokers only when signed by an identity granted
    # CONNECT here (a broker with an identity signs its own calls either way)
    transport_security: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "code_modules", check_code_modules(self.code_modules))
        for f in fields(self):
            value, what, zero = getattr(self, f.name), f"limit {f.name}", f.name in _ZERO_OK
            if f.name == "code_modules":
                continue
            if f.name == "transport_security":
                checks.flag(what, value)
                continue
            if f.name == "master_key_file":
                if value is not None and (not isinstance(value, str) or not value):
                    raise InvalidArgument(f"{what} is a file's path, not {value!r}")
                continue
            if f.type in (int, "int"):
                checks.whole(what, value, least=0 if zero else 1)
            else:
                object.__setattr__(self, f.name, checks.seconds(what, value, zero=zero))
        if self.retry_min_s > self.retry_max_s:
            raise InvalidArgument(
                f"limit retry_min_s ({self.retry_min_s}) must not exceed retry_max_s "
                f"({self.retry_max_s})"
            )

    @classmethod
    def of(cls, options: Mapping[str, Any] | None) -> Limits:
        """Limits from keyword options; an unknown name is an `InvalidArgument`."""
        options = dict(options or {})
        unknown = sorted(set(options) - {f.name for f in fields(cls)})
        if unknown:
            known = ", ".join(f.name for f in fields(cls))
            raise InvalidArgument(f"unknown limit(s) {unknown}; the limits are: {known}")
        return cls(**options)

    def backoff(self, attempts: int) -> float:
        """How long to wait before the next attempt at a message tried `attempts` times."""
        return min(self.retry_max_s, self.retry_min_s * (2 ** min(attempts, 10)))
