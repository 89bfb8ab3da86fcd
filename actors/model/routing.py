"""Routes and the routing decision: which next hops a conversation's messages go to.

Pure: no Ray, no store, no I/O. The same `match` and `choose` serve both tables a broker holds:
its own routes (conversations begun here) and its instance routes (messages from other brokers,
delivered locally or forwarded).
"""

from __future__ import annotations

import functools
import hashlib
import math
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from actors.errors import AlreadyExists, InvalidArgument, InvalidDefinition, UnknownRoute
from actors.model.names import check_name

LOCAL = "LOCAL"
TRANSPORT = "TRANSPORT"
RAY_SCHEME = "ray://"
AUTO_LOCAL = "AutoCreatedLocal"
IMPLICIT_LOCAL = "ImplicitLocal"  # name of the route step 6 stands in for; never in a table
MEMO_MAX = 4096  # next_hops answers a route table remembers (services x brokers asked for)

STEPS = {
    1: "service and broker instance",
    2: "service without broker instance",
    3: "service, broker instance picked by conversation id",  # draining routes skipped
    4: "dynamic routing",
    5: "wildcard route",
    6: "implicit LOCAL",
    7: "delayed",
}

DynamicHook = Callable[[str, "str | None"], "Iterable[Route] | None"]


def _valid_name(kind: str, name: object) -> str:
    try:
        return check_name(kind, name)
    except InvalidDefinition as e:  # a route is an argument to a verb, not a catalog definition
        raise InvalidArgument(str(e)) from None


# --- addresses -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Address:
    """A parsed route address: kind "local", "transport" or "ray" (then `broker` names it)."""

    kind: str
    broker: str | None = None

    def __str__(self) -> str:
        if self.kind == "ray":
            return f"{RAY_SCHEME}{self.broker}"
        return LOCAL if self.kind == "local" else TRANSPORT


def parse_address(text: object) -> Address:
    """Parse "LOCAL", "TRANSPORT" or "ray://<broker name>"; anything else is InvalidArgument."""
    forms = "use 'LOCAL', 'TRANSPORT' or 'ray://<broker name>'"
    if not isinstance(text, str) or not text:
        raise InvalidArgument(f"route address {text!r} is not valid: {forms}")
    if text.upper() in (LOCAL, TRANSPORT):  # keywords are case-insensitive, as in T-SQL
        return Address(text.lower())
    if not text.lower().startswith(RAY_SCHEME):
        raise InvalidArgument(
            f"route address {text!r} is not valid: {forms} (other schemes, e.g. tcp://, are not "
            "supported)"
        )
    broker = text[len(RAY_SCHEME) :]
    if not broker:
        raise InvalidArgument(
            f"route address {text!r} names no broker: write 'ray://<broker name>', e.g. 'ray://B1'"
        )
    if "/" in broker:  # "ray://<broker>/<service>" is a service name that carries its broker
        raise InvalidArgument(
            f"route address {text!r}: a broker name may not contain '/'; write "
            "'ray://<broker name>' (to route by a service name's broker, use 'TRANSPORT')"
        )
    try:
        return Address("ray", _valid_name("broker", broker))
    except InvalidArgument as e:
        raise InvalidArgument(f"route address {text!r}: {e}") from None


def transport_address(service_name: str) -> str | None:
    """The broker address a service name of the form "ray://<broker>/<service>" carries, or None."""
    if not service_name.lower().startswith(RAY_SCHEME):
        return None
    broker, sep, rest = service_name[len(RAY_SCHEME) :].partition("/")
    if not sep or not rest:
        return None
    try:
        return str(parse_address(RAY_SCHEME + broker))
    except InvalidArgument:
        return None


# --- routes --------------------------------------------------------------------------------------


def check_broker_id(value: object) -> str:
    try:  # canonical lower-case form, so ids compare equal however they were written
        if type(value) is str:
            return _canonical_id(value)
        return str(value if isinstance(value, uuid.UUID) else uuid.UUID(value))  # type: ignore
    except (TypeError, ValueError, AttributeError):
        raise InvalidArgument(
            f"broker instance {value!r} is not a broker id: give the target broker's id (a UUID, "
            "as its info() shows), or None to match any broker"
        ) from None


@functools.lru_cache(maxsize=4096)
def _canonical_id(value: str) -> str:
    """A broker id's canonical form. Routing checks the same few ids (its own, its dialogs' far
    brokers') on every decision, and parsing a UUID costs more than the rest of a match."""
    return str(uuid.UUID(value))


@dataclass(frozen=True)
class Route:
    """Where messages for a service (None: any) on a broker id (None: any) go.

    address: "LOCAL", "TRANSPORT" or "ray://<broker>"; mirror_address: a second "ray://" address
    for the same target (tried too); expires_at: absolute time after which the route is ignored;
    draining: the route takes no new dialogs (step 3 and `balance` skip it) but still carries the
    dialogs pinned to its broker instance (step 1).
    """

    name: str
    service_name: str | None = None
    broker_instance: str | None = None
    address: str = LOCAL
    mirror_address: str | None = None
    expires_at: float | None = None
    draining: bool = False

    def __post_init__(self) -> None:
        _valid_name("route", self.name)
        if not isinstance(self.draining, bool):  # "no" or 0 are not False
            raise InvalidArgument(
                f"route {self.name!r}: draining must be True or False, not {self.draining!r}"
            )
        if self.service_name is not None:
            _valid_name("service", self.service_name)
        if self.broker_instance is not None:
            object.__setattr__(self, "broker_instance", check_broker_id(self.broker_instance))
            if self.service_name is None:
                # seed 001's matching steps never consider such a route; refuse it rather than
                # keep a route that silently matches nothing
                raise InvalidArgument(
                    f"route {self.name!r} gives a broker instance but no service name, so it "
                    "would never match; give service_name too, or drop broker_instance"
                )
        addr = parse_address(self.address)
        object.__setattr__(self, "address", str(addr))
        if self.mirror_address is not None:
            mirror = parse_address(self.mirror_address)
            if mirror.kind != "ray" or addr.kind != "ray":
                raise InvalidArgument(
                    f"route {self.name!r}: a mirror pairs two brokers, so both address and "
                    "mirror_address must be 'ray://<broker name>'"
                )
            if mirror == addr:
                raise InvalidArgument(
                    f"route {self.name!r}: mirror_address equals address; give the partner "
                    "broker's address or None"
                )
            object.__setattr__(self, "mirror_address", str(mirror))
        if self.expires_at is not None:
            ok = isinstance(self.expires_at, (int, float)) and not isinstance(self.expires_at, bool)
            if not ok or not math.isfinite(self.expires_at):
                raise InvalidArgument(
                    f"route {self.name!r}: expires_at {self.expires_at!r} must be a finite "
                    "absolute time (seconds) or None for no expiry"
                )
            object.__setattr__(self, "expires_at", float(self.expires_at))

    def live(self, now: float) -> bool:
        """True until expires_at."""
        return self.expires_at is None or now < self.expires_at

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Route:
        unknown = set(record) - {f.name for f in fields(cls)}
        if unknown:
            raise InvalidArgument(f"route record has unknown fields {sorted(unknown)}")
        return cls(**record)


def target_hazards(routes: Iterable[Route], now: float) -> list[str]:
    """Seed 002's "multiple target endpoints" hazard: live routes for one service, without broker
    ids, that point at different addresses. One warning per service."""
    by_service: dict[str, dict[str, list[str]]] = {}
    for r in routes:
        if r.service_name is not None and r.broker_instance is None and r.live(now):
            by_service.setdefault(r.service_name, {}).setdefault(r.address, []).append(r.name)
    warnings = []
    for service, by_addr in sorted(by_service.items()):
        if len(by_addr) < 2:
            continue
        names = sorted(n for ns in by_addr.values() for n in ns)
        warnings.append(
            f"routes {names} send service {service!r} to different addresses "
            f"{sorted(by_addr)} without a broker instance: if these reach different brokers, one "
            "dialog can create a target endpoint on each (multiple target endpoints). Give each "
            "route broker_instance=<its target broker's id> (routes to different brokers then "
            "share new dialogs round-robin); if they are alternative paths to one broker, give "
            "them all that broker's id"
        )
    return warnings


class RouteTable:
    """Routes by name. A new table holds only AutoCreatedLocal; pass `routes` to restore one."""

    def __init__(self, routes: Iterable[Route] | None = None) -> None:
        self._routes: dict[str, Route] = {}
        for r in [Route(AUTO_LOCAL)] if routes is None else routes:
            if r.name in self._routes:
                raise AlreadyExists("route", r.name)
            self._routes[r.name] = r
        self._forget()

    def _forget(self) -> None:
        """Drop what `next_hops` remembered: the routes changed."""
        self._memo: dict[tuple, tuple] = {}
        self._memo_until = -math.inf

    def memo(self, now: float) -> dict[tuple, tuple]:
        """`next_hops`'s results that hold for any conversation, valid while no route of the
        table changes and none expires (emptied at the next expiry, so every time it is asked
        `now` sees the routes live then)."""
        if now >= self._memo_until or len(self._memo) > MEMO_MAX:
            self._memo = {}
            later = [r.expires_at for r in self._routes.values() if r.live(now) and r.expires_at]
            self._memo_until = min(later, default=math.inf)
        return self._memo

    def __iter__(self) -> Iterator[Route]:
        return iter(self._routes.values())

    def routes(self) -> tuple[Route, ...]:
        return tuple(self._routes.values())

    def get(self, name: str) -> Route:
        route = self._routes.get(name) if isinstance(name, str) else None
        if route is None:
            raise UnknownRoute(name)
        return route

    def _check_live(self, route: Route, now: float) -> None:
        if not route.live(now):
            raise InvalidArgument(
                f"route {route.name!r} expires at {route.expires_at}, which is not after now "
                f"({now}); give a later expires_at, or None for no expiry"
            )

    def _warnings(self, route: Route, now: float) -> list[str]:
        same = [r for r in self._routes.values() if r.service_name == route.service_name]
        return target_hazards(same, now)

    def create(self, route: Route, now: float) -> list[str]:
        """Add a route; returns warnings (multiple target endpoints hazard), possibly empty."""
        if route.name in self._routes:
            raise AlreadyExists("route", route.name)
        self._check_live(route, now)
        self._routes[route.name] = route
        self._forget()
        return self._warnings(route, now)

    def alter(self, name: str, now: float, /, **changes: Any) -> list[str]:
        """Change some fields of a route; the result must be valid and live. Returns warnings."""
        old = self.get(name)
        allowed = {f.name for f in fields(Route)} - {"name"}
        bad = set(changes) - allowed
        if bad:
            raise InvalidArgument(
                f"cannot alter {sorted(bad)} of route {name!r}: alterable fields are "
                f"{sorted(allowed)} (to rename, create a new route and drop this one)"
            )
        new = replace(old, **changes)
        self._check_live(new, now)
        self._routes[name] = new
        self._forget()
        return self._warnings(new, now)

    def drop(self, name: str) -> Route:
        self.get(name)
        self._forget()
        return self._routes.pop(name)


# --- matching ------------------------------------------------------------------------------------


def load_balance_key(conversation_id: str, salt: str = "") -> int:
    """A stable 64-bit hash of a conversation id (same in every process and after restarts)."""
    digest = hashlib.sha256(f"{salt}{conversation_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


@dataclass(frozen=True)
class Match:
    """The outcome of `match`: the step that matched (1-7), its routes, and for step 3 the broker
    instance picked. Step 7 means delayed: no routes, and `reason` says what to do."""

    step: int
    service_name: str
    conversation_id: str
    routes: tuple[Route, ...] = ()
    broker_instance: str | None = None
    reason: str | None = None

    @property
    def delayed(self) -> bool:
        return self.step == 7

    def describe(self) -> str:
        """One line for status displays (e.g. the transmission queue)."""
        if self.delayed:
            return f"delayed: {self.reason}"
        names = ", ".join(r.name for r in self.routes)
        picked = f" (broker instance {self.broker_instance})" if self.step == 3 else ""
        return f"routed by step {self.step}, {STEPS[self.step]}{picked}: {names}"


def _sorted(routes: Iterable[Route]) -> tuple[Route, ...]:
    return tuple(sorted(routes, key=lambda r: r.name))  # independent of table order


def match(
    routes: Iterable[Route],
    service_name: str,
    broker_instance: str | None,
    conversation_id: str,
    now: float,
    *,
    local_broker_id: str,
    dynamic: DynamicHook | None = None,
) -> Match:
    """Seed 001's matching steps, in order; the first step that yields routes wins."""
    bi = None if broker_instance is None else check_broker_id(broker_instance)
    local_id = check_broker_id(local_broker_id)
    every = list(routes)
    live = [r for r in every if r.live(now)]
    named = [r for r in live if r.service_name == service_name]

    def found(step: int, rs: Iterable[Route], picked: str | None = None) -> Match:
        return Match(step, service_name, conversation_id, _sorted(rs), picked)

    if bi is not None and (rs := [r for r in named if r.broker_instance == bi]):
        return found(1, rs)
    if rs := [r for r in named if r.broker_instance is None]:
        return found(2, rs)
    if bi is None and (ids := step_3_ids(named)):
        # a dialog not pinned at BEGIN (begun before round-robin, or its routes changed since):
        # hash over DISTINCT ids, so extra routes (paths) to one broker do not weigh its share
        pick = ids[load_balance_key(conversation_id) % len(ids)]
        return found(3, [r for r in named if r.broker_instance == pick and not r.draining], pick)
    if dynamic is not None:
        offered = dynamic(service_name, bi) or ()
        rs = [
            r
            for r in offered
            if r.live(now)
            and r.service_name in (None, service_name)
            and (bi is None or r.broker_instance in (None, bi))
        ]
        if rs:
            return found(4, rs)
    if rs := [r for r in live if r.service_name is None and r.broker_instance is None]:
        return found(5, rs)
    if bi is not None and bi == local_id:
        return found(6, [Route(IMPLICIT_LOCAL, service_name, bi, LOCAL)])
    expired = [r for r in every if not r.live(now) and r.service_name in (None, service_name)]
    return Match(7, service_name, conversation_id, reason=_delay_reason(expired, service_name, bi))


def step_3_ids(named: Iterable[Route]) -> list[str]:
    """The broker ids step 3 picks among: those of live routes for the service that give one and
    are not draining, distinct and sorted."""
    return sorted({r.broker_instance for r in named if r.broker_instance and not r.draining})


def balance(routes: Iterable[Route], service_name: str, now: float, turn: int) -> str | None:
    """The broker instance a NEW dialog for `service_name` is pinned to at BEGIN: round-robin
    (`turn` counts the dialogs balanced so far) over the ids step 3 would pick among.

    Only when step 3 has a choice: the service's live routes give two or more distinct broker
    instances (draining ones count here, so the others still get pinned while one drains) and
    every one of them gives a broker instance (else step 2 would win). Otherwise None: the
    dialog is routed as before (one broker id behind several paths stays unpinned until its
    first acknowledgement)."""
    named = [r for r in routes if r.live(now) and r.service_name == service_name]
    if any(r.broker_instance is None for r in named):
        return None
    if len({r.broker_instance for r in named}) < 2:
        return None
    ids = step_3_ids(named)
    return ids[turn % len(ids)] if ids else None


def _delay_reason(expired: list[Route], service_name: str, bi: str | None) -> str:
    target = f"service {service_name!r}" + (f" on broker instance {bi}" if bi else "")
    names = sorted(r.name for r in expired)
    hint = f" (routes {names} for it have expired; alter their expires_at)" if names else ""
    return (
        f"no live route matches {target}{hint}. Create a route for {service_name!r} (or a "
        "wildcard route such as AutoCreatedLocal); the conversation is retried later"
    )
