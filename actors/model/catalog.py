"""Message types, contracts, queues and services: their definitions, their checks, and validation.

Plain Python, no Ray. `Catalog` is the registry one broker holds; every change goes through
`Catalog.check_*` first so that a refused definition leaves the registry as it was.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from actors.errors import (
    AlreadyExists,
    InUse,
    InvalidDefinition,
    UnknownBinding,
    UnknownCertificate,
    UnknownContract,
    UnknownGrant,
    UnknownMessageType,
    UnknownQueue,
    UnknownService,
    shown,
)
from actors.model import credentials
from actors.model.bodies import MAX_DEFINITION_DEPTH, BodyValidator, plain_json_object, too_deep
from actors.model.code_names import check_code_name, handler_path, resolve_handler
from actors.model.credentials import Certificate, Credential, Grant, RemoteServiceBinding
from actors.model.names import check_name

VALIDATIONS = ("none", "empty", "json", "msgpack", "json_schema")
# a router set's queue handler (actors.ddr.router): its options name a classifier, code too
ROUTER_HANDLER = "actors.ddr.router:route_messages"
SIDES = ("initiator", "target", "any")

# System message types, as Service Broker has them. They are never validated, may be sent by
# either side whatever the contract, and user definitions may not take their names.
END_DIALOG = "EndDialog"
ERROR = "Error"
DIALOG_TIMER = "DialogTimer"
ECHO = "Echo"
SYSTEM_TYPES = frozenset({END_DIALOG, ERROR, DIALOG_TIMER})
# A router's answer in redirect mode (actors.ddr): the target side may send it on any contract.
REDIRECT = "Redirect"

# Built in, like SQL Server's DEFAULT message type and contract and its ServiceEcho contract.
DEFAULT = "DEFAULT"
ECHO_CONTRACT = "Echo"


@dataclass(frozen=True)
class MessageType:
    """A message type and how arriving bodies of that type are validated.

    validation: "none" (any bytes), "empty" (no body), "json" (well-formed JSON), "msgpack"
    (well-formed msgpack), or "json_schema" with `schema` a JSON Schema the JSON body must satisfy.
    """

    name: str
    validation: str = "none"
    schema: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Contract:
    """Which message types a dialog may carry, and which side may send each."""

    name: str
    messages: Mapping[str, str] = field(default_factory=dict)  # message type -> SIDES


PLACEMENTS = ("pool", "internal")


@dataclass(frozen=True)
class Activation:
    """How a queue starts its own readers (Service Broker's activation).

    handler: "module:function", or a module-level function (kept by its path). It is called as
    `handler(group, ctx)` for each received conversation group; what it does through `ctx`
    (send, end, begin, set_state) commits with the receive, and if it raises the group rolls back.
    placement: "pool" (reader actors, spread over the cluster) or "internal" (in the broker's
    process: no actor call per batch, for small fast handlers). A reader that finds nothing for
    `idle_timeout` seconds exits; a handler that runs past `lease` seconds loses its groups.
    """

    handler: str
    max_readers: int = 1
    idle_timeout: float = 5.0
    placement: str = "pool"
    enabled: bool = True
    max_groups: int = 8
    lease: float = 30.0
    options: Mapping[str, Any] | None = None  # JSON-able, given to the handler as `ctx.options`

    def __post_init__(self) -> None:
        if callable(self.handler):
            object.__setattr__(self, "handler", handler_path(self.handler))


@dataclass(frozen=True)
class Queue:
    """A durable queue. `poison_limit` rollbacks in a row disable it; with `retention` received
    messages are kept (marked received) until their conversation ends; with `activation` the
    broker starts readers for it."""

    name: str
    enabled: bool = True
    retention: bool = False
    poison_limit: int = 5
    activation: Activation | None = None


@dataclass(frozen=True)
class Service:
    """A named endpoint for dialogs: the queue its messages land in, and the contracts it accepts
    as a target (an initiator may use any contract)."""

    name: str
    queue: str
    contracts: tuple[str, ...] = ()


Definition = MessageType | Contract | Queue | Service | Credential
KINDS: dict[str, type] = {
    "message_type": MessageType,
    "contract": Contract,
    "queue": Queue,
    "service": Service,
    **credentials.KINDS,  # certificates, remote service bindings, grants (dialog security)
}
_KIND_OF = {cls: kind for kind, cls in KINDS.items()}
_TABLES = {kind: f"{kind}s" for kind in KINDS}  # the Catalog's attribute of each kind


def kind_of(defn: Definition) -> str:
    return _KIND_OF[type(defn)]


def to_record(defn: Definition) -> dict[str, Any]:
    """A JSON-ready dict of a definition (what the store keeps). A value of the wrong type is left
    as it is, for `Catalog.check_valid` to refuse with a clear message."""
    check_form(defn)
    rec = asdict(defn)
    if isinstance(defn, Contract):
        with contextlib.suppress(TypeError, ValueError):  # not pairs: check_valid says so
            rec["messages"] = dict(defn.messages)
    if isinstance(defn, Service) and isinstance(defn.contracts, (list, tuple, set, frozenset)):
        rec["contracts"] = list(defn.contracts)
    return rec


def from_record(kind: str, rec: Mapping[str, Any]) -> Definition:
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise InvalidDefinition(
            f"unknown definition kind {shown(kind)}; use one of {sorted(KINDS)}"
        )
    if not isinstance(rec, Mapping) or too_deep(rec, MAX_DEFINITION_DEPTH + 1):
        raise InvalidDefinition(
            f"a {kind} definition is a dict of its fields, nested at most "
            f"{MAX_DEFINITION_DEPTH} levels; got {shown(rec)}"
        )
    rec = dict(rec)
    if cls is Service and isinstance(rec.get("contracts"), list | tuple):
        rec["contracts"] = tuple(rec["contracts"])
    if cls is Certificate:  # as views show it (actors.model.credentials.shown_record)
        rec.pop("has_private_key", None)
    try:
        if cls is Queue and isinstance(rec.get("activation"), Mapping):
            rec["activation"] = Activation(**rec["activation"])
        return cls(**rec)
    except TypeError as exc:
        raise InvalidDefinition(f"bad {kind} definition {shown(rec)}: {exc}") from None


def check_form(defn: Definition) -> None:
    """What can be checked of a definition alone, cheaply, on either side of a call: its name,
    and that no field nests deeper than MAX_DEFINITION_DEPTH (which nothing needs, and which
    would make copying, storing or printing it recurse without bound)."""
    kind = kind_of(defn).replace("_", " ")
    check_name(kind, defn.name)
    for f in fields(defn):
        if too_deep(getattr(defn, f.name), MAX_DEFINITION_DEPTH):
            raise InvalidDefinition(
                f"{kind} {defn.name!r}: {f.name} nests lists/dicts more than "
                f"{MAX_DEFINITION_DEPTH} levels deep; flatten it"
            )


class Catalog:
    """The definitions one broker holds, with referential checks."""

    def __init__(self, code_modules: Sequence[str] = (), import_code: bool = True) -> None:
        """`code_modules`: where handlers may be, beside the package's own (actors.model.
        code_names); `import_code`: whether a check imports a handler to see it is there (not
        when a topology file is only read)."""
        self.code_modules, self.import_code = tuple(code_modules), import_code
        self.message_types: dict[str, MessageType] = {}
        self.contracts: dict[str, Contract] = {}
        self.queues: dict[str, Queue] = {}
        self.services: dict[str, Service] = {}
        self.certificates: dict[str, Certificate] = {}
        self.remote_service_bindings: dict[str, RemoteServiceBinding] = {}
        self.grants: dict[str, Grant] = {}
        self._validators: dict[str, BodyValidator] = {}
        self.generation = 0  # moved by every add and remove: what is derived keeps till then
        self.add(MessageType(DEFAULT))
        self.add(MessageType(ECHO))
        self.add(MessageType(REDIRECT, "json"))
        self.add(Contract(DEFAULT, {DEFAULT: "any"}))
        self.add(Contract(ECHO_CONTRACT, {ECHO: "any"}))

    BUILTIN = frozenset(
        {
            ("message_type", DEFAULT),
            ("message_type", ECHO),
            ("message_type", REDIRECT),
            ("contract", DEFAULT),
            ("contract", ECHO_CONTRACT),
        }
    )

    def _table(self, kind: str) -> dict[str, Any]:
        return getattr(self, _TABLES[kind])

    # --- checks: raise, change nothing -------------------------------------------------------

    def check_new(self, defn: Definition) -> None:
        kind = kind_of(defn)
        check_form(defn)  # before the lookup: a name may be unhashable
        if defn.name in self._table(kind):
            raise AlreadyExists(kind.replace("_", " "), defn.name)
        self.check_valid(defn)

    def check_valid(self, defn: Definition) -> None:
        """Raise if the definition is malformed or refers to what does not exist."""
        check_form(defn)
        if isinstance(defn, MessageType):
            if defn.name in SYSTEM_TYPES:
                raise InvalidDefinition(f"{defn.name!r} is a system message type name; rename it")
            if defn.validation not in VALIDATIONS:
                raise InvalidDefinition(
                    f"message type {defn.name!r}: validation {shown(defn.validation)} is not "
                    f"one of {', '.join(VALIDATIONS)}"
                )
            if (defn.validation == "json_schema") != (defn.schema is not None):
                raise InvalidDefinition(
                    f"message type {defn.name!r}: give a schema exactly when validation is "
                    "'json_schema'"
                )
            if defn.schema is not None and not isinstance(defn.schema, (Mapping, bool)):
                raise InvalidDefinition(
                    f"message type {defn.name!r}: a JSON schema is an object (dict), not "
                    f"{type(defn.schema).__name__}"
                )
            BodyValidator(defn)  # compiles (and so checks) the schema
        elif isinstance(defn, Contract):
            if not isinstance(defn.messages, Mapping) or not defn.messages:
                raise InvalidDefinition(
                    f"contract {defn.name!r} must map at least one message type to a side"
                )
            for mt, side in defn.messages.items():
                if not isinstance(mt, str) or not isinstance(side, str):
                    raise InvalidDefinition(
                        f"contract {defn.name!r} maps message type names to sides (strings), "
                        f"not {shown(mt)}: {shown(side)}"
                    )
                if mt in SYSTEM_TYPES:
                    raise InvalidDefinition(
                        f"contract {defn.name!r}: system message {mt!r} is always allowed; "
                        "leave it out"
                    )
                if mt not in self.message_types:
                    raise UnknownMessageType(mt, f"contract {defn.name!r} names it")
                if side not in SIDES:
                    raise InvalidDefinition(
                        f"contract {defn.name!r}: message type {mt!r} has side {shown(side)}; use "
                        "'initiator', 'target' or 'any'"
                    )
        elif isinstance(defn, Queue):
            limit = defn.poison_limit
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
                raise InvalidDefinition(
                    f"queue {defn.name!r}: poison_limit must be an int >= 0 (0 turns poison "
                    f"detection off), got {shown(defn.poison_limit)}"
                )
            for flag in ("enabled", "retention"):
                if not isinstance(getattr(defn, flag), bool):
                    raise InvalidDefinition(f"queue {defn.name!r}: {flag} must be True or False")
            if defn.activation is not None:
                check_activation(defn.name, defn.activation, self.code_modules, self.import_code)
        elif isinstance(defn, Service):
            if not isinstance(defn.queue, str):
                raise InvalidDefinition(
                    f"service {defn.name!r}: queue must be a queue's name, not {shown(defn.queue)}"
                )
            if defn.queue not in self.queues:
                raise UnknownQueue(defn.queue, f"service {defn.name!r} names it")
            if not isinstance(defn.contracts, (tuple, list)) or not all(
                isinstance(c, str) for c in defn.contracts
            ):
                raise InvalidDefinition(
                    f"service {defn.name!r}: contracts must be a list of contract names, not "
                    f"{shown(defn.contracts)}"
                )
            for c in defn.contracts:
                if c not in self.contracts:
                    raise UnknownContract(c, f"service {defn.name!r} names it")
        else:
            credentials.check_credential(defn, self)

    def check_alter(self, kind: str, name: str, changes: Mapping[str, Any]) -> Definition:
        """The altered definition, checked; raises if it may not be made."""
        old = self.get(kind, name)
        if (kind, name) in self.BUILTIN:
            raise InvalidDefinition(f"built-in {kind.replace('_', ' ')} {name!r} cannot change")
        if not isinstance(changes, Mapping) or too_deep(changes, MAX_DEFINITION_DEPTH + 1):
            raise InvalidDefinition(
                f"changes to {kind} {name!r} are field=value pairs, nested at most "
                f"{MAX_DEFINITION_DEPTH} levels; got {shown(changes)}"
            )
        if isinstance(changes.get("contracts"), str):
            raise InvalidDefinition(
                f"service {name!r}: contracts must be a list of names, not a string"
            )
        if "name" in changes:
            raise InvalidDefinition("a definition's name cannot change; drop it and create anew")
        try:
            new = replace(old, **dict(changes))
        except TypeError as exc:
            raise InvalidDefinition(f"cannot alter {kind} {name!r}: {exc}") from None
        if isinstance(new, Queue) and isinstance(changes.get("activation"), Mapping):
            # a dict changes some fields of the queue's activation, or defines a new one
            base = old.activation
            act = changes["activation"]
            try:
                new = replace(new, activation=replace(base, **act) if base else Activation(**act))
            except TypeError as exc:
                raise InvalidDefinition(
                    f"queue {name!r}: bad activation {shown(act)}: {exc}"
                ) from None
        if isinstance(new, Service) and isinstance(new.contracts, list):
            new = replace(new, contracts=tuple(new.contracts))
        if isinstance(new, Contract):
            raise InvalidDefinition(
                f"contracts cannot be altered (dialogs rely on them); create contract "
                f"{name!r} under a new name"
            )
        self.check_valid(new)
        return new

    def check_drop(self, kind: str, name: str) -> None:
        self.get(kind, name)
        if (kind, name) in self.BUILTIN:
            raise InvalidDefinition(f"built-in {kind.replace('_', ' ')} {name!r} cannot be dropped")
        users: Iterable[str] = ()
        if kind == "message_type":
            users = [c.name for c in self.contracts.values() if name in c.messages]
        elif kind == "contract":
            users = [s.name for s in self.services.values() if name in s.contracts]
        elif kind == "queue":
            users = [s.name for s in self.services.values() if s.queue == name]
        users = [*users, *credentials.credential_users(kind, name, self)]
        if users:
            raise InUse(
                f"{kind.replace('_', ' ')} {name!r} is used by {', '.join(sorted(users))}; "
                "drop or alter those first"
            )

    # --- changes: only after the checks passed -------------------------------------------------

    def add(self, defn: Definition) -> None:
        self._table(kind_of(defn))[defn.name] = defn
        self.generation += 1
        if isinstance(defn, MessageType):
            # checked strictly before (check_valid); a stored one is taken as it was accepted
            self._validators[defn.name] = BodyValidator(defn, strict=False)

    def remove(self, kind: str, name: str) -> None:
        del self._table(kind)[name]
        self.generation += 1
        if kind == "message_type":
            self._validators.pop(name, None)

    # --- lookups ---------------------------------------------------------------------------------

    _UNKNOWN = {
        "message_type": UnknownMessageType,
        "contract": UnknownContract,
        "queue": UnknownQueue,
        "service": UnknownService,
        "certificate": UnknownCertificate,
        "remote_service_binding": UnknownBinding,
        "grant": UnknownGrant,
    }

    def get(self, kind: str, name: str) -> Any:
        if not isinstance(kind, str) or kind not in KINDS:
            raise InvalidDefinition(
                f"unknown definition kind {shown(kind)}; use one of {sorted(KINDS)}"
            )
        check_name(kind.replace("_", " "), name)  # also keeps an unhashable name off the dict
        try:
            return self._table(kind)[name]
        except KeyError:
            raise self._UNKNOWN[kind](name) from None

    # A known name is found at once (every send and commit looks some up); `get` checks and
    # names what is wrong with any other.
    def service(self, name: str) -> Service:
        found = self.services.get(name) if type(name) is str else None
        return found if found is not None else self.get("service", name)

    def queue(self, name: str) -> Queue:
        found = self.queues.get(name) if type(name) is str else None
        return found if found is not None else self.get("queue", name)

    def contract(self, name: str) -> Contract:
        found = self.contracts.get(name) if type(name) is str else None
        return found if found is not None else self.get("contract", name)

    def validator(self, message_type: str) -> BodyValidator:
        if not isinstance(message_type, str):
            raise UnknownMessageType(shown(message_type), "a message type is named by a string")
        try:
            return self._validators[message_type]
        except KeyError:
            raise UnknownMessageType(message_type) from None

    def user_definitions(self) -> list[Definition]:
        """Everything but the built-ins, in an order that can be re-created."""
        out: list[Definition] = []
        for kind in KINDS:  # a kind names only kinds before it
            out += [d for n, d in self._table(kind).items() if (kind, n) not in self.BUILTIN]
        return out


def activation_code(act: Activation) -> list[Any]:
    """The "module:function" paths an activation names: its handler, and a router queue's
    classifier (in its options)."""
    named: list[Any] = [act.handler]
    if act.handler == ROUTER_HANDLER and isinstance(act.options, Mapping):
        named.append(act.options.get("classifier"))
    return named


def check_activation(
    queue: str, act: Any, code_modules: Sequence[str] = (), import_code: bool = True
) -> None:
    """An activation's fields, and the code it names (its handler, and a router queue's
    classifier in its options) in modules the broker allows, imported if `import_code`."""
    if not isinstance(act, Activation):
        raise InvalidDefinition(f"queue {queue!r}: activation must be an Activation, not {act!r}")
    for path in activation_code(act):
        if import_code:
            resolve_handler(path, code_modules)
        else:
            check_code_name(path, code_modules)
    for name, low in (("max_readers", 1), ("max_groups", 1)):
        value = getattr(act, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise InvalidDefinition(
                f"queue {queue!r}: activation {name} must be an int >= {low}, got {value!r}"
            )
    for name in ("idle_timeout", "lease"):
        value = getattr(act, name)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and value > 0):
            raise InvalidDefinition(
                f"queue {queue!r}: activation {name} must be > 0 seconds, got {value!r}"
            )
    if act.placement not in PLACEMENTS:
        raise InvalidDefinition(
            f"queue {queue!r}: activation placement {act.placement!r} is not "
            f"one of {', '.join(PLACEMENTS)}"
        )
    if not isinstance(act.enabled, bool):
        raise InvalidDefinition(f"queue {queue!r}: activation enabled must be True or False")
    if act.options is not None and not plain_json_object(act.options):
        raise InvalidDefinition(
            f"queue {queue!r}: activation options must be a JSON object, not {shown(act.options)}"
        )


def may_send(contract: Contract, message_type: str, is_initiator: bool) -> bool:
    """Whether one side of a dialog on `contract` may send `message_type` (system types always)."""
    if message_type in SYSTEM_TYPES:
        return True
    if message_type == REDIRECT:
        return not is_initiator
    side = contract.messages.get(message_type)
    if side is None:
        return False
    return side == "any" or (side == "initiator") == is_initiator
