"""Integration tests: one real local Ray per session, real brokers on real SQLite files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import ray

from actors import (
    Broker,
    BrokerHandle,
    Contract,
    LocalBroker,
    MessageType,
    Queue,
    Service,
    start_broker,
)
from actors.remote.runtime import ensure_ray

os.environ.setdefault("RAYBROKER_QUIET", "1")  # actor logs stay in Ray's log files


ROOT = Path(__file__).resolve().parents[2]
TEST_CODE = ("tests",)  # code_modules of the suite's brokers: its handlers are in tests/


def in_own_process(
    args: Sequence[str], timeout: float, quiet: bool = False
) -> subprocess.CompletedProcess[str]:
    """`python ARGS` from the project's root in a process of its own, which starts a Ray of its
    own (the session's address is not passed on): a command as a user runs it, or a cluster of
    its own. `quiet`: the Ray workers' logs stay off its output."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if quiet:
        env["RAYBROKER_QUIET"] = "1"
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def script_result(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The `RESULT {json}` a check script printed last; fails naming its error, reader error or
    timeout (and the script's last output) when it recorded one."""
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line (exit {run.returncode}):\n{run.stdout}\n{run.stderr[-3000:]}"
    r = json.loads(lines[-1].removeprefix("RESULT "))
    failed = {k: r[k] for k in ("error", "reader_error", "timeout") if k in r}
    assert not failed, f"{failed}\n{run.stderr[-3000:]}"
    return r


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    ensure_ray(num_cpus=4)
    yield
    ray.shutdown()


def broker_factory(folder: Path) -> tuple[Callable[..., Broker], list[Broker]]:
    """`make(path=None, name=None, **options)`: start a broker with its file in `folder`; the
    list holds every broker started, for the fixture to stop."""
    started: list[Broker] = []

    def make(path: str | None = None, name: str | None = None, **options: Any) -> Broker:
        name = name or f"test-{uuid.uuid4().hex[:10]}"
        b = start_broker(name, path or str(folder / f"{name}.sqlite"), **options)
        started.append(b)
        return b

    return make, started


@pytest.fixture
def make_broker(ray_session, tmp_path) -> Iterator[Callable[..., Broker]]:
    """Start brokers with files under this test's tmp_path; all are stopped at the end."""
    make, started = broker_factory(tmp_path)
    yield make
    for b in started:
        b.stop()


@pytest.fixture(scope="module")
def make_module_broker(ray_session, tmp_path_factory) -> Iterator[Callable[..., Broker]]:
    """make_broker for a module's fixtures: brokers its tests share, stopped after its last
    test. For tests that each check one refusal leaves a broker as it was (a broker's start,
    ~1.3 CPU-seconds in Ray, was most of such a test's cost)."""
    make, started = broker_factory(tmp_path_factory.mktemp("brokers"))
    yield make
    if not ray.is_initialized():
        # the session's Ray stopped before the module's last tests, which start clusters of
        # their own (tests/conftest.py: pytest_runtest_teardown): its brokers went with it
        return
    for b in started:
        b.stop()


@pytest.fixture
def broker(request, tmp_path) -> BrokerHandle:
    """A broker actor; a test marked `@on_both` runs once with it and once with an in-process
    `LocalBroker` (same verbs, no Ray), so one scenario suite covers both handles."""
    if getattr(request, "param", "ray") == "local":
        path = str(tmp_path / "local.sqlite")
        b = LocalBroker(f"local-{uuid.uuid4().hex[:10]}", path, code_modules=TEST_CODE)
        request.addfinalizer(b.stop)
        return b
    # the suite's own handlers (tests.integration.activation_handlers) may run on it
    return request.getfixturevalue("make_broker")(limits={"code_modules": list(TEST_CODE)})


on_both = pytest.mark.parametrize("broker", ["local", "ray"], indirect=True)


def define_orders(b: BrokerHandle, poison_limit: int = 5, retention: bool = False) -> None:
    """The catalog most tests use: Orders (initiator) -> Fulfilment (target)."""
    b.create(MessageType("Order", "json"))
    b.create(
        MessageType(
            "Line",
            "json_schema",
            schema={
                "type": "object",
                "required": ["sku", "qty"],
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
            },
        )
    )
    b.create(MessageType("Ack"))
    b.create(
        Contract("OrderContract", {"Order": "initiator", "Line": "initiator", "Ack": "target"})
    )
    b.create(Queue("OrdersQueue"))
    b.create(Queue("FulfilmentQueue", poison_limit=poison_limit, retention=retention))
    b.create(Service("Orders", "OrdersQueue"))
    b.create(Service("Fulfilment", "FulfilmentQueue", ["OrderContract"]))


@pytest.fixture(scope="session")
def spark(ray_session) -> Iterator[Any]:
    """One Spark session on the test Ray (RayDP), shared by every test that needs Spark; its
    jobs are short (test_spark_bridge.py alone: 206 -> 171 s with these settings)."""
    from spark_bridge import spark_session
    from spark_bridge.session import short_jobs_configs

    with spark_session(app_name="raybroker-tests", configs=short_jobs_configs()) as session:
        yield session
