"""How raybroker's processes set Python's garbage collector.

Moving messages makes and drops thousands of small container objects a call (received groups,
their runs and messages, the operations of a send). At Python's default, a young pass per 700
net new objects, a process that holds Ray (hundreds of thousands of long-lived objects) is soon
due a full pass, and each full pass walks all of them: measured in a driver moving 200,000
messages through one handle (`scripts/handle_cost.py`), two full passes of ~100 ms each and
~300 young and middle ones, half the driver's CPU, and every pass a pause in its latency. With a
young pass per 10,000 net new objects, what a call makes is mostly gone again before a pass is
due: one young pass in the same run, and no full one.

A broker's process is raybroker's alone, so it also freezes what it holds once started (Ray, the
modules, the loaded store): out of every full pass. A process that only holds a handle is
someone else's (a driver script, a Spark worker, a reader running a user's handler): there the
young threshold is raised only if the process still has Python's default, and never when
`$RAYBROKER_KEEP_GC` is set; nothing is frozen. A higher threshold collects all the same garbage,
a little later.
"""

from __future__ import annotations

import gc
import os

BUSY_THRESHOLDS = (10_000, 10, 10)  # a young pass per 10,000 net new objects; older as Python's
PYTHON_DEFAULT = (700, 10, 10)  # gc.get_threshold() of a process nobody has tuned
KEEP_ENV = "RAYBROKER_KEEP_GC"  # set (to anything but "" or "0"): a handle leaves the GC alone


def own_process() -> None:
    """A process that is raybroker's alone (a broker actor), once started: what it holds now is
    frozen out of the collector's passes, and the young threshold raised."""
    gc.freeze()
    gc.set_threshold(*BUSY_THRESHOLDS)


def client_process() -> bool:
    """A process that holds a broker handle: the young threshold raised, if the process still has
    Python's default and `$RAYBROKER_KEEP_GC` does not ask to keep it. Whether it changed."""
    if os.environ.get(KEEP_ENV, "") not in ("", "0") or gc.get_threshold() != PYTHON_DEFAULT:
        return False
    gc.set_threshold(*BUSY_THRESHOLDS)
    return True
