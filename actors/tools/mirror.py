"""`raybroker mirror status|failover NAME`: a mirrored broker's partners from the command line
(on the cluster of $RAY_ADDRESS)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def add_parsers(sub: Any) -> None:
    mirror = sub.add_parser("mirror", help="a mirrored broker: its partners' state, failover")
    verbs = mirror.add_subparsers(dest="verb", required=True)
    st = verbs.add_parser("status", help="roles, epoch, the mirror's lag, failovers")
    fo = verbs.add_parser("failover", help="make the mirror principal (it must be synchronized)")
    for p in (st, fo):
        p.add_argument("name", help="the mirrored broker's name")
        p.add_argument("--namespace", default="raybroker")
    st.set_defaults(fn=_status)
    fo.set_defaults(fn=_failover)


def summary(status: dict[str, Any]) -> list[str]:
    """A mirrored broker's status as lines for people."""
    lines = [
        f"mirrored broker {status['broker']}: epoch {status['epoch']}, "
        f"{'synchronized' if status['synchronized'] else 'NOT synchronized'}, "
        f"{status['failovers']} failover(s)"
    ]
    for name, p in status["partners"].items():
        lag = ""
        if p.get("lag_transactions") is not None:
            lag = f", mirror lag {p['lag_transactions']} transactions / {p['lag_s']:.2f} s"
        if p.get("ships_travel"):
            lag += f"; ships: {p['ships_travel']}"
        if p.get("applied") is not None:  # a mirror: what it holds, and what of it is applied
            lag += f", holds through {p['seq']}, applied through {p['applied']}"
        if p.get("backlog_failed"):
            lag += f"; its backlog could not be applied: {p['backlog_failed']}"
        lines.append(f"  {name}: {p.get('role')} ({p.get('state', '-')}{lag})")
    last = status.get("last_failover")
    if last:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last["at"]))
        how = "manual" if last["manual"] else "automatic"
        lines.append(f"  last failover {at}: {last['from']} -> {last['to']} ({how}, "
                     f"{last['reason']})")  # fmt: skip
    return lines


def _status(args: argparse.Namespace) -> int:
    from actors.remote.mirrored import mirror_status
    from actors.remote.runtime import ensure_ray

    ensure_ray()
    status = mirror_status(args.name, args.namespace)
    print("\n".join(summary(status)))
    print(json.dumps(status, indent=2, default=str))
    return 0


def _failover(args: argparse.Namespace) -> int:
    from actors.remote.mirrored import failover
    from actors.remote.runtime import ensure_ray

    ensure_ray()
    record = failover(args.name, args.namespace)
    print(f"{record['principal']} is now principal of {args.name} (epoch {record['epoch']})")
    return 0
