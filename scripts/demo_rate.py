"""The demo's pipeline at a fixed rate: the sales-by-region topology (six brokers, dialog and
transport security), a warm-up, then `LINES_PER_S` order lines a second from Spark through the
routers for `SECONDS`, every reply collected. Prints the brokers' CPU (from /proc, over the
middle half of the run) per order and per broker, and the order-to-reply latency. Run it alone
on the machine, from a clone whose install it uses:

    python scripts/demo_rate.py LINES_PER_S [SECONDS]

Unlike `raybroker demo`, whose steady rate follows its full-load phase, the rate is fixed, so
two builds can be compared at the same load (alternate their runs: CPU drifts from run to run).
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from importlib import resources

from actors import ensure_ray
from actors.tools import demo


def cpu_s(pid: str) -> float:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def brokers() -> dict[str, str]:
    """pid -> store file name of every process that has a broker's store open."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.endswith(".sqlite"):
                    found[pid] = os.path.basename(target).removesuffix(".sqlite")
                    break
        except OSError:
            continue
    return found


def main() -> None:
    from spark_bridge import AuditCursor, spark_session
    from spark_bridge.session import short_jobs_configs
    from topologies.deploy import deploy
    from topologies.loader import load

    rate = float(sys.argv[1])
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 25.0
    ensure_ray()
    topology = load(str(resources.files("topologies") / "sales_by_region.yaml"))
    with tempfile.TemporaryDirectory() as tmp:
        d = deploy(topology, tmp, progress=lambda s: None)
        try:
            with spark_session(configs=short_jobs_configs()) as spark:
                shop, routers = d.brokers["shop"], d.router_sets["sales-routers"]
                quiet = lambda s: None  # noqa: E731
                demo._phase(spark, shop, routers, 3000, first=demo.FIRST_USE, show=quiet)
                pids, marks = brokers(), []

                def sample() -> None:
                    for pause in (seconds / 4, seconds / 2):
                        time.sleep(pause)
                        marks.append(({p: cpu_s(p) for p in pids}, time.time()))

                sampler = threading.Thread(target=sample)
                sampler.start()
                orders = int(rate * seconds / demo.LINES)
                phase = demo._phase(spark, shop, routers, orders, 0, quiet, rows_per_s=rate)
                sampler.join()
                (a, ta), (b, tb) = marks
                cores = {pids[p]: (b[p] - a[p]) / (tb - ta) for p in pids}
                audit = AuditCursor([*d.brokers.values(), *routers.replicas.values()]).read(spark)
                p50, p99 = demo._latency(audit.df, phase.report.ingest_id)
        finally:
            d.stop(delete_stores=True)
    total = sum(cores.values())
    print(
        f"{rate:,.0f} lines/s asked, {phase.rows / phase.elapsed:,.0f} achieved: brokers "
        f"{total:.3f} cores, {total / (rate / demo.LINES) * 1e6:,.0f} us an order; "
        f"latency p50 {p50:,.0f} ms, p99 {p99:,.0f} ms"
    )
    print("  " + ", ".join(f"{name} {c:.3f}" for name, c in sorted(cores.items())))


if __name__ == "__main__":
    main()
