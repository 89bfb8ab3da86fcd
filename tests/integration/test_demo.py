"""The demo, `raybroker demo`, through the command line's entry point: on the session's Ray and
with its Spark session, which the demo uses as it uses any Spark on Ray already running in its
process (a fresh Ray and Spark of its own are what the verify and bench peers commands start)."""

from __future__ import annotations

import re

import pytest

from actors.tools.cli import main


@pytest.mark.slow
def test_the_demo_routes_every_order_line_to_its_region_and_back_once_in_order(spark, capsys):
    assert main(["demo", "--orders", "200", "--steady-s", "3"]) == 0
    out = capsys.readouterr().out
    summary = dict(
        re.split(r"\s{2,}", line.strip(), maxsplit=1)
        for line in out.split("sales by region: summary", 1)[1].splitlines()
        if line.strip()
    )
    assert (summary["lost"], summary["doubled"], summary["out of order"]) == ("0", "0", "0")
    # 200 orders at full load, then as many as 3 s at the steady rate take, 3 lines each
    steady = re.fullmatch(r"([\d,]+) lines in [\d.]+s: [\d,]+ messages/s there and back",
                          summary["steady rate"])  # fmt: skip
    lines = 600 + int(steady[1].replace(",", ""))
    assert summary["full load"].startswith("600 lines in ")
    assert summary["order lines sent"] == f"{lines:,} of {lines:,} rows"
    assert summary["replies back at the shop"] == f"{lines:,}"
    # order n goes to region n % 3: a third of the orders each, give or take one
    regions = [int(summary[f"lines at Sales{r}"].replace(",", "")) for r in ("EU", "US", "APAC")]
    assert sum(regions) == lines and max(regions) - min(regions) <= 3
    assert re.fullmatch(r"p50 [\d,]+ ms, p99 [\d,]+ ms", summary["latency at steady rate"])
    # where that latency goes: the four hops of an order and its reply, in the order they happen
    hops = re.findall(r"(\w+) \((\w+)\) [\d,]+ \+ [\d,]+", summary["by hop, in transit + queued"])
    assert hops == [("RouterQueue", "Order"), ("SalesQ", "Order"), ("RouterQueue", "Reply"),
                    ("StoreQ", "Reply")]  # fmt: skip
    assert summary["result"] == "every line once, in order, both ways"
    # start-up apart from the pipeline's figures; a live line while the orders go out
    assert re.fullmatch(r"Ray [\d.]+s, deploy [\d.]+s, Spark [\d.]+s, first use [\d.]+s",
                        summary["start-up"])  # fmt: skip
    assert "rows sent 600/600" in out and ", replies 600, lag 0" in out
    assert f"replies {lines - 600:,}, lag 0" in out
    # the Spark session was the running one, and it is still running after the demo
    assert spark.range(3).count() == 3
