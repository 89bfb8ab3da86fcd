"""`raybroker verify`'s report: the JSON document and the summary table. Pure."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actors.tools.verify.checker import Verdict


def handlers_seen(states: Sequence[bytes | None]) -> dict[str, int]:
    """What the receiving handlers committed, from their groups' states (see handlers.echo_id)."""
    seen = bad = 0
    for raw in states:
        if raw:
            s = json.loads(raw)
            seen += s["count"]
            bad += s["bad"]
    return {"seen": seen, "out_of_sequence": bad}


def build(
    *,
    planned: int,
    verdict: Verdict,
    faults: list[dict[str, Any]],
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The report: the required keys first (messages, lost, doubled, out_of_order, faults), then
    the detail; `passed` says whether every check held."""
    v = verdict.as_dict()
    out: dict[str, Any] = {
        "messages": v["messages"],
        "lost": v["lost"],
        "doubled": v["doubled"],
        "out_of_order": v["out_of_order"],
        "faults": faults,
        "planned": planned,
        "unsent": max(0, planned - v["messages"]),
        "delivered": v["delivered"],
        "unexpected": v["unexpected"],
        **extra,
        **{k: v[k] for k in ("lost_ids", "doubled_ids", "out_of_order_ids", "unexpected_ids")},
    }
    out["failures"] = failures(out)
    out["passed"] = not out["failures"]
    return out


def failures(r: Mapping[str, Any]) -> list[str]:
    """Every check that did not hold, in words."""
    out = []
    for key in ("lost", "doubled", "out_of_order", "unexpected"):
        if r[key]:
            out.append(f"{r[key]} {key.replace('_', ' ')}")
    if r["unsent"]:
        out.append(f"{r['unsent']} of {r['planned']} messages never sent")
    out += [
        f"fault {f['kind']} on {f['target']}: no recovery seen"
        for f in r["faults"]
        if f["recovered_s"] is None
    ]
    if r.get("malformed_not_refused_count"):
        out.append(f"{r['malformed_not_refused_count']} malformed send(s) not refused as expected")
    handlers = r.get("handlers")
    if handlers and handlers["out_of_sequence"]:
        out.append(f"handlers saw {handlers['out_of_sequence']} message(s) out of sequence")
    if handlers and handlers["seen"] != r["messages"]:
        out.append(f"handlers committed {handlers['seen']} messages, not {r['messages']}")
    if r.get("settled") is False:
        out.append("messages still waited somewhere at the end (not settled)")
    if r.get("dialog_errors"):
        out.append(f"{len(r['dialog_errors'])} Error/EndDialog message(s) came back")
    if (r.get("checker_self_test") or {}).get("caught") is False:
        out.append("the checker missed a loss, double or inversion put into its input on purpose")
    out += [f"error: {e}" for e in r.get("errors", ())]
    if r.get("timed_out"):
        out.append("timed out")
    return out


def table(r: Mapping[str, Any]) -> list[str]:
    """The summary, one line each."""
    rows = [
        ("seed", f"{r.get('seed')}"),
        ("messages sent and checked", f"{r['messages']:,} of {r['planned']:,}"),
        ("replies committed", f"{r['delivered']:,}"),
        ("malformed sends refused", f"{r.get('refused', 0):,}"),
    ]
    for f in r["faults"]:
        rec = "not seen" if f["recovered_s"] is None else f"{f['recovered_s']:.2f}s"
        at = "not injected" if f["at_s"] is None else f"at {f['at_s']:.1f}s"
        rows.append((f"fault {f['kind']}", f"{f['target']} {at}, recovered {rec}"))
    rows += [
        ("lost", f"{r['lost']}"),
        ("doubled", f"{r['doubled']}"),
        ("out of order", f"{r['out_of_order']}"),
        ("checker self-test", self_test_line(r.get("checker_self_test"))),
        ("elapsed", f"{r.get('elapsed_s', 0):.1f}s"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = ["", "raybroker verify: summary", *(f"  {k.ljust(width)}  {v}" for k, v in rows)]
    verdict = (
        "every message once, in order" if r["passed"] else "FAILED: " + "; ".join(r["failures"])
    )
    lines.append(f"  {'result'.ljust(width)}  {verdict}")
    return lines


def self_test_line(t: Mapping[str, Any] | None) -> str:
    if not t:
        return "not run"
    if t["caught"] is None:
        return f"skipped: {t['skipped']}"
    kinds = ", ".join(d["kind"] for d in t["injected"])
    return f"{'caught' if t['caught'] else 'MISSED'} {kinds} put into its input"


def show(r: Mapping[str, Any], progress: Callable[[str], None]) -> None:
    for line in table(r):
        progress(line)
