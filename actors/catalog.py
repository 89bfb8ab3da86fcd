"""Message types, contracts, queues and services: their definitions, their checks, and validation.

Plain Python, no Ray. `Catalog` is the registry one broker holds; every change goes through
`Catalog.check_*` first so that a refused definition leaves the registry as it was.
"""

from __future__ import annotations

import importlib
import json
import math
import re
import types
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import msgpack

from .errors import (
    AlreadyExists,
    InUse,
    InvalidDefinition,
    UnknownContract,
    UnknownMessageType,
    UnknownQueue,
    UnknownService,
    ValidationFailed,
)

VALIDATIONS = ("none", "empty", "json", "msgpack", "json_schema")
SIDES = ("initiator", "target", "any")

# System message types, as Service Broker has them. They are never validated, may be sent by
# either side whatever the contract, and user definitions may not take their names.
END_DIALOG = "EndDialog"
ERROR = "Error"
DIALOG_TIMER = "DialogTimer"
ECHO = "Echo"
SYSTEM_TYPES = frozenset({END_DIALOG, ERROR, DIALOG_TIMER})

# Built in, like SQL Server's DEFAULT message type and contract and its ServiceEcho contract.
DEFAULT = "DEFAULT"
ECHO_CONTRACT = "Echo"

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/\-]{0,127}$")


def check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidDefinition(
            f"{kind} name {name!r} is not valid: use 1-128 characters from letters, digits and "
            "_ . : / - (not starting with punctuation)"
        )
    return name


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

    def __post_init__(self) -> None:
        if callable(self.handler):
            object.__setattr__(self, "handler", handler_path(self.handler))


def handler_path(fn: Any) -> str:
    """The "module:function" path of a module-level function; refused for anything else."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    bound = getattr(fn, "__self__", None)
    if bound is not None and not isinstance(bound, type | types.ModuleType):
        raise InvalidDefinition(
            f"handler {fn!r} is a bound method; a handler is called without an instance, so "
            "pass a module-level function (or a staticmethod/classmethod)"
        )
    if not module or "<" in qualname or module == "__main__":
        raise InvalidDefinition(
            f"handler {fn!r} is not importable by name (a lambda, a nested function or one "
            "defined in __main__); define it at module level in an importable module"
        )
    return f"{module}:{qualname}"


def resolve_handler(path: str) -> Any:
    """Import a "module:function" handler; InvalidDefinition if it does not import."""
    if not isinstance(path, str) or path.count(":") != 1:
        raise InvalidDefinition(f"handler {path!r} must be 'module:function'")
    module_name, attr = path.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # any import-time failure is the definition's problem
        raise InvalidDefinition(
            f"handler {path!r} does not import ({type(exc).__name__}: {exc}); check the module "
            "is installed on every node and the function name is right"
        ) from None
    if not callable(obj):
        raise InvalidDefinition(f"handler {path!r} is not callable")
    return obj


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


Definition = MessageType | Contract | Queue | Service
KINDS: dict[str, type] = {
    "message_type": MessageType,
    "contract": Contract,
    "queue": Queue,
    "service": Service,
}
_KIND_OF = {cls: kind for kind, cls in KINDS.items()}


def kind_of(defn: Definition) -> str:
    return _KIND_OF[type(defn)]


def to_record(defn: Definition) -> dict[str, Any]:
    """A JSON-ready dict of a definition (what the store keeps)."""
    rec = asdict(defn)
    if isinstance(defn, Contract):
        rec["messages"] = dict(defn.messages)
    if isinstance(defn, Service):
        rec["contracts"] = list(defn.contracts)
    return rec


def from_record(kind: str, rec: Mapping[str, Any]) -> Definition:
    cls = KINDS.get(kind)
    if cls is None:
        raise InvalidDefinition(f"unknown definition kind {kind!r}; use one of {sorted(KINDS)}")
    rec = dict(rec)
    if cls is Service:
        rec["contracts"] = tuple(rec.get("contracts", ()))
    try:
        if cls is Queue and isinstance(rec.get("activation"), Mapping):
            rec["activation"] = Activation(**rec["activation"])
        return cls(**rec)
    except TypeError as exc:
        raise InvalidDefinition(f"bad {kind} definition {rec!r}: {exc}") from None


class BodyValidator:
    """Validates bodies for one message type; built once per type so schemas compile once."""

    def __init__(self, mt: MessageType) -> None:
        self.name = mt.name
        self.kind = mt.validation
        self._schema = None
        if mt.validation == "json_schema":
            import jsonschema  # imported lazily: only schema-validated types pay for it

            cls = jsonschema.validators.validator_for(mt.schema)
            try:
                cls.check_schema(mt.schema)
            except jsonschema.SchemaError as exc:
                raise InvalidDefinition(
                    f"message type {mt.name!r} has an invalid JSON schema: {exc.message}"
                ) from None
            self._schema = cls(mt.schema)

    def check(self, body: bytes) -> None:
        kind = self.kind
        if kind == "none":
            return
        if kind == "empty":
            if body:
                self._fail(f"must be empty, got {len(body)} bytes")
            return
        if kind == "msgpack":
            try:
                msgpack.unpackb(body, raw=False, strict_map_key=False)
            except Exception as exc:  # msgpack raises several unrelated types
                self._fail(f"is not well-formed msgpack ({exc})")
            return
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            self._fail(f"is not well-formed JSON ({exc})")
        if self._schema is not None:
            err = next(iter(self._schema.iter_errors(doc)), None)
            if err is not None:
                where = "/".join(str(p) for p in err.absolute_path) or "(root)"
                self._fail(f"does not match its JSON schema at {where}: {err.message}")

    def _fail(self, why: str) -> None:
        raise ValidationFailed(f"body of message type {self.name!r} {why}")


class Catalog:
    """The definitions one broker holds, with referential checks."""

    def __init__(self) -> None:
        self.message_types: dict[str, MessageType] = {}
        self.contracts: dict[str, Contract] = {}
        self.queues: dict[str, Queue] = {}
        self.services: dict[str, Service] = {}
        self._validators: dict[str, BodyValidator] = {}
        self.add(MessageType(DEFAULT))
        self.add(MessageType(ECHO))
        self.add(Contract(DEFAULT, {DEFAULT: "any"}))
        self.add(Contract(ECHO_CONTRACT, {ECHO: "any"}))

    BUILTIN = frozenset(
        {
            ("message_type", DEFAULT),
            ("message_type", ECHO),
            ("contract", DEFAULT),
            ("contract", ECHO_CONTRACT),
        }
    )

    def _table(self, kind: str) -> dict[str, Any]:
        return {
            "message_type": self.message_types,
            "contract": self.contracts,
            "queue": self.queues,
            "service": self.services,
        }[kind]

    # --- checks: raise, change nothing -------------------------------------------------------

    def check_new(self, defn: Definition) -> None:
        kind = kind_of(defn)
        if defn.name in self._table(kind):
            raise AlreadyExists(kind.replace("_", " "), defn.name)
        self.check_valid(defn)

    def check_valid(self, defn: Definition) -> None:
        """Raise if the definition is malformed or refers to what does not exist."""
        kind = kind_of(defn)
        check_name(kind.replace("_", " "), defn.name)
        if isinstance(defn, MessageType):
            if defn.name in SYSTEM_TYPES:
                raise InvalidDefinition(f"{defn.name!r} is a system message type name; rename it")
            if defn.validation not in VALIDATIONS:
                raise InvalidDefinition(
                    f"message type {defn.name!r}: validation {defn.validation!r} is not one of "
                    f"{', '.join(VALIDATIONS)}"
                )
            if (defn.validation == "json_schema") != (defn.schema is not None):
                raise InvalidDefinition(
                    f"message type {defn.name!r}: give a schema exactly when validation is "
                    "'json_schema'"
                )
            if defn.schema is not None and not isinstance(defn.schema, Mapping | bool):
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
                if mt in SYSTEM_TYPES:
                    raise InvalidDefinition(
                        f"contract {defn.name!r}: system message {mt!r} is always allowed; "
                        "leave it out"
                    )
                if mt not in self.message_types:
                    raise UnknownMessageType(mt, f"contract {defn.name!r} names it")
                if side not in SIDES:
                    raise InvalidDefinition(
                        f"contract {defn.name!r}: message type {mt!r} has side {side!r}; use "
                        "'initiator', 'target' or 'any'"
                    )
        elif isinstance(defn, Queue):
            limit = defn.poison_limit
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
                raise InvalidDefinition(
                    f"queue {defn.name!r}: poison_limit must be an int >= 0 (0 turns poison "
                    f"detection off), got {defn.poison_limit!r}"
                )
            for flag in ("enabled", "retention"):
                if not isinstance(getattr(defn, flag), bool):
                    raise InvalidDefinition(f"queue {defn.name!r}: {flag} must be True or False")
            if defn.activation is not None:
                check_activation(defn.name, defn.activation)
        elif isinstance(defn, Service):
            if defn.queue not in self.queues:
                raise UnknownQueue(defn.queue, f"service {defn.name!r} names it")
            if isinstance(defn.contracts, str):
                raise InvalidDefinition(
                    f"service {defn.name!r}: contracts must be a list of names, not a string"
                )
            for c in defn.contracts:
                if c not in self.contracts:
                    raise UnknownContract(c, f"service {defn.name!r} names it")

    def check_alter(self, kind: str, name: str, changes: Mapping[str, Any]) -> Definition:
        """The altered definition, checked; raises if it may not be made."""
        old = self.get(kind, name)
        if (kind, name) in self.BUILTIN:
            raise InvalidDefinition(f"built-in {kind.replace('_', ' ')} {name!r} cannot change")
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
                raise InvalidDefinition(f"queue {name!r}: bad activation {act!r}: {exc}") from None
        if isinstance(new, Service) and not isinstance(new.contracts, tuple):
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
        users = list(users)
        if users:
            raise InUse(
                f"{kind.replace('_', ' ')} {name!r} is used by {', '.join(sorted(users))}; "
                "drop or alter those first"
            )

    # --- changes: only after the checks passed -------------------------------------------------

    def add(self, defn: Definition) -> None:
        self._table(kind_of(defn))[defn.name] = defn
        if isinstance(defn, MessageType):
            self._validators[defn.name] = BodyValidator(defn)

    def remove(self, kind: str, name: str) -> None:
        del self._table(kind)[name]
        if kind == "message_type":
            self._validators.pop(name, None)

    # --- lookups ---------------------------------------------------------------------------------

    _UNKNOWN = {
        "message_type": UnknownMessageType,
        "contract": UnknownContract,
        "queue": UnknownQueue,
        "service": UnknownService,
    }

    def get(self, kind: str, name: str) -> Any:
        if kind not in KINDS:
            raise InvalidDefinition(f"unknown definition kind {kind!r}; use one of {sorted(KINDS)}")
        try:
            return self._table(kind)[name]
        except KeyError:
            raise self._UNKNOWN[kind](name) from None

    def service(self, name: str) -> Service:
        return self.get("service", name)

    def queue(self, name: str) -> Queue:
        return self.get("queue", name)

    def contract(self, name: str) -> Contract:
        return self.get("contract", name)

    def validator(self, message_type: str) -> BodyValidator:
        try:
            return self._validators[message_type]
        except KeyError:
            raise UnknownMessageType(message_type) from None

    def user_definitions(self) -> list[Definition]:
        """Everything but the built-ins, in an order that can be re-created."""
        out: list[Definition] = []
        for kind in ("message_type", "contract", "queue", "service"):
            out += [d for n, d in self._table(kind).items() if (kind, n) not in self.BUILTIN]
        return out


def check_activation(queue: str, act: Any) -> None:
    if not isinstance(act, Activation):
        raise InvalidDefinition(f"queue {queue!r}: activation must be an Activation, not {act!r}")
    resolve_handler(act.handler)
    for name, low in (("max_readers", 1), ("max_groups", 1)):
        value = getattr(act, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise InvalidDefinition(
                f"queue {queue!r}: activation {name} must be an int >= {low}, got {value!r}"
            )
    for name in ("idle_timeout", "lease"):
        value = getattr(act, name)
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
            or value <= 0
        ):
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


def may_send(contract: Contract, message_type: str, is_initiator: bool) -> bool:
    """Whether one side of a dialog on `contract` may send `message_type` (system types always)."""
    if message_type in SYSTEM_TYPES:
        return True
    side = contract.messages.get(message_type)
    if side is None:
        return False
    return side == "any" or (side == "initiator") == is_initiator
