"""`raybroker verify` end to end: its own multi-node cluster, every fault kind on a short
schedule with nothing lost, doubled or out of order; and the checker, run again on a copy of the
run's history with a loss, a double and an inversion put in on purpose, naming exactly those.

verify starts a Ray cluster of its own, so it runs in a subprocess, as the command a user runs
(each runs in any pytest worker, beside the tests on a session's Ray)."""

from __future__ import annotations

import json

import pytest

from actors.tools.verify.schedule import KINDS
from actors.tools.verify.topology import PATHS

from .conftest import in_own_process

pytestmark = pytest.mark.slow


def test_every_fault_kind_on_a_short_schedule_loses_doubles_and_reorders_nothing(tmp_path):
    path = tmp_path / "verify.json"
    args = ["--messages", "1200", "--seed", "4", "--timeout", "420", "--json", str(path)]
    done = in_own_process(["-m", "actors.tools.cli", "verify", *args], timeout=540, quiet=True)
    assert path.exists(), f"no report (exit {done.returncode}):\n{done.stdout[-4000:]}"
    r = json.loads(path.read_text())
    assert r["failures"] == [] and r["passed"] and done.returncode == 0, r

    assert (r["lost"], r["doubled"], r["out_of_order"], r["unexpected"]) == (0, 0, 0, 0)
    assert r["settled"] and not r["dialog_errors"] and not r["errors"]
    assert r["messages"] == r["delivered"] == r["planned"] == 1200 and r["unsent"] == 0
    # every path carried messages, Spark's rows among them, and the handlers saw each once
    assert all(r["paths"][p] > 0 for p in PATHS)
    assert r["spark"]["sent"] and r["paths"]["spark"] == r["spark"]["rows"] > 0
    assert r["handlers"] == {"seen": 1200, "out_of_sequence": 0}
    # every kind struck once, in the schedule's order through the run, and each recovered
    assert sorted(f["kind"] for f in r["faults"]) == sorted(KINDS)
    ats = [f["at_s"] for f in r["faults"]]
    assert ats == sorted(ats) and ats[0] >= 0
    assert all(0 <= f["recovered_s"] < 180 for f in r["faults"]), r["faults"]
    [node] = [f for f in r["faults"] if f["kind"] == "node_removed"]
    assert node["target"] == "vf-store" and node["detail"] == "moved to another node"
    # bad input rode along and was refused with its typed error, every time
    assert r["refused"] > 0 and r["malformed_not_refused_count"] == 0
    assert set(r["refused_by_kind"]) >= {"oversized", "contract", "wrong_type"}
    # progress while it ran, and the summary at the end
    assert "confirmed" in done.stdout and "recovered in" in done.stdout
    assert "every message once, in order" in done.stdout
    # the checker, run again on a copy of this run's history with one reply dropped, one
    # repeated and two of one dialog swapped, named exactly those, each with its conversation
    t = r["checker_self_test"]
    assert t["caught"] is True, t
    assert sorted(d["kind"] for d in t["injected"]) == ["double", "invert", "lose"]
    assert t["found"] == {d["kind"]: [d["id"]] for d in t["injected"]}
    assert len({d["stream"] for d in t["injected"]}) == 3
    assert "caught lose, double, invert put into its input" in done.stdout
