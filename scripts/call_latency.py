"""One caller's round trips to a broker, one call after another (p50 of each): a sync send of one
message, a receive and commit of one, and a 1 MB send. Run it twice to compare the direct
channel with Ray's actor calls:

    python scripts/call_latency.py                      # over the direct channel
    RAYBROKER_DIRECT=0 python scripts/call_latency.py   # through Ray only
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable

from actors import Begin, Queue, Send, Service, ensure_ray, start_broker


def p50_ms(call: Callable[[], object], times: int) -> float:
    took = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


def main() -> None:
    ensure_ray()
    b = start_broker("call-latency", os.path.join(tempfile.mkdtemp(), "latency.sqlite"))
    try:
        for d in (Queue("I"), Service("Init", "I", []), Queue("T"), Service("T", "T", ["DEFAULT"])):
            b.create(d)
        [h] = b.apply([Begin("Init", "T")])["handles"]
        for _ in range(50):  # warm up (and let the channel open)
            b.apply([Send(h, "DEFAULT", b"x")])
        send = p50_ms(lambda: b.apply([Send(h, "DEFAULT", b"x" * 100)]), 400)
        take = p50_ms(lambda: b.commit(b.receive("T", max_groups=1, top=1)), 200)
        big = [b"y" * 1000] * 1000
        send_1mb = p50_ms(lambda: b.apply([Send(h, "DEFAULT", big)]), 30)
        print(f"channels {b.info()['channels']}")
        print(f"send of one p50 {send:.2f} ms, receive+commit of one p50 {take:.2f} ms, ", end="")
        print(f"1 MB send p50 {send_1mb:.1f} ms")
    finally:
        b.stop(delete_store=True)


if __name__ == "__main__":
    main()
