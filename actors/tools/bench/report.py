"""The benchmark report: one shape for every scenario (DESIGN.md §10a), as JSON and as a table."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from actors.model import checks


@dataclass
class Row:
    system: str
    variant: str
    messages_per_s: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    cpu_s_per_1k: float | None = None
    notes: str = ""
    # whether every message arrived once and in order (None: not checked in this row)
    lost: int | None = None
    doubled: int | None = None
    out_of_order: int | None = None
    # the durability class the row ran at ("none", "default", "power-safe"); None: not a peer row
    durability: str | None = None
    runs: list[float] | None = None  # messages/s of each measured run; the row is their median
    # the rows of the same report this row is compared with: [system, variant, words] each; the
    # ratios go first in its notes, computed from the figures the report ends with (a report of
    # several runs: the medians, so ratio and figures agree), by `with_ratios`
    vs: list[list[str]] | None = None
    # `bench peers` and `bench mirror`: the system's own processes' part of `cpu_s_per_1k` (the
    # broker actor's, both mirror partners', the server's), without the harness's clients; None
    # where the system has no process of its own (raw SQLite runs in its clients) or in other
    # scenarios
    server_cpu_s_per_1k: float | None = None


Progress = Callable[[str], None]


@dataclass(frozen=True)
class Load:
    """What a scenario sends: `messages` over `dialogs`, `batch` messages per call. Messages
    round down to whole batches (at least one)."""

    messages: int = 200_000
    dialogs: int = 100
    batch: int = 1000

    def __post_init__(self) -> None:
        for name in ("messages", "dialogs", "batch"):
            checks.whole(name, getattr(self, name), least=1)
        whole_batches = max(self.batch, self.messages // self.batch * self.batch)
        object.__setattr__(self, "messages", whole_batches)


DEFAULT_LOAD = Load()


@dataclass
class Report:
    scenario: str
    params: dict[str, Any]
    rows: list[Row] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "params": self.params,
            "rows": [asdict(r) for r in self.rows],
        }

    def write_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.as_dict(), f, indent=2)

    def table(self) -> str:
        server = any(r.server_cpu_s_per_1k is not None for r in self.rows)  # peers, mirror
        head = ("system", "variant", "msg/s", "p50 ms", "p99 ms", "cpu s/1k")
        head += ("server s/1k", "notes") if server else ("notes",)
        lines = [head]
        for r in self.rows:
            line = (
                r.system,
                r.variant,
                f"{r.messages_per_s:,.0f}",
                _num(r.p50_ms),
                _num(r.p99_ms),
                _num(r.cpu_s_per_1k, 4),
            )
            line += (_num(r.server_cpu_s_per_1k, 4), r.notes) if server else (r.notes,)
            lines.append(line)
        widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
        out = [
            f"scenario {self.scenario}: " + ", ".join(f"{k}={v}" for k, v in self.params.items())
        ]
        for n, line in enumerate(lines):
            out.append("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)))
            if n == 0:
                out.append("  ".join("-" * w for w in widths))
        return "\n".join(out)


def median_row(runs: list[Row]) -> Row:
    """The median run of one (system, variant) as its row: that run's figures, every run's rate
    in `runs`, and the notes saying so with the spread ((max - min) / median). A run that
    failed (0 msg/s) counts as one, so a flaky system cannot hide behind its best run."""
    if len(runs) == 1:
        return replace(runs[0], runs=[runs[0].messages_per_s])
    rates = [r.messages_per_s for r in runs]
    median = sorted(runs, key=lambda r: r.messages_per_s)[(len(runs) - 1) // 2]
    spread = (max(rates) - min(rates)) / median.messages_per_s if median.messages_per_s else 0.0
    shown = ", ".join(f"{x:,.0f}" for x in rates)
    note = f"median of {len(runs)} runs ({shown} msg/s; spread {spread:.0%})"
    problems = [r.notes for r in runs if r is not median and "failed" in r.notes]
    notes = "; ".join(x for x in (median.notes, note, *problems[:1]) if x)
    return replace(median, notes=notes, runs=rates)


def with_ratios(rows: list[Row]) -> list[Row]:
    """Each row with its ratios to the rows it names in `vs`, first in its notes."""
    by = {(r.system, r.variant): r for r in rows}
    out = []
    for row in rows:
        ratios = []
        for system, variant, words in row.vs or ():
            base = by.get((system, variant))
            if base is not None and base.messages_per_s:
                ratios.append(f"{row.messages_per_s / base.messages_per_s:.2f}x {words}")
        notes = "; ".join(x for x in (", ".join(ratios), row.notes) if x)
        out.append(replace(row, notes=notes) if ratios else row)
    return out


def median_report(reports: list[Report]) -> Report:
    """Reports of the same scenario, run one after another, as one: each row the median of its
    runs (rows matched by system, variant and durability, in the first report's order)."""
    first = reports[0]
    key = lambda r: (r.system, r.variant, r.durability)  # noqa: E731
    runs: dict[tuple, list[Row]] = {}
    for report in reports:
        for row in report.rows:
            runs.setdefault(key(row), []).append(row)
    params = {**first.params, "repeats": len(reports)}
    return Report(
        first.scenario, params, with_ratios([median_row(runs[key(r)]) for r in first.rows])
    )


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]
