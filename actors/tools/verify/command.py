"""`raybroker verify`'s arguments (argparse only; nothing heavy loads until it runs)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from actors.errors import InvalidArgument
from actors.tools.verify.schedule import KINDS, parse_kinds


@dataclass
class Options:
    messages: int = 100_000
    seed: int | None = None
    faults: str | None = None  # comma-separated kinds; None: all
    json: str | None = None
    timeout: float = 600.0
    spark: bool = True
    dialogs: int = 8  # per path

    def check(self) -> Options:
        if not isinstance(self.messages, int) or self.messages < 100:
            raise InvalidArgument(f"--messages must be at least 100, not {self.messages!r}")
        if not self.timeout > 0:
            raise InvalidArgument(
                f"--timeout must be a positive number of seconds, not {self.timeout!r}"
            )
        if not isinstance(self.dialogs, int) or not 2 <= self.dialogs <= 64:
            raise InvalidArgument(f"--dialogs must be between 2 and 64, not {self.dialogs!r}")
        parse_kinds(self.faults)
        return self

    def argv(self) -> list[str]:
        """The same options as command-line arguments (to run them in a process of their own)."""
        out = ["--messages", str(self.messages), "--timeout", str(self.timeout)]
        out += ["--dialogs", str(self.dialogs)]
        if self.seed is not None:
            out += ["--seed", str(self.seed)]
        if self.faults is not None:
            out += ["--faults", self.faults]
        if self.json:
            out += ["--json", self.json]
        if not self.spark:
            out.append("--no-spark")
        return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--messages", type=int, default=100_000, help="messages to check (default 100,000)"
    )
    p.add_argument(
        "--seed", type=int, default=None, help="the fault schedule's seed (replays a run)"
    )
    p.add_argument(
        "--faults",
        default=None,
        metavar="K1,K2",
        help=f"fault kinds to inject (default: all): {', '.join(KINDS)}; none for no faults",
    )
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    p.add_argument("--no-spark", dest="spark", action="store_false", help="skip the Spark ingest")
    p.add_argument("--dialogs", type=int, default=8, help="dialogs per path (default 8)")


def options(args: Any) -> Options:
    return Options(
        messages=args.messages,
        seed=args.seed,
        faults=args.faults,
        json=args.json,
        timeout=args.timeout,
        spark=args.spark,
        dialogs=args.dialogs,
    ).check()
