"""How a dry run (core/simulation/whatif.py) reads: for people, a diff of what the file
changes and the decisions in the order they would happen; for tools, JSON."""

from __future__ import annotations

import msgspec

from ..core.simulation.whatif import DryRun
from ..text import table


def _value(v) -> str:
    if v is None:
        return "(none)"
    if isinstance(v, float):
        return format(v, "g")
    if isinstance(v, (list, dict)):
        return msgspec.json.encode(v).decode()
    return str(v)


def _amount(r) -> str:
    return f"{r.gpus} GPUs, {r.cpu_cores} cores, {r.memory_gb:g} GB"


def render(report: DryRun, what: str, output: str = "text") -> str:
    if output == "json":
        return msgspec.json.encode(report).decode()
    out = [f"dry run of {what} on the log at sequence {report.basis}: nothing is published"]
    if report.changes:
        out.append("\nCHANGES")
        for c in report.changes:
            out.append(f"{c.kind} {c.name}".rstrip() + f" {c.verb}")
            for f in c.fields:
                out.append(f"  {f.field}: {_value(f.before)} → {_value(f.after)}")
    out.append("\nWHAT WOULD HAPPEN (simulated seconds from now)")
    if report.happenings:
        rows = []
        for h in report.happenings:
            what = h.what
            if h.shards:
                what += f" [{', '.join(h.shards)}]"
            rows.append([f"+{h.after_s:g}s", h.kind, what, h.reason])
        out.append(table(rows, ["AFTER", "KIND", "WHAT", "REASON"]))
    else:
        out.append("nothing: the fleet stays as it is")
    out.append("\nMODELS")
    out.append(table([[m.model, f"{m.ready_before} → {m.ready_after}", m.waiting] for m in report.models],
                     ["MODEL", "READY NOW → AFTER", "WAITING AFTER"]))
    if report.owners_past_guarantee:
        out.append("\nOWNERS THAT WOULD GO PAST THEIR GUARANTEE")
        out.append(table([[o.owner, _amount(o.guarantee), _amount(o.before), _amount(o.after)]
                          for o in report.owners_past_guarantee], ["OWNER", "GUARANTEE", "HOLDS NOW", "WOULD HOLD"]))
    how = "settled" if report.settled else "NOT settled (stopped)"
    out.append(f"\n{how} after {report.passes} pass(es), {report.after_s:g}s of simulated time")
    return "\n".join(out)
