"""`llmgw replay`: the state at any moment, the history of one thing, and
`--verify`, from the live log or from a file with no NATS at all."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence

import msgspec

from ..ctl.exits import Exit
from ..core.contract import events as ev
from ..core.folding.fold import apply
from ..core.simulation.history import Entity, Record, history, summary, verify
from ..core.folding.state import State
from ..text import table, when
from . import logfile


class _At(msgspec.Struct):
    at: float = 0.0


_at = msgspec.json.Decoder(_At)


def parse_at(text: str, flag: str = "--at") -> tuple[str, float]:
    """--at takes a sequence (an integer) or a time (ISO 8601, or Unix seconds with a dot)."""
    if text.isdigit():
        return "seq", float(text)
    try:
        return "time", float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        print(f"llmgw replay: {flag} {text!r}: give a sequence number, Unix seconds or an ISO 8601 time", file=sys.stderr)
        raise SystemExit(Exit.BAD_INPUT) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return "time", when.timestamp()


def fold_until(records: Sequence[Record], at: tuple[str, float] | None) -> State:
    state = State()
    for seq, subject, data in records:
        if at is not None:
            kind, limit = at
            if kind == "seq" and seq > limit:
                break
            if kind == "time":
                try:
                    if _at.decode(data).at > limit:
                        break
                except msgspec.MsgspecError:
                    pass
        apply(state, seq, subject, data)
    return state


def state_json(state: State) -> dict:
    return msgspec.to_builtins(state)


def render_state(state: State) -> str:
    out = [f"state at sequence {state.seq}"]
    out.append("\nNODES")
    out.append(
        table(
            [
                [n.name, n.state, f"{len(n.used)}/{len(n.gpus)}", str(len(n.strays)), n.reason]
                for n in sorted(state.nodes.values(), key=lambda n: n.name)
            ],
            ["NODE", "STATE", "GPUS USED", "STRAYS", "REASON"],
        )
    )
    out.append("\nMODELS")
    rows = []
    for name in sorted(state.models):
        m = state.models[name]
        reps = [r for r in state.replicas.values() if r.model == name]
        ready = sum(r.state == "ready" for r in reps)
        rows.append([name, str(m.spec.min_replicas), str(len(reps)), str(ready), m.waiting])
    out.append(table(rows, ["MODEL", "MIN", "REPLICAS", "READY", "WAITING"]))
    out.append("\nREPLICAS")
    out.append(
        table(
            [
                [
                    r.id,
                    r.model,
                    r.profile,
                    r.state,
                    ",".join(f"{s.node}:{'+'.join(map(str, s.gpus))}" for s in r.shards),
                    r.reason,
                ]
                for r in sorted(state.replicas.values(), key=lambda r: r.id)
            ],
            ["REPLICA", "MODEL", "PROFILE", "STATE", "SHARDS", "REASON"],
        )
    )
    if state.quarantine_count:
        out.append(f"\nQUARANTINED: {state.quarantine_count} event(s)")
        out.append(table([[str(q.seq), q.subject, q.error] for q in state.quarantined], ["SEQ", "SUBJECT", "ERROR"]))
    if state.voided_count:
        out.append(f"\nVOIDED DECISIONS: {state.voided_count}")
        out.append(table([[str(v.seq), v.action, v.reason] for v in state.voided], ["SEQ", "ACTION", "WHY"]))
    return "\n".join(out)


def _at_of(data: bytes) -> float | None:
    try:
        return _at.decode(data).at
    except msgspec.MsgspecError:
        return None


def window_problem(records: Sequence[Record], bounds) -> str:
    """Why a --from or --to (each: flag, as given, parsed) lies past the log's
    end, or the window is empty; "" when it is within the log."""
    if not records:
        return "the log is empty: there is nothing to decide again"
    last_seq = records[-1][0]
    times = [t for t in (_at_of(d) for _, _, d in reversed(records)) if t]
    last_at = times[0] if times else 0.0
    ends = f"the log ends at event {last_seq}" + (f", {when(last_at)} UTC" if last_at else "")
    for flag, given, at in bounds:
        if at is None:
            continue
        kind, value = at
        if (kind == "seq" and value > last_seq) or (kind == "time" and value > last_at):
            return f"{flag} {given} is past the end of the log ({ends}): give a sequence or a time within it"
    (_, from_given, start), (_, to_given, end) = bounds
    if start is not None and end is not None and start[0] == end[0] and start[1] > end[1]:
        return f"--from {from_given} is after --to {to_given}: the window holds nothing"
    return ""


def _json(data) -> str:
    """--json: times as the log has them (Unix seconds) and, beside each, in ISO 8601 UTC (`*_iso`), as `llmgw ctl` prints them."""
    from ..ctl.views import with_iso_times

    return msgspec.json.encode(with_iso_times(msgspec.to_builtins(data))).decode() + "\n"


def _what_if(records: Sequence[Record], args) -> int:
    from ..core.simulation.redecide import what_if
    from ..ctl.catalog_file import CatalogError, load_catalog
    from . import whatif

    try:
        catalog = load_catalog(args.what_if)
    except CatalogError as e:
        print(f"llmgw replay: --what-if: {e}", file=sys.stderr)
        return Exit.BAD_INPUT
    start = parse_at(args.from_, "--from") if args.from_ else None
    end = parse_at(args.to, "--to") if args.to else None
    problem = window_problem(records, (("--from", args.from_, start), ("--to", args.to, end)))
    if problem:
        # Before, a window past the end folded nothing and printed 1970 dates and zeros (issue 34).
        print(f"llmgw replay: {problem}", file=sys.stderr)
        return Exit.BAD_INPUT
    report = what_if(records, whatif.plan_of(catalog), start, end, ready_after=args.ready_after)
    sys.stdout.write(whatif.render(report, args.what_if, as_json=args.json))
    return Exit.OK if report.same else Exit.NOT_AS_WANTED


def run(records: Sequence[Record], args) -> int:
    """Carry out one `llmgw replay` invocation on the records; returns the exit code."""
    out = sys.stdout
    if args.export:
        n = logfile.write(args.export, records)
        print(f"wrote {n} events to {args.export}", file=sys.stderr)
        return 0
    if getattr(args, "what_if", None):
        return _what_if(records, args)
    at = parse_at(args.at) if args.at else None
    about: Entity | None = None
    for kind in ("model", "replica", "node"):
        if getattr(args, kind):
            about = (kind, getattr(args, kind))
    if args.verify:
        checked, diffs = verify(records)
        if args.json:
            out.write(_json({"checked": checked, "differences": diffs}))
        else:
            for d in diffs:
                out.write(f"seq {d.seq} (decided on {d.basis} at {when(d.at)}):\n")
                out.write(f"  recorded:      {'; '.join(d.recorded) or '(nothing)'}\n")
                out.write(f"  decided again: {'; '.join(d.decided_again) or '(nothing)'}\n")
            out.write(f"{checked} decision(s) checked, {len(diffs)} differ\n")
        return Exit.NOT_AS_WANTED if diffs else Exit.OK
    if about is not None:
        limit = at[1] if at and at[0] == "seq" else None
        items = [(s, e) for s, e in history(records, about) if limit is None or s <= limit]
        if args.json:
            rows = [{"seq": s, "event": msgspec.to_builtins(e), "summary": summary(e, about)} for s, e in items]
            out.write(_json(rows))
        else:
            out.write(
                table(
                    [[str(s), when(e.at), ev.tag_of(type(e)), summary(e, about)] for s, e in items],
                    ["SEQ", "TIME (UTC)", "EVENT", "WHAT"],
                )
                + "\n"
            )
        return 0
    state = fold_until(records, at)
    if args.quarantined:
        rows = [msgspec.to_builtins(q) for q in state.quarantined]
        if args.json:
            out.write(_json({"count": state.quarantine_count, "last": rows}))
        else:
            out.write(f"{state.quarantine_count} quarantined event(s)\n")
            out.write(table([[str(q.seq), q.subject, q.error] for q in state.quarantined], ["SEQ", "SUBJECT", "ERROR"]) + "\n")
        return 0
    if args.json:
        out.write(_json(state_json(state)))
    else:
        out.write(render_state(state) + "\n")
    return 0
