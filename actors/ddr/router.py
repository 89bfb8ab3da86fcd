"""The routing service's handler (seed 000's `route_messages`), run as a queue's activation.

Forwarding mode, per conversation group (the inbound dialog and the outbound one the router
begins share one group, so one lock serializes both directions):
1. the first message of an inbound dialog is classified into a target service;
2. the router begins an outbound dialog to it in the same group,
3. records inbound <-> outbound in the group's state (committed with the receive),
4. and forwards the message; later messages go through without classifying, replies back
   (the outbound dialog `relays` the inbound one: while the group has nothing waiting, the
   broker sends them on at arrival, as this handler would, without the queue);
   a replica's broker does steps 1-4 itself for the first message of a new inbound dialog as
   it arrives, in the transaction that stores the arrival, when its group idles and the
   classifier answers (`routed_at_arrival`): no queue row and no reader turn for it either;
5. an EndDialog on either side ends the other and this one; an Error is wrapped (code and
   description kept) and passed on, and both dialogs end; the mapping then goes.
Redirect mode answers the initiator with a `Redirect` message naming the service, and ends.

A classifier that raises, returns no string, or names a service that is not one of the router
set's targets ends the inbound dialog with an Error naming the classifier and the value; other
dialogs are not affected. All of this is plain Python over `HandlerContext`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from actors.calls.envelope import Message, ReceivedGroup
from actors.errors import InvalidDefinition
from actors.model.catalog import DIALOG_TIMER, END_DIALOG, ERROR, REDIRECT, Service
from actors.model.code_names import import_code, resolve_handler
from actors.model.dialogs import MAX_ERROR_DESCRIPTION
from actors.model.names import check_name
from actors.runs import count

REDIRECT_TYPE = REDIRECT
ROUTER_QUEUE = "RouterQueue"  # the routing service's queue on every router replica
MODES = ("forward", "redirect")
ROUTING_FAILED = 50_001  # the classifier failed, or named no target of the router set
WRAPPED_BROKER_ERROR = 50_002  # a broker's own error (negative code) passed on by a router


@dataclass(frozen=True)
class RouterConfig:
    """What one router set does; carried to the handler as the router queue's activation
    `options`, so it is durable and can be changed at run time (readers restart with it)."""

    service: str  # the routing service, the same on every replica
    targets: tuple[str, ...]  # the services the classifier may name
    classifier: str  # "module:function"
    mode: str = "forward"
    classifier_options: Mapping[str, Any] = field(default_factory=dict)
    # the onward dialogs' ENCRYPTION (seed 003): a router set with dialog security turns it on,
    # so a dropped binding holds messages instead of sending them in the clear
    encryption: bool = False

    def __post_init__(self) -> None:
        check_name("router service", self.service)
        if isinstance(self.targets, str) or not self.targets:
            raise InvalidDefinition("a router set needs a non-empty list of target services")
        object.__setattr__(self, "targets", tuple(self.targets))
        for t in self.targets:
            check_name("target service", t)
        if self.mode not in MODES:
            raise InvalidDefinition(f"router mode {self.mode!r} is not one of {list(MODES)}")
        if not isinstance(self.classifier_options, Mapping):
            raise InvalidDefinition("classifier_options must be a dict")
        if not isinstance(self.encryption, bool):
            raise InvalidDefinition(f"encryption must be true or false, not {self.encryption!r}")

    def check_classifier(self, code_modules: Sequence[str] = ()) -> Any:
        """Import the classifier from a module the replicas allow (InvalidDefinition naming it
        if it is not allowed or does not import)."""
        try:
            return resolve_handler(self.classifier, code_modules)
        except InvalidDefinition as exc:
            raise InvalidDefinition(f"router classifier: {exc}") from None

    def options(self) -> dict[str, Any]:
        return {**asdict(self), "targets": list(self.targets)}

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> RouterConfig:
        return cls(**options)


def router_contracts(
    router_set: str, targets: Iterable[Service], given: Sequence[str] | None = None
) -> list[str]:
    """The contracts a routing service accepts: the union of its targets' (seed 000's first
    assumption), or `given`, which must cover that union (InvalidDefinition naming what lacks)."""
    needed = sorted({c for svc in targets for c in svc.contracts})
    if given is None:
        return needed
    uncovered = sorted(set(needed) - set(given))
    if uncovered:
        raise InvalidDefinition(
            f"router set {router_set!r}: the routing service must accept the union of its "
            f"targets' contracts; it lacks {uncovered}"
        )
    return list(given)


# Per routing service, in this process: dialogs routed, messages forwarded, errors. In memory
# (a replica's restart starts them again); the durable record is the mapping and the audit.
_stats: dict[str, Counter] = {}
_stats_lock = threading.Lock()


def tally(service: str, **n: int) -> None:
    """Add to a routing service's counts in this process (`stats`)."""
    with _stats_lock:
        _stats.setdefault(service, Counter()).update(n)


def stats(service: str) -> dict[str, int]:
    with _stats_lock:
        c = _stats.get(service, Counter())
        return {k: c[k] for k in ("routed", "forwarded", "errors")}


def route_messages(group: ReceivedGroup, ctx: Any) -> None:
    """The handler: `Activation("actors.ddr.router:route_messages", options=config.options())`."""
    cfg = RouterConfig.from_options(ctx.options)
    pairs: dict[str, dict[str, Any]] = json.loads(ctx.state) if ctx.state else {}
    out = _Forward(ctx)
    runs, i, index = group.runs, 0, 0
    while i < len(runs):
        # runs of one dialog's messages of one type: the first message is routed, the rest
        # follow it, their bodies as they came (no object per message)
        ep, mt = runs[i][1], runs[i][3]
        j = i + 1
        while j < len(runs) and runs[j][1] == ep and runs[j][3] == mt:
            j += 1
        n = count(runs[i:j])
        _route(cfg, pairs, group, out, group.message(index))
        if n > 1 and mt not in (DIALOG_TIMER, END_DIALOG, ERROR):
            target = _forward_to(pairs, group.endpoints[ep][0])
            if target is not None:
                out.send_many(target, mt, [b for r in runs[i:j] for b in r[4]][1:])
        elif n > 1:
            for k in range(index + 1, index + n):
                _route(cfg, pairs, group, out, group.message(k))
        index += n
        i = j
    out.flush()
    tally(cfg.service, forwarded=out.forwarded)
    live = {h: p for h, p in pairs.items() if not (p["in_ended"] and p["out_ended"])}
    ctx.set_state(json.dumps(live).encode() if live else None)


class _Forward:
    """The handler's context, with consecutive forwarded messages for one dialog and type sent
    as one SEND of many bodies (a 1,000-message batch stays one operation)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.run: tuple[str, str] | None = None
        self.bodies: list[bytes] = []
        self.forwarded = 0

    def send(self, handle: str, message_type: str, body: bytes) -> None:
        self.send_many(handle, message_type, [body])

    def send_many(self, handle: str, message_type: str, bodies: list[bytes]) -> None:
        self.forwarded += len(bodies)
        if self.run != (handle, message_type):
            self.flush()
            self.run = (handle, message_type)
        self.bodies += bodies

    def flush(self) -> None:
        if self.run is not None:
            self.ctx.send_many(*self.run, self.bodies)
            self.run, self.bodies = None, []

    def answer(self, handle: str, message_type: str, body: bytes) -> None:
        """The router's own message (not a forwarded one)."""
        self.flush()
        self.ctx.send(handle, message_type, body)

    def end(self, handle: str, **options: Any) -> None:
        self.flush()
        self.ctx.end(handle, **options)

    def begin(self, *args: Any, **options: Any) -> str:
        self.flush()
        return self.ctx.begin(*args, **options)


def _forward_to(pairs: dict, h: str) -> str | None:
    """Where a message of dialog `h` (not an end, an error or a timer) goes: the other dialog
    of its pair, or None (no pair, or this side was ended by the router: dropped). As `_route`
    does for such a message."""
    inbound = pairs.get(h)
    pair = inbound or next((p for p in pairs.values() if p["out"] == h), None)
    if pair is None:
        return None
    this, other = ("in", "out") if pair is inbound else ("out", "in")
    return None if pair[f"{this}_ended"] else pair[other]


def _route(cfg: RouterConfig, pairs: dict, group: ReceivedGroup, ctx: Any, m: Message) -> None:
    h, mt = m.conversation_handle, m.message_type
    inbound = pairs.get(h)
    outbound = None if inbound else next((p for p in pairs.values() if p["out"] == h), None)
    pair = inbound or outbound
    if mt == DIALOG_TIMER:
        return
    if pair is None:
        if mt not in (END_DIALOG, ERROR):  # the first message of a new inbound dialog
            _open(cfg, pairs, group, ctx, m)
        return  # an end of a dialog already let go: nothing left to do
    this, other = ("in", "out") if pair is inbound else ("out", "in")
    if pair[f"{this}_ended"]:
        return  # this side was ended by the router; what was still in flight is dropped
    if mt in (END_DIALOG, ERROR):
        if not pair[f"{other}_ended"] and pair[other] is not None:
            if mt == ERROR:
                code, text = _wrapped(cfg, m)
                ctx.end(pair[other], error=code, description=text)
                tally(cfg.service, errors=1)
            else:
                ctx.end(pair[other])
            pair[f"{other}_ended"] = True
        ctx.end(h)
        pair[f"{this}_ended"] = True
        return
    ctx.send(pair[other], mt, m.body)


def new_pair(inbound: str, outbound: str | None, target: str | None, since: float) -> dict:
    """A mapping as the group's state holds it (`json.dumps` of {inbound: pair})."""
    pair = {"in": inbound, "out": outbound, "target": target, "since": since}
    pair.update(in_ended=False, out_ended=outbound is None)  # no outbound yet: nothing to end
    return pair


def routed_at_arrival(
    options: Mapping[str, Any] | None, body: bytes, message_type: str
) -> tuple[RouterConfig, str] | None:
    """(config, target service) for the first message of a new inbound dialog, classified as
    it arrives at a replica's broker, which then begins the outbound dialog and forwards it in
    the transaction that stores the arrival, as `_open` would a turn later (no queue row, no
    reader turn). None: the handler decides (redirect mode; a classifier that fails, so its
    error path names why)."""
    cfg = _config(options or {})
    if cfg.mode != "forward":
        return None
    target, problem = classify(cfg, body, message_type)
    if problem is not None:
        return None
    return cfg, target  # type: ignore[return-value]


# the replicas' configurations as their brokers last read them: an arrival of a new dialog asks
# once per dialog, and the options change only by an ALTER (a new object)
_configs: dict[int, tuple[Mapping[str, Any], RouterConfig]] = {}


def _config(options: Mapping[str, Any]) -> RouterConfig:
    known = _configs.get(id(options))
    if known is not None and known[0] is options:
        return known[1]
    cfg = RouterConfig.from_options(options)
    if len(_configs) >= 64:
        _configs.clear()
    _configs[id(options)] = (options, cfg)
    return cfg


def _open(cfg: RouterConfig, pairs: dict, group: ReceivedGroup, ctx: Any, m: Message) -> None:
    h = m.conversation_handle
    pair = pairs[h] = new_pair(h, None, None, time.time())
    target, problem = classify(cfg, m.body, m.message_type)
    if problem is not None:
        ctx.end(h, error=ROUTING_FAILED, description=problem[:MAX_ERROR_DESCRIPTION])
        pair["in_ended"] = True
        tally(cfg.service, errors=1)
        return
    pair["target"] = target
    tally(cfg.service, routed=1)
    if cfg.mode == "redirect":
        ctx.answer(h, REDIRECT_TYPE, json.dumps({"service": target}).encode())
        ctx.end(h)
        pair["in_ended"] = True
        return
    out = ctx.begin(
        cfg.service,
        target,
        m.contract,
        related_group=group.group_id,
        encryption=cfg.encryption,
        relays=h,  # later messages of either dialog pass straight across while the group idles
    )
    pair.update(out=out, out_ended=False)
    ctx.send(out, m.message_type, m.body)


def classify(cfg: RouterConfig, body: bytes, message_type: str) -> tuple[str | None, str | None]:
    """(target, None), or (None, why not) in words an operator can act on."""
    who = f"router {cfg.service}: classifier {cfg.classifier}"
    try:
        fn = import_code(cfg.classifier)  # checked where it was defined and launched
        options = {"targets": list(cfg.targets), **cfg.classifier_options}
        value = fn(body, message_type, options)
    except Exception as exc:  # the classifier is user code: any failure ends only this dialog
        return None, f"{who} failed on a {message_type!r} message: {type(exc).__name__}: {exc}"
    if not isinstance(value, str):
        return None, f"{who} returned {value!r}, not a service name"
    if value not in cfg.targets:
        return None, (
            f"{who} returned {value!r}, which is not one of the router set's targets "
            f"{list(cfg.targets)}"
        )
    return value, None


def _wrapped(cfg: RouterConfig, m: Message) -> tuple[int, str]:
    """An arriving Error, to pass on: its code (a broker's own negative code becomes
    WRAPPED_BROKER_ERROR) and its description, with where it came from."""
    code, text = m.error or (WRAPPED_BROKER_ERROR, "")
    wrapped = f"via router {cfg.service}: [{code}] {text}"
    return (code if code > 0 else WRAPPED_BROKER_ERROR), wrapped[:MAX_ERROR_DESCRIPTION]
