"""The broker's metrics, read back the way Prometheus scrapes them: from the node's metrics
export port, served by Ray's metrics agent."""

from __future__ import annotations

import re
import urllib.request

import pytest
import ray

from actors import Begin, Queue, Send, Service
from tests.polling import wait_until

pytestmark = pytest.mark.slow


def scrape() -> str:
    node = next(n for n in ray.nodes() if n["Alive"])
    url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def value(text: str, metric: str, **tags: str) -> float | None:
    """The sample of `metric` whose labels include `tags` (None: not exported yet)."""
    for line in text.splitlines():
        if not line.startswith(f"ray_{metric}{{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(labels.get(k) == v for k, v in tags.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_counts_depths_and_call_latency_reach_the_nodes_metrics_export(make_broker):
    b = make_broker()
    b.create(Queue("MQ"))
    b.create(Service("MS", "MQ", ["DEFAULT"]))
    op = Begin("MS", "MS")
    b.apply([op, Send(op.handle, "DEFAULT", [b"m"] * 30)])
    b.commit(b.receive("MQ", top=20))  # 20 committed, 10 left waiting

    def exported():
        text = scrape()
        got = {
            "sent": value(text, "raybroker_messages_sent_total", broker=b.name)
            or value(text, "raybroker_messages_sent", broker=b.name),
            "committed": value(text, "raybroker_messages_committed_total", broker=b.name)
            or value(text, "raybroker_messages_committed", broker=b.name),
            "depth": value(text, "raybroker_queue_depth", broker=b.name, queue="MQ"),
            "apply_calls": value(text, "raybroker_call_ms_count", broker=b.name, method="apply"),
        }
        seen.append(got)
        return got == {"sent": 30, "committed": 20, "depth": 10, "apply_calls": 1}

    seen: list[dict] = []
    try:
        wait_until(exported, timeout=60, what="the broker's metrics in the node's export")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last scraped: {seen[-1:]}") from None
