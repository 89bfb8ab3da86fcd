"""The copies of Ray's Java native library that Spark sessions leave in /tmp/ray are removed once
no process uses them, and nothing else is (spark_bridge/native_libs.py). Real directories and a
real process that maps a file, in a temporary root; no Spark, no Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_bridge import native_libs
from spark_bridge.native_libs import CONTENTS, LIBRARY, MIN_AGE_S, mapped_dirs, prune, removable

NOW = 1_800_000_000.0


def _name(age_s: float, now: float = NOW) -> str:
    return str(int((now - age_s) * 1000))


@pytest.mark.parametrize(
    ("name", "contents", "owner", "mapped", "expected"),
    [
        (_name(3600), CONTENTS, 0, False, True),  # an old copy nobody maps: removed
        (_name(MIN_AGE_S), [LIBRARY], 0, False, True),  # old enough, its lock file gone
        (_name(3600), CONTENTS, 0, True, False),  # a live JVM maps it
        (_name(MIN_AGE_S - 1), CONTENTS, 0, False, False),  # being copied now, perhaps
        (_name(3600), [*CONTENTS, "notes.txt"], 0, False, False),  # holds something else
        (_name(3600), CONTENTS, 1000, False, False),  # another user's
        ("session_2026-12-01_05-33-54_162408_31410", CONTENTS, 0, False, False),  # Ray's
        ("12345", CONTENTS, 0, False, False),  # digits, but no time in milliseconds
    ],
    ids=[
        "stale",
        "stale-no-lock",
        "mapped",
        "young",
        "other-files",
        "other-user",
        "ray-session",
        "short-number",
    ],
)
def test_only_old_copies_of_the_library_that_nobody_maps_are_removable(
    name, contents, owner, mapped, expected
):
    assert removable(name, contents, owner, mapped, NOW, uid=0) is expected


def _copy(root: Path, age_s: float, *extra: str) -> Path:
    d = root / _name(age_s, time.time())
    d.mkdir()
    for f in (LIBRARY, "file_lock", *extra):
        (d / f).write_bytes(b"\x7fELF" + bytes(4096))
    return d


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="maps are read from /proc (Linux)")
def test_prune_keeps_what_a_live_process_maps_and_removes_the_stale(tmp_path):
    root = tmp_path / "ray"
    root.mkdir()
    stale, in_use, young = _copy(root, 3600), _copy(root, 7200), _copy(root, 1)
    other = _copy(root, 5400, "notes.txt")
    session = root / "session_latest"
    session.mkdir()
    # a process maps the library of one copy, as a running Spark driver's JVM does
    holder = subprocess.Popen(
        [sys.executable, "-c", "import mmap, sys; f = open(sys.argv[1], 'rb'); "
         "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); print('mapped', flush=True); "
         "sys.stdin.read()", str(in_use / LIBRARY)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "mapped"
        assert in_use.name in mapped_dirs(str(root))
        assert prune(str(root)) == [str(stale)]
        assert sorted(p.name for p in root.iterdir()) == sorted(
            [in_use.name, young.name, other.name, session.name]
        )
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert prune(str(root)) == [str(in_use)]  # its process has gone


def test_no_proc_means_nothing_is_known_mapped_and_nothing_removed(tmp_path, monkeypatch):
    root = tmp_path / "ray"
    root.mkdir()
    stale = _copy(root, 3600)
    assert mapped_dirs(str(root), proc=str(tmp_path / "no-proc")) is None
    monkeypatch.setattr(native_libs, "mapped_dirs", lambda root: None)
    assert prune(str(root)) == [] and stale.exists()
    assert prune(str(tmp_path / "missing")) == []
