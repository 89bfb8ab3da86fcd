"""`raybroker console [TOPOLOGY.yaml]`: the operators' web page for every broker of a Ray
namespace (or of a topology file), on the cluster named by `--address` or $RAY_ADDRESS."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from actors.tools.console.server import Console, is_loopback


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("console", help="a web page of every broker: queues, dialogs, what waits")
    p.add_argument("topology", nargs="?", help="show this topology file's brokers only")
    p.add_argument("--namespace", default="raybroker", help="the brokers' Ray namespace")
    p.add_argument("--address", help="the Ray cluster (default: $RAY_ADDRESS)")
    p.add_argument("--host", default="127.0.0.1", help="the address to serve on (loopback)")
    p.add_argument("--port", type=int, default=8266, help="the port to serve on")
    p.add_argument("--token", help="the token actions need (default: a fresh one)")
    p.add_argument("--every", type=float, default=2.0, help="seconds between refreshes")
    p.set_defaults(fn=_console)


def names_of(topology: Any) -> set[str]:
    """The brokers a topology file deploys: its brokers and its router sets' replicas."""
    from topologies.spec import replica_names

    names = {spec.name for spec in topology.brokers}
    for rs in topology.router_sets:
        names.update(replica_names(rs.name, rs.replicas))
    return names


def sources(namespace: str, names: set[str] | None = None) -> Any:
    """What the console gathers from: the brokers running now, and the mirrored ones' roles."""
    from actors.remote.discovery import brokers_in, mirrors_of

    def now() -> tuple[Mapping[str, Any], Mapping[str, dict[str, Any]]]:
        brokers = brokers_in(namespace, names)
        return brokers, mirrors_of(brokers)

    return now


def _console(args: argparse.Namespace) -> int:
    from actors.errors import InvalidArgument
    from actors.remote.runtime import ensure_ray

    names = None
    if args.topology:
        from topologies.loader import load

        names = names_of(load(args.topology))
    if not is_loopback(args.host) and args.token is not None and len(args.token) < 16:
        raise InvalidArgument("a console bound beyond loopback needs a token of 16 characters")
    ensure_ray(args.address)
    console = Console(sources(args.namespace, names), host=args.host, port=args.port,
                      token=args.token, every_s=args.every)  # fmt: skip
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(console.serve(lambda s: print(s, flush=True)))
    return 0
