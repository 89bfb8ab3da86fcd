"""Spark on the running Ray cluster through RayDP, with what JDK 17 and PySpark need set for the
caller: the module openings RayDP's Arrow transfer uses, and the Python the executors run."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from actors.errors import SparkUnavailable
from spark_bridge import native_libs

# Packages of java.base that Spark and RayDP reach into by reflection; JDK 17 closes them.
_OPENED = (
    "java.lang",
    "java.lang.invoke",
    "java.io",
    "java.net",
    "java.nio",
    "java.math",
    "java.text",
    "java.util",
    "java.util.concurrent",
    "java.util.concurrent.atomic",
    "sun.nio.ch",
    "sun.nio.cs",
    "sun.security.action",
    "sun.util.calendar",
)
JAVA_OPTIONS = " ".join(f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in _OPENED)
_JVMS = ("driver", "executor", "ray.raydp_app_master")  # Spark's driver, executors, RayDP's master
# JVM options by role (docs/benchmarks.md has the measurements, 1,000,000-row ingests on a
# 2-core machine). The driver and RayDP's master run no hot loops of rows, yet their
# second-tier JIT compiler threads took 0.65-1.05 CPU-seconds of each ingest, CPU the executors
# and the brokers wanted: they compile with the first tier only (0.2-0.3; ingests 17% faster).
# The executors run the rows' loops, so they keep both tiers, and collect with the parallel
# collector, which does its work in the pauses rather than in threads beside the tasks
# (G1's, the JVM's default, took CPU from the brokers meanwhile: ingests 10% faster).
FIRST_TIER = "-XX:TieredStopAtLevel=1"
_ROLE_OPTIONS = {
    "driver": FIRST_TIER,
    "executor": "-XX:+UseParallelGC",
    "ray.raydp_app_master": FIRST_TIER,
}


def short_jobs_configs() -> dict[str, str]:
    """Settings for a session of short jobs on small frames (the demo, the tests): the JVMs
    compile with the JIT's first tier only and collect with one GC thread, which costs such jobs
    about a quarter less CPU (measured over the Spark bridge's tests: 343 -> 249 CPU seconds).
    Long ingests of millions of rows want the default: the second tier's faster code."""
    options = f"{JAVA_OPTIONS} {FIRST_TIER} -XX:+UseSerialGC"
    return {f"spark.{jvm}.extraJavaOptions": options for jvm in _JVMS}


def spark_configs(
    executor_cpus: float,
    extra: Mapping[str, str] | None = None,
    cores: int = 2,
    ray_logs: str | None = None,
) -> dict[str, str]:
    """Spark settings for RayDP on JDK 17: Java options for the driver, the executors and RayDP's
    app master (the module openings, and each role's JIT and GC choice: `_ROLE_OPTIONS`), this
    interpreter for Python workers and their daemon (`spark_bridge.worker_daemon`), how many Ray
    CPUs an executor holds (less than its cores, so Ray tasks and the brokers' readers still get
    CPUs beside it), and shuffles cut into a few partitions per core the executors have (Spark's
    default of 200 makes every join and count of an audit run 200 tasks: the demo's 200-order
    audit read and reconciles took 91 s with them, about 39 s without).

    `ray_logs`: the logs directory of the Ray node this process is connected to, where RayDP's
    agent in the driver's JVM writes its log. Without it the agent writes to
    /tmp/ray/session_latest/logs, which is another cluster's when Ray's files are elsewhere
    ($RAY_TMPDIR), and the driver does not start at all when that link names a session
    directory that is gone ("Error create log dir")."""
    conf = {
        "spark.sql.shuffle.partitions": str(2 * cores),
        **{
            f"spark.{jvm}.extraJavaOptions": f"{JAVA_OPTIONS} {_ROLE_OPTIONS[jvm]}" for jvm in _JVMS
        },
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.python.daemon.module": "spark_bridge.worker_daemon",  # no jar on workers' paths
        "spark.ray.raydp_spark_executor.actor.resource.cpu": str(executor_cpus),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.showConsoleProgress": "false",
    }
    conf.update(extra or {})
    if ray_logs:
        driver = "spark.driver.extraJavaOptions"
        conf[driver] = f"{conf[driver]} -Dray.logging.dir={ray_logs}"
    return conf


@contextlib.contextmanager
def spark_session(
    spark: Any = None,
    *,
    app_name: str = "raybroker",
    executors: int = 1,
    cores: int = 2,
    memory: str = "2GB",
    executor_cpus: float = 1.0,
    configs: Mapping[str, str] | None = None,
) -> Iterator[Any]:
    """`with spark_session() as spark:` Spark on Ray (a local embedded Ray unless the driver is
    already connected, or $RAY_ADDRESS names a cluster), stopped cleanly on exit.

    Pass `spark` (a SparkSession on Ray you manage) to use it as it is: it is not stopped. A
    RayDP session already running in this process is used the same way."""
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    if spark is not None:
        yield spark
        return
    from actors.remote.runtime import ensure_ray

    ensure_ray()
    import raydp

    native_libs.prune()  # what earlier sessions' drivers left in /tmp/ray (40 MB each)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    ctrl_c = signal.getsignal(signal.SIGINT)
    try:
        session = raydp.init_spark(
            app_name,
            num_executors=executors,
            executor_cores=cores,
            executor_memory=memory,
            configs=spark_configs(executor_cpus, configs, executors * cores, _ray_logs()),
        )
    except Exception as exc:  # RayDP raises bare Exceptions (Java missing, gateway died, ...)
        raise SparkUnavailable(
            f"Spark on Ray did not start ({type(exc).__name__}: {exc}); check that Java 17 is "
            "on PATH (java -version) and that the Ray cluster has "
            f"{executors * executor_cpus:g} free CPUs for the executors"
        ) from exc
    try:
        session.sparkContext.setLogLevel("ERROR")
        yield session
    finally:
        raydp.stop_spark()
        _wait_for_master_gone(app_name)
        restore_ctrl_c(ctrl_c)


MASTER_GONE_S = 30.0  # how long a stopped session's master may take to go


def _ray_logs() -> str | None:
    """The logs directory of the Ray node this process is connected to: its session's, beside
    the raylet's socket (`<session>/sockets/raylet`), as Ray lays a session out. None when Ray
    does not say; the directory is created if missing."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        socket = node.get("RayletSocketName")
        if node.get("NodeID") == here and socket:
            return os.path.join(os.path.dirname(os.path.dirname(socket)), "logs")
    return None


def _wait_for_master_gone(app_name: str, timeout_s: float = MASTER_GONE_S) -> None:
    """RayDP stops its master actor without waiting for it, and the next session of the same
    name cannot start while it still holds the name (`raybroker bench ingest`'s second session
    failed so): wait until it has gone, polling."""
    import ray
    from raydp.spark.ray_cluster_master import RAYDP_SPARK_MASTER_SUFFIX

    name = app_name + RAYDP_SPARK_MASTER_SUFFIX
    deadline, pause = time.monotonic() + timeout_s, 0.01
    while time.monotonic() < deadline:
        if not ray.is_initialized():  # Ray itself stopped first (get_actor would start one)
            return
        try:
            ray.get_actor(name)
        except ValueError:  # no actor of that name: gone
            return
        time.sleep(pause)
        pause = min(2 * pause, 0.25)


def restore_ctrl_c(handler: Any = signal.default_int_handler) -> None:
    """PySpark's context takes Ctrl-C (SIGINT) to cancel its jobs and leaves its handler behind
    when it stops: a Ctrl-C after that fails inside the handler (AttributeError) instead of
    interrupting. Give SIGINT back its handler from before Spark started."""
    if threading.current_thread() is threading.main_thread() and handler is not None:
        signal.signal(signal.SIGINT, handler)
