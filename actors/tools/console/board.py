"""What `raybroker console` shows, gathered from broker handles through their public views
(`Broker`, `MirroredBroker` or `LocalBroker`: the console has no broker code path of its own),
with a short history per queue for the charts, and the operator's actions. Plain Python, no Ray.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from actors.ddr.router import ROUTER_QUEUE
from actors.errors import BrokerError, InvalidArgument
from actors.model.catalog import Queue

CONSOLE_ERROR = 50_100  # the error code of a dialog an operator ended from the console
TRANSMISSION_ROWS = 200  # rows of each transmission queue shown (the oldest first)
EVENTS_KEPT = 50  # recent events kept per broker
ACTIONS = ("enable_queue", "end_dialog", "retry_transmission")


class Board:
    """The brokers' views, gathered every few seconds; `history` samples per queue to draw
    rates and depths over the last `keep` gatherings."""

    def __init__(self, keep: int = 150) -> None:
        self.keep = keep
        self.samples: dict[tuple[str, str], deque[tuple[float, int, int]]] = {}
        self.events: dict[str, deque[dict[str, Any]]] = {}
        self.last_event: dict[str, int] = {}

    def gather(
        self,
        brokers: Mapping[str, Any],
        now: float,
        mirrors: Mapping[str, dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Every broker's state now (a broker that cannot be asked says why, the others are
        shown all the same)."""
        out: dict[str, Any] = {}
        for name, b in sorted(brokers.items()):
            try:
                out[name] = self._one(name, b, now)
            except (BrokerError, TimeoutError, OSError) as exc:
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            if mirrors and name in mirrors:
                out[name]["mirror"] = _mirror_summary(mirrors[name])
        return {"at": now, "brokers": out}

    def _one(self, name: str, b: Any, now: float) -> dict[str, Any]:
        info = b.info()
        queues = b.queues()
        for q, row in queues.items():
            series = self.samples.setdefault((name, q), deque(maxlen=self.keep))
            series.append((now, row["depth"], row.get("removed", 0)))
            row["series"] = rates(series)
        dialogs = b.dialogs()
        waiting = b.transmission_queue(limit=TRANSMISSION_ROWS)
        for row in waiting:
            row["age_s"] = max(0.0, now - row["enqueued_at"]) if row.get("enqueued_at") else None
        routers = {}
        if ROUTER_QUEUE in queues:
            for kind, record in b.definitions():
                if kind == "service" and record.get("queue") == ROUTER_QUEUE:
                    view = b.router(ROUTER_QUEUE, record["name"], limit=1)
                    routers[record["name"]] = {**view, "mappings": view["mappings_total"]}
        return {
            "info": {k: info.get(k) for k in ("name", "broker_id", "pid", "uptime_s", "path")},
            "queues": queues,
            "dialogs": dialogs["by_state"],
            "secured_dialogs": dialogs["secured"],
            "transmission": waiting,
            "routes": b.routes(),
            "routers": routers,
            "events": self._events(name, b),
        }

    def _events(self, name: str, b: Any) -> list[dict[str, Any]]:
        """The broker's recent events, newest last: every page since the last gathering."""
        kept = self.events.setdefault(name, deque(maxlen=EVENTS_KEPT))
        while True:
            page = b.events(after_id=self.last_event.get(name, 0), limit=1000)
            kept.extend(page)
            if page:
                self.last_event[name] = page[-1]["id"]
            if len(page) < 1000:
                return list(kept)


def rates(series: deque[tuple[float, int, int]]) -> list[dict[str, float]]:
    """A queue's samples (time, depth, removed so far) as points to chart: its depth, and the
    messages per second that arrived and were removed since the sample before. A broker that
    restarted counts from 0 again: that interval shows no rate rather than a negative one."""
    points = []
    for (t0, d0, r0), (t1, d1, r1) in zip(series, list(series)[1:], strict=False):
        span = t1 - t0
        if span <= 0:
            continue
        out_rate = (r1 - r0) / span if r1 >= r0 else 0.0
        in_rate = max(0.0, ((d1 + r1) - (d0 + r0)) / span) if r1 >= r0 else 0.0
        points.append({"t": t1, "depth": d1, "in": in_rate, "out": out_rate})
    return points


def _mirror_summary(status: dict[str, Any]) -> dict[str, Any]:
    if "error" in status:
        return status
    principal = status.get("principal_state", {})
    return {
        "principal": status.get("principal"),
        "mirror": status.get("mirror"),
        "epoch": status.get("epoch"),
        "synchronized": status.get("synchronized"),
        "lag_transactions": principal.get("lag_transactions"),
        "lag_s": principal.get("lag_s"),
        "failovers": status.get("failovers"),
    }


def act(brokers: Mapping[str, Any], action: Mapping[str, Any], who: str) -> str:
    """Do one operator action on one broker and record it there as a ConsoleAction event
    naming `who`; what was done, in words. InvalidArgument for an action that is not one."""
    kind = action.get("action")
    name = action.get("broker")
    if kind not in ACTIONS:
        raise InvalidArgument(f"unknown action {kind!r}; the console does {list(ACTIONS)}")
    b = brokers.get(name) if isinstance(name, str) else None
    if b is None:
        raise InvalidArgument(f"no broker {name!r} on this console")
    if kind == "enable_queue":
        subject = _text(action, "queue")
        b.alter(Queue, subject, enabled=True)
        done = f"queue {subject!r} enabled"
    elif kind == "end_dialog":
        subject = _text(action, "handle")
        why = str(action.get("description") or "ended by an operator from raybroker console")
        b.end_conversation(subject, error=CONSOLE_ERROR, description=why[:1000])
        done = f"dialog {subject} ended with error {CONSOLE_ERROR}: {why[:1000]}"
    else:
        handle = action.get("handle") or None
        subject = handle or "every dialog"
        made_due = b.retry_transmission(handle)
        done = f"transmission retried now ({subject}): {made_due} message(s) made due"
    b.record_event("ConsoleAction", subject[:200], f"{done}, by {who}"[:2000])
    return done


def _text(action: Mapping[str, Any], key: str) -> str:
    value = action.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"action {action.get('action')!r} needs {key!r}")
    return value
