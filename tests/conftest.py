"""Settings for the whole suite."""

from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Shared 2-core machines: a slow moment must not fail a property test on time alone.
settings.register_profile("raybroker", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("raybroker")

INTEGRATION = "tests/integration/"  # node ids start with the path from the root
# integration tests that start a Ray cluster of their own, in a subprocess or a namespace (a
# command run as a user runs it, a cluster of several nodes): they run in the unit tests' worker,
# beside the tests on the session's Ray
OWN_CLUSTER = (
    "tests/integration/test_ray_up.py::",
    "tests/integration/test_multinode.py::",
    "tests/integration/test_verify.py::",
    "tests/integration/test_cli.py::test_the_demo_routes",
    "tests/integration/test_cli.py::test_bench_ddr_measures",
    "tests/integration/test_mirror.py::test_bench_mirror_writes",
    "tests/integration/test_mirror.py::test_a_mirrored_broker_loses_its_principals_node",
    "tests/integration/test_bench_peers.py::test_every_system_runs_every_workload",
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With pytest-xdist (`-n 2`, the default in pyproject.toml): the integration tests on the
    session's Ray stay together in one worker, in order, sharing its one Ray cluster and Spark
    session; the Ray-free unit tests (a file at a time) and the tests that start a cluster of
    their own run in the other worker, while the first waits on Ray (the machine is about a
    third idle then)."""
    from xdist.scheduler import LoadScopeScheduling

    class OneRayWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(OWN_CLUSTER):
                return "own-cluster"
            if nodeid.startswith(INTEGRATION):
                return INTEGRATION
            return nodeid.split("::")[0]

    return OneRayWorker(config, log)
