"""`raybroker verify`'s fault schedule: seeded, spread over the run, every chosen kind on a target
of its own list, and `--faults` read strictly."""

from __future__ import annotations

import pytest

from actors.errors import InvalidArgument
from actors.tools.verify.command import Options
from actors.tools.verify.schedule import FIRST, KINDS, LAST, parse_kinds, plan
from actors.tools.verify.topology import AFFECTS, TARGETS


def test_the_same_seed_gives_the_same_schedule_and_other_seeds_other_ones():
    first = plan(7, KINDS, TARGETS)
    assert plan(7, KINDS, TARGETS) == first
    assert all(plan(seed, KINDS, TARGETS) != first for seed in range(8, 20))


def test_every_kind_is_injected_once_on_one_of_its_targets_spread_over_the_run():
    for seed in range(50):
        faults = plan(seed, KINDS, TARGETS)
        assert sorted(f.kind for f in faults) == sorted(KINDS)
        assert all(f.target in TARGETS[f.kind] for f in faults)
        ats = [f.at for f in faults]
        assert ats == sorted(ats) and len(set(ats)) == len(ats)
        assert FIRST < ats[0] < ats[-1] < LAST
        slot = (LAST - FIRST) / len(KINDS)  # one fault per slot: never two at once
        assert [int((a - FIRST) // slot) for a in ats] == list(range(len(KINDS)))


def test_the_order_of_kinds_and_the_targets_vary_with_the_seed():
    orders = {tuple(f.kind for f in plan(seed, KINDS, TARGETS)) for seed in range(30)}
    killed = {
        next(f.target for f in plan(seed, KINDS, TARGETS) if f.kind == "broker_killed")
        for seed in range(60)
    }
    assert len(orders) > 10
    assert killed == set(TARGETS["broker_killed"])


def test_a_kind_named_twice_is_injected_twice():
    faults = plan(3, parse_kinds("node_removed,reader_killed,node_removed"), TARGETS)
    assert sorted(f.kind for f in faults) == ["node_removed", "node_removed", "reader_killed"]


def test_faults_option_default_all_none_and_unknown_kinds():
    assert parse_kinds(None) == KINDS
    assert parse_kinds("all") == KINDS
    assert parse_kinds("none") == ()
    assert plan(1, parse_kinds("none"), TARGETS) == []
    assert parse_kinds(" broker_killed , route_recreated") == ("broker_killed", "route_recreated")
    with pytest.raises(InvalidArgument, match=r"'nodes_removed'.*node_removed"):
        parse_kinds("broker_killed,nodes_removed")


def test_a_kind_without_targets_is_refused():
    with pytest.raises(InvalidArgument, match="router_killed.*no target"):
        plan(1, ["router_killed"], {"router_killed": ()})


def test_every_target_says_which_paths_it_touches():
    assert {t for targets in TARGETS.values() for t in targets} <= set(AFFECTS)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"messages": 10}, "--messages"),
        ({"timeout": 0}, "--timeout"),
        ({"dialogs": 1}, "--dialogs"),
        ({"faults": "everything"}, "--faults"),
    ],
)
def test_options_are_checked_before_anything_starts(change, message):
    with pytest.raises(InvalidArgument, match=message):
        Options(**change).check()


def test_options_round_trip_through_the_command_line():
    import argparse

    from actors.tools.verify.command import add_arguments, options

    o = Options(2000, 5, "node_removed", "/tmp/r.json", 120.0, False, 4)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert options(parser.parse_args(o.argv())) == o


def test_the_command_line_refuses_bad_options_before_starting_anything(capsys):
    from actors.tools.cli import main

    assert main(["verify", "--faults", "broker_killed,meteor"]) == 1
    err = capsys.readouterr().err
    assert "InvalidArgument" in err and "'meteor'" in err and "node_removed" in err
