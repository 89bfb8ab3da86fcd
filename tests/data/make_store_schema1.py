"""Writes store-schema1.sqlite and store-schema1.json: a broker's store as raybroker wrote it
before segments (schema 1, a message a row; release d71e42b), and what its views showed, for
tests/unit/test_store_upgrade.py. Run from a checkout of that release:

    python tests/data/make_store_schema1.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from actors.calls.envelope import Send
from actors.core import BrokerCore, Limits
from actors.store.database import Store
from tests.fakes import FakeClock
from tests.unit.conftest import core_snapshot, define_core_catalog, open_core_dialog


def main(out: Path) -> None:
    path = out / "store-schema1.sqlite"
    path.unlink(missing_ok=True)
    store = Store(str(path))
    core = BrokerCore(store, FakeClock(), Limits())
    define_core_catalog(core)
    # TargetQ: one dialog with five waiting, one whose first two of four were received
    a = open_core_dialog(core, bodies=[f"a{i}".encode() for i in range(5)])
    b = open_core_dialog(core, bodies=[f"b{i}".encode() for i in range(4)])
    [g] = core.receive("TargetQ", handle=b.target, top=2)
    core.settle([g.lock_id])
    # RetainQ: three received and kept, then one more waiting
    c = open_core_dialog(core, to="Retain", bodies=[b"c0", b"c1", b"c2"])
    [g] = core.receive("RetainQ")
    core.settle([g.lock_id])
    core.apply([Send(c.init, "Req", [b"c3"])])
    # the initiator's queue gets a reply on dialog a
    core.apply([Send(a.target, "Reply", [b"r0"])])
    views = core_snapshot(core)
    store.close()
    (out / "store-schema1.json").write_text(json.dumps(views, default=repr, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
