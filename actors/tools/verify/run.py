"""`raybroker verify`: the whole system under a fault schedule, every message checked.

It starts a multi-node Ray cluster of its own on this machine, deploys the verify topology, runs
the workload (every path, malformed sends riding along, a Spark ingest), injects the schedule's
faults one after another, measures how long each took to recover, waits for everything to
settle, checks every message, prints a summary (and writes `--json`), and always cleans up.
Exit status 0 only when nothing was lost, doubled or out of order and everything was sent.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actors.tools.verify.checker import check, self_test
from actors.tools.verify.command import Options
from actors.tools.verify.history import History
from actors.tools.verify.malformed import Malformed
from actors.tools.verify.report import build, handlers_seen, show
from actors.tools.verify.schedule import Fault, parse_kinds, plan
from actors.tools.verify.spark import SparkIngest, spark_rows
from actors.tools.verify.topology import (
    AFFECTS,
    HEAD_RESOURCE,
    MAX_BODY,
    PATHS,
    RECEIVERS,
    SHOP,
    SHOP_QUEUE,
    SHOP_SERVICE,
    TARGETS,
    document,
)
from actors.tools.verify.workload import Collector, Gates, Sender, begin_streams

if TYPE_CHECKING:  # the Ray side loads only when a run starts
    from actors.tools.verify.faults import Injector

Progress = Callable[[str], None]
RECOVERY_S = 180.0  # the longest a fault may take to recover before it is reported as not
SETTLE_S = 60.0  # the longest to wait for the queues to empty once everything is confirmed
WINDOW = 4000  # workload messages awaiting their reply at most
STORE_NODES = 2  # nodes offering vf_store: one can be removed, the broker moves to the other
KEEP_ENV = "RAYBROKER_VERIFY_KEEP"  # set: keep the run's directory (Ray's logs, the stores)


def run(options: Options, progress: Progress = print) -> int:
    from actors.tools.verify.cluster import ray_running

    if ray_running():  # this process has a Ray of its own (a test session): run apart from it
        return subprocess.call([sys.executable, "-m", "actors.tools.verify", *options.argv()])
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1 << 31)
    report = verify(options, seed, progress)
    show(report, progress)
    if options.json:
        with open(options.json, "w") as f:
            json.dump(report, f, indent=2)
        progress(f"wrote {options.json}")
    return 0 if report["passed"] else 1


def verify(options: Options, seed: int, progress: Progress) -> dict[str, Any]:
    from actors.tools.verify.cluster import LocalCluster

    started = time.monotonic()
    deadline = started + options.timeout
    schedule = plan(seed, parse_kinds(options.faults), TARGETS)
    progress(f"seed {seed} (--seed {seed} replays this schedule)")
    for f in schedule:
        progress(f"  fault {f.kind} on {f.target} at {f.at:.0%} of the workload")
    root = tempfile.mkdtemp(prefix="raybroker-verify-")
    cluster = LocalCluster(root)
    extra: dict[str, Any] = {"seed": seed, "errors": []}
    run_: Run | None = None
    try:
        progress("starting a local Ray cluster")
        cluster.start()
        with contextlib.ExitStack() as stack:
            run_ = Run(options, seed, schedule, cluster, root, deadline, progress, stack)
            report = run_.go(extra)
    except Exception as exc:  # the report says what broke; the run fails
        extra["errors"].append(f"{type(exc).__name__}: {exc}"[:1000])
        report = None
    finally:
        with contextlib.suppress(Exception):
            cluster.shutdown()
        if os.environ.get(KEEP_ENV):  # to read Ray's logs after a failure
            progress(f"kept {root} ({KEEP_ENV} is set)")
        else:
            shutil.rmtree(root, ignore_errors=True)
    if report is None:
        faults = run_.faults if run_ is not None else []
        report = build(planned=options.messages, verdict=check([], []), faults=faults, extra=extra)
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    return report


class Run:
    """One verification on a running cluster."""

    def __init__(
        self,
        options: Options,
        seed: int,
        schedule: list[Fault],
        cluster: Any,
        root: str,
        deadline: float,
        progress: Progress,
        stack: contextlib.ExitStack,
    ) -> None:
        self.options, self.seed, self.schedule = options, seed, schedule
        self.cluster, self.root, self.deadline = cluster, root, deadline
        self.progress, self.stack = progress, stack
        self.history = History()
        self.faults: list[dict[str, Any]] = []
        self.settled = False  # every queue on the way empty at the end

    def go(self, extra: dict[str, Any]) -> dict[str, Any]:
        from actors.remote.client import connect
        from actors.remote.trust import secure_dialogs
        from actors.tools.verify.faults import Injector
        from topologies.deploy import deploy
        from topologies.loader import parse

        o = self.options
        spark_n = spark_rows(o.messages) if o.spark else 0
        spark = self._spark() if spark_n else None  # before the store nodes (LocalCluster.start)
        self.progress(f"adding {STORE_NODES} store nodes")
        self.cluster.add_store_nodes(STORE_NODES)
        data = os.path.join(self.root, "data")
        os.makedirs(data, exist_ok=True)
        master = os.path.join(data, "master.key")  # the run's own, readable by its owner only
        with open(os.open(master, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(os.urandom(32).hex())
        topology = parse(document(master), "raybroker verify topology")
        self.progress("deploying brokers, forwarders, load-balanced targets and a router set")
        deployment = deploy(topology, data)
        # the secured path: the shop and the store trust each other (dialog security)
        secure_dialogs(deployment.brokers[SHOP], SHOP_SERVICE, deployment.brokers["vf-store"],
                       PATHS["secured"])  # fmt: skip
        injector = Injector(self.cluster, deployment, topology, data)
        workload = o.messages - spark_n
        streams = begin_streams(deployment.brokers[SHOP], o.dialogs)
        batch = max(1, min(50, workload // (o.dialogs * len(PATHS) * 40)))
        gates = Gates([max(1, int(f.at * workload)) for f in self.schedule])
        malformed = Malformed(connect(SHOP), random.Random(self.seed + 1), MAX_BODY)
        sender = Sender(
            connect(SHOP),
            streams,
            workload,
            batch,
            self.history,
            gates,
            malformed,
            WINDOW,
            self.deadline,
        )
        collector = Collector(connect(SHOP), self.history)
        ingest = None
        if spark is not None:
            ingest = SparkIngest(spark, connect(SHOP), spark_n, self.seed, self.history)
            ingest.start()
        self.progress(
            f"workload: {workload:,} messages over {o.dialogs} dialogs on each of "
            f"{', '.join(PATHS)}" + (f"; Spark ingests {spark_n:,} rows" if ingest else "")
        )
        collector.start()
        t0 = time.monotonic()
        sender.start()
        reporter = self._reporter(t0, o.messages, malformed, ingest)
        try:
            self._faults(injector, sender, gates, ingest, t0)
            if ingest is not None:
                ingest.go.set()
            self._finish(sender, ingest, collector, injector)
        finally:
            sender.stop.set()
            gates.release_all()
            collector.stop.set()
            reporter.set()
            collector.join(timeout=30)
        extra.update(self._detail(injector, sender, collector, malformed, ingest))
        return self._judge(extra)

    def _spark(self) -> Any:
        from spark_bridge import spark_session
        from spark_bridge.session import short_jobs_configs

        self.progress("starting Spark on Ray (RayDP)")
        # RayDP's master and executor actors stay on the head: a removed node must not take
        # Spark with it (the master needs no CPU, so Ray could place it anywhere). Its one job
        # is a few hundred rows: the JVMs' first JIT tier is enough.
        configs = short_jobs_configs() | {
            f"spark.ray.raydp_spark_{actor}.actor.resource.{HEAD_RESOURCE}": "1"
            for actor in ("master", "executor")
        }
        return self.stack.enter_context(spark_session(app_name="raybroker-verify", configs=configs))

    def _reporter(
        self, t0: float, planned: int, malformed: Malformed, ingest: SparkIngest | None
    ) -> threading.Event:
        done = threading.Event()

        def report() -> None:
            while not done.wait(2.0):
                c = self.history.counts()
                self.progress(
                    f"[{time.monotonic() - t0:6.1f}s] sent {c['sent']:,}/{planned:,}  "
                    f"confirmed {c['confirmed']:,}  refused {sum(malformed.refused.values()):,}  "
                    f"faults {len(self.faults)}/{len(self.schedule)}"
                    + (f"  {ingest.line()}" if ingest is not None else "")
                )

        threading.Thread(target=report, daemon=True, name="verify-progress").start()
        return done

    def _faults(
        self,
        injector: Injector,
        sender: Sender,
        gates: Gates,
        ingest: SparkIngest | None,
        t0: float,
    ) -> None:
        for i, fault in enumerate(self.schedule):
            gates.arrived[i].wait(max(0.0, self.deadline - time.monotonic()))
            if not gates.arrived[i].is_set() or not sender.is_alive():
                # the sender stopped (failed, or out of time): the report says why
                for f in self.schedule[i:]:
                    self.faults.append(
                        {
                            "kind": f.kind,
                            "target": f.target,
                            "at_s": None,
                            "recovered_s": None,
                            "detail": "not injected: the workload stopped first",
                        }
                    )
                return
            # A node takes whatever Ray placed on it (reader actors, maybe a router replica):
            # after a node fault every path must flow again.
            struck = PATHS if fault.kind == "node_removed" else AFFECTS[fault.target]
            paths = [p for p in struck if p in PATHS]
            marks = sender.marks(paths)
            self.progress(f"fault {i + 1}/{len(self.schedule)}: {fault.kind} on {fault.target}")
            record = {"kind": fault.kind, "target": fault.target, "at_s": None}
            try:
                record.update(self._one(injector, fault, i, gates, ingest, marks, t0))
            except Exception as exc:  # reported with the fault; the run goes on, and fails
                gates.released[i].set()
                record.update(recovered_s=None, detail=f"{type(exc).__name__}: {exc}"[:500])
            self.faults.append(record)
            shown = "not seen" if record["recovered_s"] is None else f"{record['recovered_s']:.2f}s"
            self.progress(f"  {fault.kind} on {fault.target}: recovered in {shown}")

    def _one(
        self,
        injector: Injector,
        fault: Fault,
        i: int,
        gates: Gates,
        ingest: SparkIngest | None,
        marks: dict[str, int],
        t0: float,
    ) -> dict[str, Any]:
        """Inject one fault, release the sender, and measure the recovery: from the injection
        until the struck thing answers again and every affected dialog has had a reply to a
        message sent after the fault."""
        try:
            active = injector.inject(fault, self.deadline)
        finally:
            gates.released[i].set()
        if ingest is not None:
            ingest.go.set()  # Spark's rows go while the faults do
        until = min(self.deadline, active.t0 + RECOVERY_S)
        injector.settle(active, until)
        flowed = _wait(lambda: self.history.recovered_at(marks), until)
        done = [active.answered_at, flowed]
        recovered = None if None in done else max(done) - active.t0
        again = any(f.kind == fault.kind for f in self.schedule[i + 1 :])
        injector.heal(active, again)
        return {
            "at_s": round(active.t0 - t0, 2),
            "recovered_s": None if recovered is None else round(recovered, 2),
            "detail": active.detail,
        }

    def _finish(
        self, sender: Sender, ingest: SparkIngest | None, collector: Collector, injector: Injector
    ) -> None:
        """Wait for the sender and Spark to finish, every reply to come, and every queue on the
        way to empty (so a late duplicate would be seen too)."""
        left = lambda: max(0.0, self.deadline - time.monotonic())  # noqa: E731
        sender.join(left())
        if ingest is not None:
            ingest.join(left())
        # (a collector that failed will confirm nothing more: no use waiting for the deadline)
        _wait(lambda: self.history.unconfirmed() == 0 or not collector.is_alive(), self.deadline)
        until = min(self.deadline, time.monotonic() + SETTLE_S)
        self.settled = bool(_wait(lambda: _quiet(injector), until))

    def _detail(
        self,
        injector: Injector,
        sender: Sender,
        collector: Collector,
        malformed: Malformed,
        ingest: SparkIngest | None,
    ) -> dict[str, Any]:
        states = []
        for broker, queue in RECEIVERS:
            with contextlib.suppress(Exception):
                states += [g["state"] for g in injector.broker(broker).groups(queue)]
        errors = [e for e in (sender.error, collector.error) if e]
        timed_out = time.monotonic() > self.deadline
        if timed_out:
            errors.append(f"unaccounted at the deadline: {self.history.unconfirmed():,} message(s)")
        sent = self.history.sent
        return {
            "errors": errors,
            "timed_out": timed_out,
            "settled": self.settled,
            "sent": len(sent),
            "paths": {
                p: sum(1 for s in sent if s.stream.startswith(f"{p}/")) for p in (*PATHS, "spark")
            },
            **malformed.report(),
            "handlers": handlers_seen(states),
            "retried_sends": sender.retried_calls,
            "replies_rolled_back": collector.rolled_back,
            "dialog_errors": self.history.others[:20],
            "spark": ingest.result if ingest is not None else None,
        }

    def _judge(self, extra: dict[str, Any]) -> dict[str, Any]:
        sent, replies = self.history.sent, self.history.replies
        verdict = check(sent, replies)
        extra["checker_self_test"] = self_test(sent, replies, self.seed)
        if self.options.spark and not (extra.get("spark") or {}).get("sent"):
            extra["errors"].append(f"the Spark ingest did not send its rows: {extra.get('spark')}")
        return build(
            planned=self.options.messages, verdict=verdict, faults=self.faults, extra=extra
        )


def _wait(check_: Callable[[], Any], until: float, every: float = 0.1) -> Any:
    """Poll `check_` until it is truthy (returned) or `until` passes (None)."""
    while True:
        value = check_()
        if value or time.monotonic() > until:
            return value or None
        time.sleep(every)


def _quiet(injector: Injector) -> bool:
    """Nothing waiting anywhere: no transmission queue holds a message and no receiving queue
    (nor the shop's) has one."""
    try:
        for b in injector.all_brokers().values():
            if b.transmission_queue(limit=1):
                return False
        for broker, queue in [*RECEIVERS, (SHOP, SHOP_QUEUE)]:
            if injector.broker(broker).queues()[queue]["depth"]:
                return False
    except Exception:  # a broker restarting: not quiet yet
        return False
    return True
