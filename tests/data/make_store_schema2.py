"""Writes store-schema2.sqlite and store-schema2.json: a broker's store as raybroker wrote it
before the transmission queue was kept in segments (schema 2, a transmission row per message;
release 4d8fb45), with messages waiting in that queue, and what its views showed, for
tests/unit/test_store_upgrade.py. Run from a checkout of that release:

    python tests/data/make_store_schema2.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from actors.calls.envelope import Begin, Send
from actors.core import BrokerCore, Limits
from actors.store.database import Store
from tests.fakes import FakeClock
from tests.unit.conftest import core_snapshot, define_core_catalog


def main(out: Path) -> None:
    path = out / "store-schema2.sqlite"
    path.unlink(missing_ok=True)
    store = Store(str(path))
    clock = FakeClock()
    core = BrokerCore(store, clock, Limits())
    define_core_catalog(core)
    # two dialogs to a service this broker does not have yet: their messages wait, in order,
    # written over three transactions of mixed types
    first, second = Begin("Init", "Later", "C"), Begin("Init", "Later", "C")
    core.apply([first, Send(first.handle, "Req", [b"a0", b"a1", b"a2"])])
    clock.advance(1.0)
    core.apply([second, Send(second.handle, "Req", [b"b0"]), Send(first.handle, "Json", [b"{}"])])
    clock.advance(1.0)
    core.apply([Send(second.handle, "Req", [b"b1", b"b2"]), Send(first.handle, "Req", [b"a4"])])
    views = core_snapshot(core)
    store.close()
    (out / "store-schema2.json").write_text(json.dumps(views, default=repr, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
