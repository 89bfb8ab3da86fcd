"""Fresh ids: UUID version 7 strings and request ids, ordered by time (actors.ids)."""

from __future__ import annotations

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


def test_request_ids_sort_by_time():
    a = new_request_id()
    t = time.time_ns()
    while time.time_ns() == t:
        pass
    assert new_request_id() > a


def test_a_begin_gets_a_time_ordered_handle():
    assert uuid.UUID(Begin("A", "B").handle).version == 7
