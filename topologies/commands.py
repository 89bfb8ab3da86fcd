"""`raybroker deploy|status|teardown TOPOLOGY.yaml`: topologies from the command line, on the
Ray cluster named by `--address` or $RAY_ADDRESS (a local embedded Ray otherwise)."""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from typing import Any


def add_parsers(sub: Any) -> None:
    dep = sub.add_parser("deploy", help="start a topology, or apply a changed file's difference")
    _common(dep)
    dep.add_argument("--dry-run", action="store_true", help="print what would change, only")
    dep.set_defaults(fn=_deploy)
    st = sub.add_parser("status", help="brokers, queues, dialogs and router sets of a topology")
    _common(st)
    st.add_argument("--json", action="store_true", help="print JSON instead of tables")
    st.set_defaults(fn=_status)
    down = sub.add_parser("teardown", help="stop a topology's brokers and router replicas")
    _common(down)
    down.add_argument("--delete-stores", action="store_true", help="also remove their files")
    down.set_defaults(fn=_teardown)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", help="the topology file (YAML)")
    p.add_argument("--data-dir", default="raybroker-data", help="where the stores go")
    p.add_argument("--address", help="the Ray cluster (default: $RAY_ADDRESS)")


def _load(args: argparse.Namespace) -> Any:
    from actors.remote.runtime import ensure_ray

    from .loader import load

    topology = load(args.topology)  # checked before Ray starts
    ensure_ray(args.address)
    return topology


def _deploy(args: argparse.Namespace) -> int:
    from .deploy import deploy, plan

    topology = _load(args)
    data = os.path.abspath(args.data_dir)
    changes = plan(topology, data)
    print(f"{args.topology}: {len(changes)} change(s)" + (":" if changes else ""))
    for line in changes:
        print(f"  {line}")
    if args.dry_run or not changes:
        return 0
    # detached: the brokers outlive this command (teardown stops them)
    deploy(topology, data, progress=lambda s: print(f"  {s}"), detached=True)
    print("deployed")
    return 0


def status_of(topology: Any) -> dict[str, Any]:
    """What runs of a topology: per broker its process, queues, dialogs by state, transmission
    queue by reason and recent events; per router set its replicas and their mappings."""
    from actors.remote.client import connect
    from actors.remote.routers import ROUTER_QUEUE

    from .spec import replica_names

    out: dict[str, Any] = {"brokers": {}, "router_sets": {}}
    for spec in topology.brokers:
        try:
            b = connect(spec.name, retry_s=5.0)
            info = b.info()
        except Exception as exc:  # not running: say so rather than fail the whole status
            out["brokers"][spec.name] = {"running": False, "why": str(exc)}
            continue
        out["brokers"][spec.name] = {
            "running": True,
            "pid": info.get("pid"),
            "node": info.get("node"),
            "uptime_s": info.get("uptime_s"),
            "queues": b.queues(),
            "dialogs": b.dialogs()["by_state"],
            "transmission": dict(
                Counter(r.get("status", "?") for r in b.transmission_queue(limit=10_000))
            ),
            "events": b.events(limit=5, newest=True),
        }
    for rs in topology.router_sets:
        replicas = {}
        for name in replica_names(rs.name, rs.replicas):
            try:
                replicas[name] = connect(name, retry_s=5.0).router(ROUTER_QUEUE, rs.service)
            except Exception as exc:  # a replica not running, or not a router (yet)
                replicas[name] = {"running": False, "why": str(exc)}
        out["router_sets"][rs.name] = replicas
    return out


def _status(args: argparse.Namespace) -> int:
    topology = _load(args)
    view = status_of(topology)
    if args.json:
        print(json.dumps(view, indent=1, default=str))
        return 0
    print(f"{'broker':<20} {'pid':>8}  {'queue':<20} {'depth':>7} {'readers':>7} {'enabled':>7}")
    for name, b in view["brokers"].items():
        if not b["running"]:
            print(f"{name:<20} {'-':>8}  not running")
            continue
        for q, qv in b["queues"].items():
            print(
                f"{name:<20} {b['pid']:>8}  {q:<20} {qv.get('depth', 0):>7} "
                f"{qv.get('readers', 0):>7} {str(qv.get('enabled', '')):>7}"
            )
        dialogs = ", ".join(f"{s} {n}" for s, n in sorted(b["dialogs"].items())) or "none"
        waiting = ", ".join(f"{s} {n}" for s, n in sorted(b["transmission"].items())) or "empty"
        print(f"{'':<20} dialogs: {dialogs}; transmission queue: {waiting}")
        for e in b["events"]:
            print(f"{'':<20} event: {e.get('kind')} {e.get('subject')} {e.get('detail')}")
    for name, replicas in view["router_sets"].items():
        for r, rv in replicas.items():
            m = rv.get("mappings", "-")
            mappings = len(m) if isinstance(m, (list, dict)) else m
            print(f"router set {name}: {r}: mappings {mappings}")
    return 0


def _teardown(args: argparse.Namespace) -> int:
    from .deploy import teardown

    topology = _load(args)
    stopped = teardown(topology, os.path.abspath(args.data_dir), args.delete_stores)
    print(f"stopped {', '.join(stopped) or 'nothing (none was running)'}")
    return 0
