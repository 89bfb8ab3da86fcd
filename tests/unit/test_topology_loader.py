"""Topology files are checked before anything starts, with errors that say where."""

from __future__ import annotations

import pytest

from actors.catalog import Queue, Service
from actors.errors import TopologyError
from topologies.loader import load, parse


def test_the_priority_example_loads_with_two_activated_queues_of_different_sizes():
    topo = load("topologies/priority.yaml")
    [broker] = topo.brokers
    queues = {d.name: d for d in broker.definitions if isinstance(d, Queue)}
    assert queues["HighPriorityQueue"].activation.max_readers == 4
    assert queues["LowPriorityQueue"].activation.max_readers == 1
    assert {d.name for d in broker.definitions if isinstance(d, Service)} == {
        "Client",
        "HighPriority",
        "LowPriority",
    }


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ({}, "needs a non-empty list"),
        ({"brokers": [{"name": "b", "colour": "red"}]}, "brokers[0]: unknown key"),
        ({"brokers": [{"name": "b"}, {"name": "b"}]}, "brokers[1].name"),
        (
            {"brokers": [{"name": "b", "services": [{"name": "S", "queue": "Q"}]}]},
            "brokers[0].services[0]: unknown queue 'Q'",
        ),
        (
            {
                "brokers": [
                    {
                        "name": "b",
                        "queues": [{"name": "Q", "activation": {"handler": "no.such:thing"}}],
                    }
                ]
            },
            "brokers[0].queues[0]: handler 'no.such:thing' does not import",
        ),
        (
            {"brokers": [{"name": "b", "queues": [{"name": "Q", "poison_limit": -1}]}]},
            "brokers[0].queues[0]: queue 'Q': poison_limit",
        ),
    ],
)
def test_a_bad_topology_is_refused_naming_the_place(doc, where):
    with pytest.raises(TopologyError, match=None) as err:
        parse(doc, "t.yaml")
    assert where in str(err.value)
