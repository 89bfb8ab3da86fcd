"""The `raybroker` command line."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

from actors.errors import BrokerError

# messages (dialogs: open dialogs) per scenario when neither --messages nor --quick
FULL_SIZE = {"ingest": 1_000_000, "dialogs": 1_000_000}


def _bench_scenarios() -> dict[str, Callable[..., Any]]:
    from actors.tools.bench import activation, ddr, dialogs, local, mirror, remote
    from actors.tools.bench.peers import run as peers

    scenarios = {"local": local.run, "activation": activation.run, "remote": remote.run}
    return scenarios | {"ddr": ddr.run, "ingest": _ingest_bench, "peers": peers.run,
                        "mirror": mirror.run, "dialogs": dialogs.run}  # fmt: skip


def _ingest_bench(*args: Any, **kwargs: Any) -> Any:
    from spark_bridge.bench import run  # Spark and RayDP load only for this scenario

    return run(*args, **kwargs)


def _bench(args: argparse.Namespace) -> int:
    scenarios = _bench_scenarios()
    if args.scenario not in scenarios:
        print(
            f"raybroker bench: unknown scenario {args.scenario!r}; available: "
            f"{', '.join(sorted(scenarios))}",
            file=sys.stderr,
        )
        return 2
    if args.secure:
        if args.scenario != "remote":
            print("raybroker bench: --secure is for the remote scenario", file=sys.stderr)
            return 2
        scenarios["remote"] = functools.partial(scenarios["remote"], secure=True)
    from actors.errors import InvalidArgument
    from actors.tools.bench.report import Load

    try:
        full = FULL_SIZE.get(args.scenario, Load.messages)
        load = Load(messages=args.messages or (10_000 if args.quick else full))
    except InvalidArgument as exc:
        print(f"raybroker bench: {exc}", file=sys.stderr)
        return 2
    from actors.tools.bench.repeat import repeated

    progress = lambda s: print(f"... {s}", flush=True)  # noqa: E731
    try:
        warm_up = not args.quick  # a smoke test's figures are not compared
        if args.scenario in ("peers", "mirror", "dialogs"):  # each repeats inside what it starts
            report = scenarios[args.scenario](
                load, progress=progress, repeats=args.repeats, warm_up=warm_up
            )
        else:
            report = repeated(
                scenarios[args.scenario], load, args.repeats, progress, warm_up=warm_up
            )
    except InvalidArgument as exc:
        print(f"raybroker bench: {exc}", file=sys.stderr)
        return 2
    print(report.table())
    if args.json:
        report.write_json(args.json)
        print(f"wrote {args.json}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from actors.tools.demo import run

    return run(orders=args.orders, path=args.path, steady_s=args.steady_s)


def _verify(args: argparse.Namespace) -> int:
    from actors.tools.verify.command import options
    from actors.tools.verify.run import run

    return run(options(args), progress=lambda s: print(s, flush=True))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raybroker", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="sales by region: Spark orders through replicated routers, reconciled"
    )
    demo.add_argument(
        "--orders", type=int, default=10_000, help="orders at full load (3 lines each)"
    )
    demo.add_argument(
        "--steady-s", type=float, default=30.0, help="seconds of orders at a steady rate"
    )
    demo.add_argument("--path", default=None, help="a directory for the stores (kept)")
    demo.set_defaults(fn=_demo)
    bench = sub.add_parser("bench", help="measure a scenario beside its baselines")
    bench.add_argument("scenario", help="local, remote, activation, ddr, ingest, peers or mirror")
    bench.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    bench.add_argument(
        "--messages", type=int, help="how many messages (dialogs: how many open dialogs)"
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="a small run for smoke tests: 10,000 messages, no warm-up run",
    )
    bench.add_argument(
        "--repeats", type=int, default=3, help="measured runs after a warm-up (default 3)"
    )
    bench.add_argument(
        "--secure",
        action="store_true",
        help="remote: also measure secured dialogs (dialog security) beside unsecured ones",
    )
    bench.set_defaults(fn=_bench)
    from actors.tools.verify.command import add_arguments as verify_arguments  # argparse only

    verify = sub.add_parser(
        "verify", help="the whole system under a fault schedule: every message checked"
    )
    verify_arguments(verify)
    verify.set_defaults(fn=_verify)
    from actors.tools import certs as cert_commands
    from actors.tools import mirror as mirror_commands
    from actors.tools.console import command as console_commands
    from spark_bridge import commands as spark_commands  # argparse only: Spark loads when used
    from topologies import commands as topology_commands

    spark_commands.add_parsers(sub)
    topology_commands.add_parsers(sub)
    mirror_commands.add_parsers(sub)
    cert_commands.add_parsers(sub)
    console_commands.add_parsers(sub)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except BrokerError as exc:
        print(f"raybroker: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
