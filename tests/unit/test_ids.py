"""Fresh ids: UUID version 7 strings and request ids, ordered by time, and the random bytes
behind keys and tokens (actors.ids)."""

from __future__ import annotations

import os
import threading
import time
import uuid

from actors import Begin, ids
from actors.ids import RandomBytes, new_request_id, new_uuid, random_bytes


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


def test_random_bytes_are_handed_out_once_across_reads_of_the_os():
    source = RandomBytes()
    drawn = [source.take(12) for _ in range(3 * RandomBytes.CHUNK // 12 + 5)]  # several reads
    assert all(len(b) == 12 for b in drawn)
    assert len(set(drawn)) == len(drawn)
    assert len(source.take(RandomBytes.CHUNK + 1)) == RandomBytes.CHUNK + 1  # past a read: whole


def test_a_forked_child_draws_random_bytes_of_its_own_not_its_parents_next_ones():
    random_bytes(8)  # the process's buffer now holds its next bytes
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next bytes, to the parent
        os.write(write, random_bytes(16))
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64)
    os.close(read)
    assert len(child) == 16 and child != random_bytes(16)


def test_each_thread_draws_random_bytes_from_a_source_of_its_own():
    seen: dict[str, object] = {}

    def draw(name: str) -> None:
        random_bytes(1)
        seen[name] = ids._local.source

    threads = [threading.Thread(target=draw, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    random_bytes(1)
    assert seen["a"] is not seen["b"] and ids._local.source not in seen.values()
