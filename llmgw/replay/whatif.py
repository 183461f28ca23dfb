"""`llmgw replay --what-if CATALOG`: the recorded history decided again
under another catalog and policy (core/simulation/redecide.py), as a report."""

from __future__ import annotations

import msgspec

from ..core.simulation.redecide import Figures, Plan, Report
from ..ctl.catalog_file import Catalog
from ..text import table, when

# The figures of the side-by-side table, in order: (label, field, unit).
ROWS = (
    ("first ready", "first_ready_s", "s"),
    ("waiting", "waiting_s", "s"),
    ("replicas placed", "placed", ""),
    ("replicas preempted", "preempted", ""),
    ("restarts refused", "restarts_refused", ""),
    ("GPU-hours held", "gpu_hours", ""),
    ("queued while none served", "queued_request_s", " req·s"),
    ("GPUs held at the end", "gpus_at_end", ""),
)


def plan_of(catalog: Catalog) -> Plan:
    """The sections the file has replace the log's; those it has not, the log's stand."""
    return Plan(
        models={m.name: m for m in catalog.models} if "models" in catalog.given else None,
        owners={o.name: o for o in catalog.owners} if "owners" in catalog.given else None,
        policy=catalog.policy,
    )


def _v(x, unit: str) -> str:
    if x is None:
        return "never"
    return f"{x:g}{unit}" if isinstance(x, float) else f"{x}{unit}"


def _delta(a, b, unit: str) -> str:
    if a == b:
        return ""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        d = round(b - a, 6)
        return f"{d:+g}{unit}"
    return "≠"


def render(report: Report, what: str, as_json: bool = False) -> str:
    if as_json:
        return msgspec.json.encode(report).decode() + "\n"
    out = [
        f"what-if {what}: sequences {report.first_seq}..{report.last_seq} "
        f"({when(report.start_at)} to {when(report.end_at)} UTC, {report.events} events); "
        f"{report.passes} pass(es) decided, {report.followed} as recorded",
    ]
    rows = []
    for m in report.models:
        for label, field, unit in ROWS:
            a, b = getattr(m.recorded, field), getattr(m.what_if, field)
            rows.append([m.model, label, _v(a, unit), _v(b, unit), _delta(a, b, unit)])
        for side, f in (("recorded", m.recorded), ("what-if", m.what_if)):
            for w in f.waiting_reasons:
                rows.append([m.model, f"  waited ({side})", f"{w.seconds:g}s", "", w.reason])
    out.append(table(rows, ["MODEL", "FIGURE", "RECORDED", "WHAT-IF", "DIFFERENCE"]) if rows else "no model in this window")
    free = report.gpus_free_at_end
    out.append(f"GPUs free at the end: recorded {free[0]}, what-if {free[1]} (of {report.gpus})")
    d = report.diverged
    if d is None:
        out.append("no decision diverged: every pass was the recorded one")
    else:
        out.append(f"\nFIRST DECISION THAT DIVERGED: at {when(d.at)} UTC (before sequence {d.seq})")
        rec_at = f" (at {when(d.recorded_at)} UTC)" if d.recorded_at is not None and d.recorded_at != d.at else ""
        out.append(f"  recorded{rec_at}: " + ("; ".join(d.recorded) or "(nothing)"))
        out.append("  what-if: " + ("; ".join(d.what_if) or "(nothing)"))
    out.append("no difference" if report.same else "differences: see above")
    return "\n".join(out) + "\n"


__all__ = ["Figures", "plan_of", "render"]
