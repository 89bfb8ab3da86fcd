"""`raybroker bench peers`: the workloads on raybroker and on the real peer servers (Debian's
redis-server and rabbitmq-server, started and stopped by the harness), every row checked.

Where a server is not installed its rows are skipped rows (with the install command); under
CI=1 that is a failure, since CI installs both."""

from __future__ import annotations

import json
import os

import psutil
import pytest

from actors.tools.bench.peers import servers
from actors.tools.bench.peers.run import CLASSES, SYSTEMS, run
from actors.tools.bench.report import Load

from .conftest import in_own_process

VARIANTS = ("bulk-one-conversation", "bulk-spread", "many-clients", "paced")
FIELDS = {
    "system",
    "variant",
    "messages_per_s",
    "p50_ms",
    "p99_ms",
    "cpu_s_per_1k",
    "notes",
    "lost",
    "doubled",
    "out_of_order",
    "durability",
    "runs",
    "vs",
    "server_cpu_s_per_1k",
}
SERVER_OF = {
    "redis-streams": "redis-server",
    "rabbitmq-classic": "rabbitmq-server",
    "rabbitmq-quorum": "rabbitmq-server",
}


def harness_servers() -> set[int]:
    """Server processes running from a bench run's temp dir (redis runs in its data dir; the
    Erlang VM gets its directories through the environment)."""
    found = set()
    for p in psutil.process_iter(["name"]):
        if p.info["name"] not in ("redis-server", "beam.smp"):
            continue
        try:
            places = [p.cwd(), *p.environ().values()]
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        if any("raybroker-peers-" in place for place in places):
            found.add(p.pid)
    return found


def assert_skipped(row: dict) -> None:
    assert row["messages_per_s"] == 0.0
    assert row["p50_ms"] is row["p99_ms"] is row["cpu_s_per_1k"] is None
    assert row["server_cpu_s_per_1k"] is None
    assert row["lost"] is row["doubled"] is row["out_of_order"] is None
    assert row["notes"].startswith("skipped: ") and "install: apt-get install " in row["notes"]


@pytest.mark.slow
def test_every_system_runs_every_workload_once_in_order(tmp_path):
    # the command as a user runs it, with its own embedded Ray: a process of its own, so it can
    # run in any pytest worker (tests/conftest.py), beside the tests on a session's Ray
    before = harness_servers()
    path = tmp_path / "peers.json"
    # --quick: no warm-up runs (a smoke test's figures are not compared)
    args = ["-m", "actors.tools.cli", "bench", "peers", "--messages", "2000", "--repeats", "1"]
    args.append("--quick")
    done = in_own_process([*args, "--json", str(path)], timeout=600)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = json.loads(path.read_text())
    assert report["scenario"] == "peers" and report["params"]["repeats"] == 1
    assert report["params"]["workloads"] == {
        "bulk-one-conversation": 2000,
        "bulk-spread": 2000,
        "many-clients": 200,
        "paced": 500,
    }
    rows = {(r["system"], r["durability"], r["variant"]): r for r in report["rows"]}
    assert set(rows) == {(s, d, v) for s in SYSTEMS for d in CLASSES[s] for v in VARIANTS}
    for (system, _, variant), row in rows.items():
        assert set(row) == FIELDS
        if system in SERVER_OF and row["notes"].startswith("skipped"):
            assert os.environ.get("CI") != "1", f"{SERVER_OF[system]} missing on CI: {row}"
            assert servers.find(SERVER_OF[system]) is None  # skipped only when it is absent
            assert_skipped(row)
            continue
        where = f"{system} {variant}: {row['notes']}"
        assert row["messages_per_s"] > 0 and row["runs"] == [row["messages_per_s"]], where
        assert 0 <= row["p50_ms"] <= row["p99_ms"], where
        assert row["cpu_s_per_1k"] >= 0, where  # whole clock ticks: a short row may read 0
        # the server's own part of it; raw SQLite has no server process (it runs in its clients)
        if system == "raw-sqlite":
            assert row["server_cpu_s_per_1k"] is None, where
        else:
            assert 0 <= row["server_cpu_s_per_1k"] <= row["cpu_s_per_1k"], where
        assert (row["lost"], row["doubled"], row["out_of_order"]) == (0, 0, 0), where
    assert "not durable" in rows[("ray-queue", "none", "bulk-spread")]["notes"]
    # each system as its server and client report themselves
    systems = report["params"]["systems"]
    assert systems["raybroker default"]["durability"] == "normal"
    assert systems["raybroker power-safe"]["durability"] == "full"
    assert systems["raw-sqlite default"]["synchronous"] == 1  # NORMAL
    assert systems["raw-sqlite power-safe"]["synchronous"] == 2  # FULL
    if "redis-streams default" in systems:
        assert systems["redis-streams default"]["appendfsync"] == "everysec"
        assert systems["redis-streams power-safe"]["appendfsync"] == "always"
        for durability in CLASSES["redis-streams"]:
            client = systems[f"redis-streams {durability}"]
            assert client["hiredis_in_use"] is True and client["hiredis"], client
            assert client["redis-py"] and client["redis_version"], client
    for kind in ("classic", "quorum"):
        if f"rabbitmq-{kind} power-safe" in systems:
            server = systems[f"rabbitmq-{kind} power-safe"]
            assert server["queue_type"] == kind and server["aio-pika"], server
    # raybroker's rows compare with the peers of their own durability class only
    default, safe = (rows[("raybroker", d, "paced")]["notes"] for d in ("default", "power-safe"))
    assert "x raw-sqlite" in default and "x raw-sqlite" in safe
    assert "ray-queue" not in default and "rabbitmq" not in default
    if "rabbitmq-classic power-safe" in systems:
        assert "x rabbitmq-classic" in safe and "x rabbitmq-quorum" in safe
    out = done.stdout
    assert "raybroker (default): bulk-spread: run 1/1, 2,000 messages" in out and "msg/s" in out
    assert "warm-up" not in out
    assert harness_servers() <= before  # the servers it started are stopped


def test_a_server_not_found_is_a_skipped_row_with_its_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv(servers.PATH_ENV, str(tmp_path))  # an empty directory: nothing found
    progress: list[str] = []
    chosen = ["redis-streams", "rabbitmq-classic"]
    report = run(Load(messages=1000), progress.append, systems=chosen, repeats=1)
    assert [(r.system, r.durability, r.variant) for r in report.rows] == [
        (s, d, v) for v in VARIANTS for s in chosen for d in CLASSES[s]
    ]
    for row in report.rows:
        assert_skipped(row.__dict__)
    notes = {r.system: r.notes for r in report.rows}
    assert notes["redis-streams"] == (
        "skipped: redis-server not found; install: apt-get install redis-server"
    )
    assert notes["rabbitmq-classic"] == (
        "skipped: rabbitmq-server not found; install: apt-get install rabbitmq-server"
    )
    assert any("redis-streams (default): skipped" in line for line in progress)


def test_a_server_hidden_from_the_search_path_is_skipped_beside_one_found(tmp_path, monkeypatch):
    real = servers.find("redis-server")
    if real is None:
        if os.environ.get("CI") == "1":
            pytest.fail("redis-server is not installed on CI")
        pytest.skip("redis-server not installed here")
    shown = tmp_path / "bin"
    shown.mkdir()
    (shown / "redis-server").symlink_to(real)  # redis-server visible, rabbitmq-server hidden
    monkeypatch.setenv(servers.PATH_ENV, str(shown))
    chosen = ["redis-streams", "rabbitmq-classic"]
    report = run(Load(messages=1000), lambda _: None, systems=chosen, repeats=1)
    rows = {(r.system, r.durability, r.variant): r for r in report.rows}
    for variant in VARIANTS:
        assert_skipped(rows[("rabbitmq-classic", "power-safe", variant)].__dict__)
        redis_row = rows[("redis-streams", "power-safe", variant)]
        assert redis_row.messages_per_s > 0, redis_row.notes
        assert (redis_row.lost, redis_row.doubled, redis_row.out_of_order) == (0, 0, 0)
