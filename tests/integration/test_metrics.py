"""The broker's metrics, read back the way Prometheus scrapes them: from the node's metrics
export port, served by Ray's metrics agent."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
import ray

from actors import Begin, Queue, Send, Service
from actors.remote.metrics import scraped_names
from tests.polling import wait_until

pytestmark = pytest.mark.slow

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "raybroker.json"


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
    # every series of the broker's, as scraped, is one the Grafana dashboard may read
    ours = [line for line in scrape().splitlines() if line.startswith("ray_raybroker_")]
    names = {line.split("{")[0] for line in ours if f'broker="{b.name}"' in line}
    assert names and names <= scraped_names(), names - scraped_names()
    assert {"ray_raybroker_messages_sent_total", "ray_raybroker_call_ms_bucket"} <= names


def family(series: str) -> str:
    return re.sub(r"_(bucket|count|sum)$", "", series)


def test_the_grafana_dashboard_shows_every_metric_the_brokers_export_and_no_other():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    targets = [t for p in panels for t in p["targets"]]
    assert all(len({t["refId"] for t in p["targets"]}) == len(p["targets"]) for p in panels)
    used = {m for t in targets for m in re.findall(r"\bray_raybroker_\w+", t["expr"])}
    assert used <= scraped_names(), used - scraped_names()  # nothing it reads is missing
    assert {family(n) for n in used} == {family(n) for n in scraped_names()}  # each one shown
    # every panel reads through the chosen data source and filters by the chosen brokers
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    assert all('broker=~"$broker"' in t["expr"] for t in targets)
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "broker"}
