"""The command line's bench jobs and its errors, in-process on the session's Ray (the demo:
test_demo.py)."""

from __future__ import annotations

import json

import pytest

from actors.tools.cli import main

from .test_bench_peers import FIELDS as ROW_FIELDS  # every bench row has these keys

SMOKE = ["--quick", "--messages", "2000", "--repeats", "1"]


@pytest.mark.slow
def test_bench_local_writes_the_report_shape(ray_session, tmp_path, capsys):
    path = tmp_path / "bench.json"
    # smoke tests of the commands: the report's shape and checks at a small size, no warm-up
    assert main(["bench", "local", *SMOKE, "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["scenario"] == "local" and report["params"]["messages"] > 0
    systems = {(r["system"], r["variant"]) for r in report["rows"]}
    assert ("raybroker", "end-to-end: send || receive+commit") in systems
    assert ("raw-sqlite", "insert, then select+delete") in systems
    for row in report["rows"]:
        assert set(row) == ROW_FIELDS
        assert row["messages_per_s"] > 0
    assert "raw-sqlite end-to-end" in report["rows"][0]["notes"]
    [one_shot] = [r for r in report["rows"] if r["variant"].startswith("one dialog per message")]
    assert (one_shot["lost"], one_shot["doubled"]) == (0, 0)  # each dialog's message once
    assert "msg/s" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_ddr_measures_routers_beside_direct(ray_session, tmp_path, capsys):
    path = tmp_path / "ddr.json"
    assert main(["bench", "ddr", *SMOKE, "--json", str(path)]) == 0
    assert "x direct" in capsys.readouterr().out
    report = json.loads(path.read_text())
    assert report["scenario"] == "ddr"
    variants = [r["variant"] for r in report["rows"] if r["system"] == "raybroker"]
    assert variants[0] == "direct (no router)"
    assert [v for v in variants if "router forwarding" in v] == [
        "router forwarding, 1 replica",
        "router forwarding, 2 replicas",
        "router forwarding, 4 replicas",
    ]
    assert any("redirect" in v for v in variants)
    assert all(r["messages_per_s"] > 0 for r in report["rows"])
    assert all("x direct" in r["notes"] for r in report["rows"][1:])
    # the driver's and the brokers' CPU; routers add processes, so their rows add CPU
    assert all(r["cpu_s_per_1k"] > 0 for r in report["rows"])


@pytest.mark.slow
def test_bench_activation_gives_a_rate_for_every_variant_even_when_one_turn_drains_the_queue(
    ray_session, tmp_path
):
    # at 2,000 messages the readers' first turn can take the whole queue, which once left no
    # drain after it to time: the bench reported 0 messages/s
    path = tmp_path / "activation.json"
    assert main(["bench", "activation", *SMOKE, "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["scenario"] == "activation"
    assert all(r["messages_per_s"] > 0 for r in report["rows"]), report["rows"]


@pytest.mark.slow
def test_bench_remote_measures_secured_dialogs_beside_unsecured(ray_session, tmp_path, capsys):
    path = tmp_path / "remote.json"
    assert main(["bench", "remote", *SMOKE, "--secure", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["scenario"] == "remote" and report["params"]["secure"] is True
    variants = {r["variant"]: r for r in report["rows"] if r["system"] == "raybroker"}
    secured = variants["two brokers, secured dialogs: send A, receive+commit B"]
    assert secured["messages_per_s"] > 0 and "x unsecured" in secured["notes"]
    assert all(r["messages_per_s"] > 0 for r in report["rows"])
    assert "msg/s" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_dialogs_reports_memory_per_dialog_the_restart_and_the_hot_subset(
    ray_session, tmp_path
):
    path = tmp_path / "dialogs.json"
    assert main(["bench", "dialogs", *SMOKE, "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    params = report["params"]
    assert report["scenario"] == "dialogs" and params["dialogs"] == 2000
    assert params["rss_bytes_per_dialog"] > 0 and params["restart_s"] > 0
    assert params["hot_ratio"] > 0
    hot, cached, memory, restart = report["rows"]
    assert hot["messages_per_s"] > 0 and cached["messages_per_s"] > 0
    assert "x all cached" in hot["notes"]
    assert "bytes of RSS per open dialog" in memory["notes"]
    assert "median of 1" in restart["notes"]


def test_an_unknown_bench_scenario_is_a_clear_error(capsys):
    assert main(["bench", "nope"]) == 2
    assert "unknown scenario 'nope'" in capsys.readouterr().err


def test_a_bad_message_count_for_a_bench_is_a_clear_error(capsys):
    assert main(["bench", "local", "--messages", "-5"]) == 2
    assert "messages" in capsys.readouterr().err
    for scenario in ("local", "peers", "mirror"):  # refused before anything starts
        assert main(["bench", scenario, "--repeats", "0"]) == 2
        assert "--repeats must be a whole number of 1 or more, not 0" in capsys.readouterr().err


def test_a_demo_without_orders_or_steady_time_is_a_clear_error_before_anything_starts(capsys):
    assert main(["demo", "--orders", "0"]) == 1
    assert "the demo needs at least 1 order, not 0" in capsys.readouterr().err
    assert main(["demo", "--steady-s", "-1"]) == 1
    assert "the steady phase needs a time above 0 s, not -1.0" in capsys.readouterr().err
