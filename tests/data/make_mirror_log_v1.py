"""Writes mirror-log-v1.msgpack, mirror-log-v1-start.sqlite and mirror-log-v1-end.sqlite: a log
as a principal of release e4b58cb captured it (before the log stream; its ships went over Ray as
these entries), the blank mirror it was applied to, and the principal's store after it, for
tests/unit/test_mirror_stream.py. The log is `[[seq, at, [[many, sql, params], ...]], ...]`,
each entry's statements exactly as captured. Run from a checkout of that release:

    PYTHONPATH=. python tests/data/make_mirror_log_v1.py OUT_DIR
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import msgpack

from actors.core import BrokerCore, Limits
from actors.mirroring import replay
from actors.mirroring.capture import attach
from actors.store.database import Store
from tests.fakes import FakeClock
from tests.unit.test_mirror_log import workload


def main(out: Path) -> None:
    for name in ("principal.sqlite", "mirror-log-v1-start.sqlite", "mirror-log-v1-end.sqlite"):
        for suffix in ("", "-wal", "-shm"):
            (out / (name + suffix)).unlink(missing_ok=True)
    principal = Store(str(out / "principal.sqlite"))
    capture = attach(principal)
    replay.install(str(out / "mirror-log-v1-start.sqlite"), replay.snapshot(principal.db))
    clock = FakeClock()
    workload(BrokerCore(principal, clock, Limits()), clock)
    log = [[e.seq, e.at, [list(s) for s in e.statements]] for e in capture.take(1 << 20)]
    (out / "mirror-log-v1.msgpack").write_bytes(msgpack.packb(log, use_bin_type=True))
    (out / "mirror-log-v1-end.sqlite").write_bytes(replay.snapshot(principal.db))
    principal.close()
    for suffix in ("", "-wal", "-shm", ".lock"):
        (out / ("principal.sqlite" + suffix)).unlink(missing_ok=True)
    shutil.rmtree(out / "__pycache__", ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
