"""Many small clients as threads sharing one sync handle, on a broker actor of a local Ray:
`clients` sender threads, each sending `per_client` one-message transactions on a dialog of its
own, and as many reader threads receiving one group at a time and committing it in their next
call. Prints messages/s end to end (sent, received and committed).

    python scripts/threads_clients.py [clients] [per_client]     # defaults: 100 20
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time

from actors import Begin, Queue, Send, Service, start_broker
from actors.remote.runtime import ensure_ray

DEADLINE_S = 120.0


def main() -> None:
    clients = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    per_client = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    ensure_ray()
    broker = start_broker("threads-clients", os.path.join(tempfile.mkdtemp(), "b.sqlite"))
    try:
        for d in (Queue("I"), Service("Init", "I"), Queue("T"), Service("T", "T", ["DEFAULT"])):
            broker.create(d)
        handles = broker.apply([Begin("Init", "T") for _ in range(clients)])["handles"]
        committed = [0]
        counted = threading.Lock()
        stop = threading.Event()

        def sender(handle: str) -> None:
            for _ in range(per_client):
                broker.apply([Send(handle, "DEFAULT", bytes(100))])

        def reader() -> None:
            groups: list = []
            while not stop.is_set() or groups:
                wait = 0.0 if groups or stop.is_set() else 0.2
                done, groups = groups, broker.receive("T", wait=wait, commit=groups, top=1)
                with counted:
                    committed[0] += len(done)

        started = time.perf_counter()
        readers = [threading.Thread(target=reader) for _ in range(clients)]
        senders = [threading.Thread(target=sender, args=(h,)) for h in handles]
        for t in readers + senders:
            t.start()
        for t in senders:
            t.join()
        total = clients * per_client
        while committed[0] < total and time.perf_counter() - started < DEADLINE_S:
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
        stop.set()
        for t in readers:
            t.join()
        print(
            f"{clients} sender and {clients} reader threads: {committed[0]:,} of {total:,} "
            f"messages in {elapsed:.1f} s, {committed[0] / elapsed:,.0f} messages/s"
        )
    finally:
        broker.stop(delete_store=True)


if __name__ == "__main__":
    main()
