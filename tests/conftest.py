"""Settings for the whole suite."""

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Shared 2-core machines: a slow moment must not fail a property test on time alone.
settings.register_profile("raybroker", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("raybroker")

# Ray's agents sample every worker's process every 5 s by default, for the dashboard's node view:
# a few percent of a core for each cluster the suite runs, and nothing here reads it
os.environ.setdefault("REPORTER_UPDATE_INTERVAL_MS", "60000")
# and each node's log monitor lists its logs directory 10 times a second while it holds fewer
# than this many files (several hundred here: two per worker process the suite starts); above
# it, twice a second. The suite's drivers do not print the workers' logs (RAYBROKER_QUIET).
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
# Ray starts a worker process per CPU when the first driver connects, and keeps that many idle
# workers for later tasks; each costs ~1 CPU-second to start and polls while it idles. Nearly
# every worker the suite uses is an actor's (num_cpus=0), started when the actor is: none are
# prestarted, and of the idle ones (a task's) Ray keeps one past its idle timeout (1 s).
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
os.environ.setdefault("RAY_num_workers_soft_limit", "1")
# A raylet starts at most this many workers at once (Ray's default: the machine's CPUs, 2 here).
# The two groups on a session's Ray share one raylet (pytest_configure): this keeps the four
# the two clusters they had before would start, and below it Ray warns every driver, on its
# console, of "worker processes started" past the limit.
os.environ.setdefault("RAY_worker_maximum_startup_concurrency", "4")

INTEGRATION = "tests/integration/"  # node ids start with the path from the root
UNIT = "tests/unit"
# integration tests that start a Ray cluster of their own, in a subprocess or a namespace (a
# command run as a user runs it, a cluster of several nodes), longest first
OWN_CLUSTER = (
    "tests/integration/test_verify.py::",
    "tests/integration/test_ray_up.py::",
    "tests/integration/test_bench_peers.py::test_every_system_runs_every_workload",
    "tests/integration/test_mirror.py::test_a_mirrored_broker_loses_its_principals_node",
    "tests/integration/test_multinode.py::",
    "tests/integration/test_spark_bridge.py::test_bench_ingest_measures",
    "tests/integration/test_mirror.py::test_bench_mirror_writes",
)


# The integration tests on a session's Ray, in two groups of about equal length: each runs in a
# worker of its own (the first with the one Spark session), its tests together and in this
# order, both on the one cluster the controller starts (pytest_configure). The two overlap well
# on 2 cores; one group's worker is then free for the tests that start clusters of their own,
# the other's for the unit tests.
FIRST_GROUP = tuple(
    f"{INTEGRATION}{name}::"
    for name in (
        "test_mirror.py",
        "test_activation.py",
        "test_topology_deploy.py",
        "test_topology_scenarios.py",
        "test_topology_priority.py",
        # last, the files with tests that use the Spark session: it starts with the first of
        # them and stops with the group, so it idles through none of the others
        "test_ddr.py",
        "test_demo.py",
        "test_spark_bridge.py",
    )
)


def run_order(nodeid: str) -> float:
    """The order work goes out in: the two groups on a session's Ray first, then the tests with
    clusters of their own (the longest single tests), then the unit tests."""
    for i, prefix in enumerate(OWN_CLUSTER):
        if nodeid.startswith(prefix):
            return 2 + i / len(OWN_CLUSTER)
    for i, prefix in enumerate(FIRST_GROUP):
        if nodeid.startswith(prefix):
            return i / len(FIRST_GROUP)
    if nodeid.startswith(INTEGRATION):
        return 1
    return 3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: run_order(item.nodeid))  # stable: a file keeps its order


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A worker's Spark and Ray stop after its last test on a session's Ray (what comes after
    starts clusters of its own or needs none): left running, they would take CPU from the rest
    of the suite for minutes."""
    if run_order(item.nodeid) < 2 and (nextitem is None or run_order(nextitem.nodeid) >= 2):
        if "raydp" in sys.modules:
            from spark_bridge.session import restore_ctrl_c

            sys.modules["raydp"].stop_spark()
            restore_ctrl_c()
        if "ray" in sys.modules:
            sys.modules["ray"].shutdown()


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # the scopes go out in the order above
    if _shares_one_ray(config):
        # The two groups on a session's Ray run on one cluster, started here in the controller
        # and named to the workers by $RAY_ADDRESS (which they inherit): a second cluster's
        # start and its idle processes (GCS, raylet, agents, log monitor) for the length of
        # the run were CPU the tests did not get. Tests with clusters of their own drop the
        # address (tests/integration/conftest.py: in_own_process).
        import ray

        from actors.remote.runtime import QUIET, ensure_ray

        os.environ.setdefault(QUIET, "1")  # as tests/integration/conftest.py sets it
        ensure_ray(num_cpus=8)
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        _shared_ray_started.append(True)


_shared_ray_started: list[bool] = []  # in the controller, once it has started the cluster
_on_shared_ray: set[str] = set()  # the tests on it not yet reported done


def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    if _shared_ray_started and not _on_shared_ray:
        _on_shared_ray.update(i for i in ids if run_order(i) < 2)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the controller: the shared cluster stops once the last test on it is done (the rest
    of the run starts clusters of its own or needs none)."""
    if report.when == "teardown" and report.nodeid in _on_shared_ray:
        _on_shared_ray.discard(report.nodeid)
        if not _on_shared_ray and "ray" in sys.modules:
            sys.modules["ray"].shutdown()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _shared_ray_started:
        sys.modules["ray"].shutdown()


def _shares_one_ray(config: pytest.Config) -> bool:
    """In the controller of a run with pytest-xdist workers, with no cluster named already,
    unless the run names only Ray-free unit tests."""
    workers = getattr(config.option, "numprocesses", None)
    controller = workers and not hasattr(config, "workerinput")
    units_only = config.args and all(Path(a).as_posix().startswith(UNIT) for a in config.args)
    return bool(controller) and not units_only and "RAY_ADDRESS" not in os.environ


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With pytest-xdist (`-n 2`, the default in pyproject.toml): each group of integration
    tests on a session's Ray is one unit of work, given to a worker whole; each test that starts
    a cluster of its own is a unit of its own, and the Ray-free unit tests go a file at a time,
    each to whichever worker is free first."""
    from xdist.scheduler import LoadScopeScheduling

    class OneRayWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(OWN_CLUSTER):
                return nodeid
            if nodeid.startswith(FIRST_GROUP):
                return "session-ray-1"
            if nodeid.startswith(INTEGRATION):
                return "session-ray-2"
            return nodeid.split("::")[0]

    return OneRayWorker(config, log)
