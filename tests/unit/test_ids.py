"""Fresh ids: UUID version 7 strings and request ids, ordered by time (actors.ids)."""

from __future__ import annotations

import os
import time
import uuid

from actors import Begin
from actors.ids import new_request_id, new_uuid


def test_new_uuid_is_a_version_7_uuid_string_with_the_time_in_milliseconds():
    before = time.time_ns() // 1_000_000
    u = new_uuid()
    after = time.time_ns() // 1_000_000
    parsed = uuid.UUID(u)
    assert str(parsed) == u
    assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    assert before <= parsed.int >> 80 <= after


def test_new_uuids_are_unique_and_later_ones_sort_after_earlier_ones():
    first = [new_uuid() for _ in range(1000)]
    ms = time.time_ns() // 1_000_000
    while time.time_ns() // 1_000_000 == ms:  # the next millisecond, whatever the clock's grain
        pass
    second = [new_uuid() for _ in range(1000)]
    assert len(set(first + second)) == 2000
    assert max(first) < min(second)


def test_a_forked_process_makes_ids_of_its_own():
    # the random bits come from `random`, which a child process reseeds after a fork: without
    # that, parent and child would make the same ids from the same state
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then out
        os.write(write, new_uuid().encode())
        os._exit(0)
    mine = new_uuid()
    os.waitpid(pid, 0)
    theirs = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert mine[14:] != theirs[14:]  # past the time: version, random bits


def test_request_ids_sort_by_time():
    a = new_request_id()
    t = time.time_ns()
    while time.time_ns() == t:
        pass
    assert new_request_id() > a


def test_a_begin_gets_a_time_ordered_handle():
    assert uuid.UUID(Begin("A", "B").handle).version == 7
