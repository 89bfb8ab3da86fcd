"""`python -m actors.tools.verify [options]`: the same as `raybroker verify` (run in a process of
its own when the caller already has a Ray)."""

from __future__ import annotations

import argparse
import sys

from actors.errors import BrokerError
from actors.tools.verify.command import add_arguments, options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raybroker verify", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        opts = options(args)
    except BrokerError as exc:
        print(f"raybroker verify: {exc}", file=sys.stderr)
        return 2
    from actors.tools.verify.run import run

    return run(opts, progress=lambda s: print(s, flush=True))


if __name__ == "__main__":
    sys.exit(main())
