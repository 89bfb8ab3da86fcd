"""The copies of Ray's Java native library that Spark sessions leave behind, removed.

Spark's driver JVM joins Ray as a Java driver (RayDP starts its master from there), and Ray's
Java runtime then copies its native library (`libcore_worker_library_java.so`, about 40 MB) into
a new directory `/tmp/ray/<the time in milliseconds>` and never removes it. Every `raybroker
demo`, `bench ingest` or test session left one more: 913 of them, 36 GB, on a machine that ran
this project's suite for a few days, until Ray warned that its object store could no longer
spill. `prune` removes those no process uses any more; `spark_bridge.session` calls it before a
session starts, so at most the copies of sessions still running, and the last one, remain.

A directory is removed only when all of these hold: its name is such a time, at least
`MIN_AGE_S` ago (a JVM copying into it now is left alone); it holds nothing but the library and
the lock file Ray copies it under; it belongs to this user; and no process of this machine maps
a file in it (read from `/proc/<pid>/maps`; elsewhere than Linux nothing is removed).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable

RAY_JAVA_DIR = "/tmp/ray"  # where Ray's Java driver copies it (a fixed path in Ray's code)
LIBRARY = "libcore_worker_library_java.so"
CONTENTS = frozenset({LIBRARY, "file_lock"})
MIN_AGE_S = 60.0


def removable(
    name: str, contents: Iterable[str], owner: int, mapped: bool, now_s: float, uid: int
) -> bool:
    """Whether the directory `name` under the root (holding `contents`, owned by `owner`, some
    file in it `mapped` by a live process) is a copy nobody uses: the rules above."""
    if not name.isdigit() or len(name) != 13:  # milliseconds since 1970: 13 digits until 2286
        return False
    age_s = now_s - int(name) / 1000
    return age_s >= MIN_AGE_S and set(contents) <= CONTENTS and owner == uid and not mapped


def mapped_dirs(root: str, proc: str = "/proc") -> set[str] | None:
    """The directories directly under `root` that hold a file some process maps, or None when
    that cannot be known here (no `/proc`)."""
    if not os.path.isdir(proc):
        return None
    prefix = root.rstrip("/") + "/"
    found: set[str] = set()
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(f"{proc}/{pid}/maps") as f:
                for line in f:
                    at = line.find(prefix)
                    if at >= 0:
                        found.add(line[at + len(prefix) :].split("/", 1)[0])
        except OSError:  # gone, or not ours to read: it cannot map a file of ours unseen
            continue
    return found


def prune(root: str = RAY_JAVA_DIR) -> list[str]:
    """Remove the copies under `root` that nobody uses (see above); the paths removed."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    mapped = mapped_dirs(root)
    if mapped is None:
        return []
    now, uid, removed = time.time(), os.getuid(), []
    for name in names:
        path = os.path.join(root, name)
        try:
            if os.path.islink(path) or not os.path.isdir(path):
                continue
            st = os.stat(path)
            if removable(name, os.listdir(path), st.st_uid, name in mapped, now, uid):
                shutil.rmtree(path)
                removed.append(path)
        except OSError:  # removed meanwhile, or not ours: left as it is
            continue
    return removed
