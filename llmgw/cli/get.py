"""`llmgw ctl get`: list things, or show the ones named, as kubectl does.

`get KIND` lists; `get KIND NAME...` shows those (`-o json`: one object, not
a list, when one is named); a name that is not there is exit 1 with the
names it may have meant. `-l` selects (selectors.py: labels, owner, class,
state, any plain field), `--sort-by` orders and `-o` also takes
`jsonpath=…` and `custom-columns=…` (output.py). Most kinds come from the
read models; who leads (leader) and what the catalog says (owners, apikeys,
policy) are read live from the log, the catalog folded from the operators'
events alone: exact, and no read model to keep (nor a key's hash in one).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import msgspec

from ..ctl import selectors, views
from ..ctl.config import CONFIG
from ..ctl.jsonpath import JsonPathError
from ..ctl.locate import Where
from ..ctl.output import Output, Watch, parse_output, render, sort_rows
from ..ctl.readmodels import ReadModels

LIVE = ("leader", "policy", "owners", "apikeys", "usage")  # read from the log, not the read models
GROWING = ("decisions", "preemptions")  # only ever grow: a watch prints those after the last shown
HAS_ENTITIES = {"models": "model", "replicas": "replica", "nodes": "node"}  # every name the log mentioned


def _selector(text: str):
    try:
        return selectors.parse(text)
    except selectors.SelectorError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_selector.__name__ = "selector"
parse_output.__name__ = "output"


def add_parser(verb, kind_type, timeout_help: str) -> None:
    """The `get` verb on ctl's subparsers (`verb(name, help)` makes one)."""
    get = verb("get", "list models, nodes, replicas, decisions, quotas, owners, API keys ...; or show those named")
    get.add_argument(
        "kind", type=kind_type(views.KINDS), metavar="KIND",
        help="models, nodes, replicas, decisions, quotas, preemptions, domains, owners, apikeys, leader, policy or usage "
        "(or singular, or mo, no, rs, dec, q, pre, dom, own, keys, lead, pol, use)",
    )  # fmt: skip
    get.add_argument(
        "names", nargs="*", metavar="NAME",
        help="only these (a replica's id, a model's or node's name; a decision's SEQ or SEQ.IDX); one: -o json "
        "prints the object itself",
    )  # fmt: skip
    get.add_argument(
        "-o", "--output", type=parse_output, default=Output("table"), metavar="FORMAT",
        help="table (fitted to the terminal), wide (every column, whole), name (kind/name), json or yaml "
        "(times also in ISO 8601 UTC, as *_iso), jsonpath=TEMPLATE (kubectl's: '{.items[*].name}', "
        "'{range .items[*]}{.id}{\"\\n\"}{end}') or custom-columns=HEADER:PATH,... (NAME:.id,STATE:.state)",
    )  # fmt: skip
    get.add_argument(
        "-l", "--selector", type=_selector, default=None, metavar="SELECTOR",
        help="only rows it holds for: key=value, key!=value, key in (a,b), key notin (a,b), key, !key; commas AND "
        "them. Keys: labels and location (nodes: rack=r4-12), owner, class (critical, standard, opportunistic), "
        "state, model, node, profile, name and any plain field",
    )  # fmt: skip
    get.add_argument(
        "--sort-by", metavar="PATH",
        help="order by this field or JSONPath, as -o json shows the rows (name, .placed_at, '{.labels.x}')",
    )
    get.add_argument("--no-headers", action="store_true", help="tables, wide and custom columns: no header line")
    get.add_argument("-w", "--watch", action="store_true", help="then print each change as it is projected (Ctrl-C ends)")
    get.add_argument("--model", help="only this model's replicas, decisions, preemptions or usage")
    get.add_argument("--owner", default="", help="usage: only this owner's keys and those of the owners under it")
    get.add_argument("--key", default="", help="usage: only this API key's (by its name)")
    get.add_argument(
        "--since", default="", metavar="TIME",
        help="usage: only what was reported since then: 30m, 24h, 7d (ago), 2026-12-05, 2026-12-05T10:00 (UTC)",
    )
    get.add_argument("--domain", metavar="KIND/NAME", help="nodes: only those in this facility domain (rack/r4-12)")
    get.add_argument("--limit", type=int, default=50, metavar="N", help="decisions, preemptions: the latest N (0: all)")
    get.add_argument("--timeout", type=float, default=CONFIG.catch_up_timeout_s, metavar="S", help=timeout_help)


# --------------------------------------------------------------------------- rows


def _listing(models: ReadModels, args, after: tuple[int, int] | None = None, *, limit: int | None = None) -> list[dict]:
    from . import facility as facility_cli

    limit = args.limit if limit is None else limit
    if args.kind == "models":
        return models.models()
    if args.kind == "nodes":
        rows = models.nodes()
        return [n for n in rows if facility_cli.in_domain(n, args.domain)] if args.domain else rows
    if args.kind == "domains":
        return models.domains()
    if args.kind == "replicas":
        return models.replicas(args.model)
    if args.kind == "quotas":
        return models.quotas()
    if args.kind == "preemptions":
        return models.preemptions(model=args.model, limit=0 if after else limit, after=after)
    return models.decisions(model=args.model, limit=0 if after else limit, after=after)


def _of_event(models: ReadModels, args, name: str) -> list[dict]:
    """A decision's or preemption's rows by SEQ (every one of that event) or SEQ.IDX."""
    from .ctl_errors import BAD_INPUT, CtlError

    seq, _, idx = name.partition(".")
    if not seq.isdigit() or (idx and not idx.isdigit()):
        raise CtlError(f"get: {name!r} is not a {views.SINGULAR[args.kind]}: give its event's SEQ, or SEQ.IDX", BAD_INPUT)
    read = models.decisions if args.kind == "decisions" else models.preemptions
    rows = read(model=args.model, limit=0, after=(int(seq) - 1, 1 << 30), before=int(seq))
    return [r for r in rows if not idx or r["idx"] == int(idx)]


def owners_rows(state) -> list[dict]:
    """Every owner the catalog defines or names (a model's or a key's owner
    with no entry of its own: no guarantee, no limit), with its models and keys."""
    named = {m.spec.owner for m in state.models.values()} | {k.owner for k in state.api_keys.values()}
    rows = []
    for name in sorted(set(state.owners) | {n for n in named if n}):
        owner = state.owners.get(name)
        rows.append({
            "name": name, "parent": name.rpartition("/")[0], "defined": owner is not None,
            "guarantee": msgspec.to_builtins(owner.guarantee) if owner else {},
            "limit": msgspec.to_builtins(owner.limit) if owner else {},
            # what its keys may ask of the gateways together (gateway/quota.py); 0: no limit
            "requests_per_minute": owner.requests_per_minute if owner else 0,
            "tokens_per_minute": owner.tokens_per_minute if owner else 0,
            "tokens_per_day": owner.tokens_per_day if owner else 0,
            "tokens_per_month": owner.tokens_per_month if owner else 0,
            "spend_per_day": owner.spend_per_day if owner else 0.0,
            "spend_per_month": owner.spend_per_month if owner else 0.0,
            "models": sorted(m for m, model in state.models.items() if model.spec.owner == name),
            "api_keys": sorted(k for k, key in state.api_keys.items() if key.owner == name),
        })  # fmt: skip
    return rows


def apikeys_rows(state) -> list[dict]:
    """Names, owners and limits: built field by field, so a key's hash is in no row, whatever ApiKey gains."""
    return [
        {"name": name, "owner": k.owner, "requests_per_minute": k.requests_per_minute,
         "tokens_per_minute": k.tokens_per_minute, "tokens_per_day": k.tokens_per_day, "tokens_per_month": k.tokens_per_month,
         "spend_per_day": k.spend_per_day, "spend_per_month": k.spend_per_month}
        for name, k in sorted(state.api_keys.items())
    ]  # fmt: skip


def classes(state) -> dict[str, dict]:
    """Each model's owner and class (priority), from the catalog: for -l owner=… and class=…."""
    return {name: {"owner": m.spec.owner, "class": m.spec.priority} for name, m in state.models.items()}


async def _live_catalog(where: Where):
    from .ctl_bus import _catalog, _connect

    bus = await _connect(where)
    try:
        state, latest = await _catalog(bus)
    finally:
        await bus.close()
    return state, latest


async def _live_rows(args, where: Where) -> tuple[list[dict], str]:
    """leader, policy, owners, apikeys: rows read live, and why the command fails after printing them ("" if not)."""
    if args.kind == "leader":
        return await _leader_rows(where)
    from ..core.contract.policy import DEFAULT, FIELDS

    if args.kind == "usage":
        return await _usage_rows(args, where), ""
    state, latest = await _live_catalog(where)
    if args.kind == "owners":
        return owners_rows(state), ""
    if args.kind == "apikeys":
        return apikeys_rows(state), ""
    seq = latest.get(("policy", ""), 0)
    return [{"field": f, "value": getattr(state.policy, f), "default": getattr(DEFAULT, f), "seq": seq} for f in FIELDS], ""


async def _usage_rows(args, where: Where) -> list[dict]:
    """The gateways' usage reports on the log, summed (ctl/usage.py), spend at the catalog's prices."""
    import time

    from ..core.contract import events as ev
    from ..ctl import deadline
    from ..ctl import usage
    from .ctl_bus import _catalog, _connect
    from .ctl_errors import BAD_INPUT, CtlError

    try:
        since = usage.parse_since(args.since, time.time()) if args.since else 0.0
    except ValueError as e:
        raise CtlError(f"get usage: {e}", BAD_INPUT) from None
    bus = await _connect(where)
    try:
        state, _ = await _catalog(bus)
        found = await deadline.retrying("a read of the usage", lambda: bus.read_matching("llmgw.gw.*.usage.reported"))
    finally:
        await bus.close()
    reports = []
    for _, _, data in found:
        try:
            e = ev.decode(data)
        except Exception:  # quarantined by the fold: not usage
            continue
        if isinstance(e, ev.UsageReported):
            reports.append(e)
    return usage.rows(reports, usage.prices_of(state), owner=args.owner, key=args.key, model=args.model or "", since=since)


async def _leader_rows(where: Where) -> tuple[list[dict], str]:
    """Who leads, in which term and since when, and how far behind each
    standby follows: live, from the lease bucket and the log's end."""
    import json

    from ..bus import LEASE_KEY
    from ..ctl import deadline
    from .ctl_bus import _connect

    bus = await _connect(where)
    try:
        entries = await deadline.retrying("about the lease", bus.read_lease)
        last = await deadline.retrying("about the log", bus.last_seq)
    finally:
        await bus.close()
    rows = []
    holder = json.loads(entries[LEASE_KEY]) if LEASE_KEY in entries else None
    if holder is not None:
        rows.append({"role": "leader", "id": holder["id"], "term": holder["term"], "since": holder.get("since", 0.0),
                     "seq": holder["seq"], "behind": max(0, last - holder["seq"])})
    for key, value in sorted(entries.items()):
        if key.startswith("standby."):
            s = json.loads(value)
            if holder is None or s["id"] != holder["id"]:
                rows.append({"role": "standby", "id": s["id"], "term": 0, "since": 0.0, "seq": s["seq"],
                             "behind": max(0, last - s["seq"])})
    return rows, "" if holder else "no control plane holds the lease now: nothing is decided until one does"


# --------------------------------------------------------------------------- choosing


class Pick:
    """What -l and the names keep of a listing, then --sort-by's order."""

    def __init__(self, args, about: dict[str, dict] | None) -> None:
        self.kind, self.names, self.about = args.kind, list(args.names), about
        self.selector, self.sort_by = args.selector, args.sort_by

    def __call__(self, rows: list[dict], *, sort: bool = True) -> list[dict]:
        rows = selectors.select(self.kind, rows, self.selector, self.about)
        if self.names:
            wanted = set(self.names)
            # A decision or preemption by SEQ.IDX, or every one of its event by SEQ.
            rows = [r for r in rows if views.key_of(self.kind, r) in wanted
                    or (self.kind in GROWING and str(r["seq"]) in wanted)]
        if self.sort_by and sort:
            rows = sort_rows(self.kind, rows, self.sort_by)
        elif self.names and self.kind not in GROWING:
            order = {n: i for i, n in enumerate(self.names)}  # as named, as kubectl shows them
            rows = sorted(rows, key=lambda r: order[views.key_of(self.kind, r)])
        return rows


def _missing(args, rows: list[dict], known: list[str]) -> str:
    """Why the names not found are not (with those they may have meant); "" when all are there."""
    from .ctl_errors import did_you_mean

    if args.kind in GROWING:
        return ""  # said per name as they are read
    have = {views.key_of(args.kind, r) for r in rows}
    gone = [n for n in args.names if n not in have]
    if not gone:
        return ""
    where = f" with {','.join(map(str, args.selector))}" if args.selector else ""
    return "; ".join(f"there is no {views.SINGULAR[args.kind]} {n}{where}{did_you_mean(n, known)}" for n in gone)


async def cmd_get(args, where: Where) -> int:
    from .ctl_bus import _fresh
    from .ctl_errors import BAD_INPUT, NOT_FOUND, OK, CtlError, say

    args.selector = args.selector or ()
    try:
        selectors.check(args.kind, args.selector)
    except selectors.SelectorError as e:
        raise CtlError(f"get: -l: {e}", BAD_INPUT)
    if args.domain:
        from ..core.folding.facility_facts import domain_problem

        problem = domain_problem(args.domain)
        if problem or args.kind != "nodes":
            raise CtlError(f"get: --domain: {problem or 'only nodes are listed by domain'}", BAD_INPUT)
    if args.watch and args.kind in LIVE:
        raise CtlError(f"get: --watch: {args.kind} are read live from the log, not watched; run it again", BAD_INPUT)
    width = views.terminal_width()
    status, failure, known = OK, "", []
    models = None
    if args.kind in LIVE:
        rows, failure = await _live_rows(args, where)
        known = [views.key_of(args.kind, r) for r in rows]
    else:
        fresh = await _fresh(where, args.timeout)
        models, status = fresh.models, fresh.status
        if args.kind in GROWING and args.names:
            rows = [r for n in args.names for r in _of_event(models, args, n)]
            failure = "; ".join(f"there is no {views.SINGULAR[args.kind]} {n}" for n in args.names
                                if not any(views.key_of(args.kind, r) == n or str(r["seq"]) == n for r in rows))
        else:
            # A selector picks among all, then --limit takes the latest: not the latest 50, then those.
            rows = _listing(models, args, limit=0 if args.selector else None)
        if args.kind in HAS_ENTITIES:
            known = models.names(HAS_ENTITIES[args.kind])
        else:
            known = [views.key_of(args.kind, r) for r in rows]
    about = await _about_models(args, where, models)
    pick = Pick(args, about)
    try:
        shown = pick(rows)
        if args.selector and args.kind in GROWING and args.limit and not args.names:
            shown = shown[-args.limit:]
        failure = failure or _missing(args, shown, known)
        if not args.watch:
            single = len(args.names) == 1 and len(shown) == 1
            text = render(args.kind, shown, args.output, headers=not args.no_headers, width=width, single=single)
            if text and (shown or not args.names):  # (all named missing: only the error, as kubectl)
                # A template's text as it is (kubectl's: its own {"\n"} ends the lines); the rest, a line each.
                print(text, end="" if args.output.format == "jsonpath" else "\n", flush=True)
            elif not shown and not args.names:
                say(f"no {args.kind}" + (f" with {','.join(map(str, args.selector))}" if args.selector else ""))
            if failure:
                raise CtlError(f"get: {failure}", NOT_FOUND)
            return status
        if failure:
            raise CtlError(f"get: {failure}", NOT_FOUND)
        assert models is not None
        return await _watch(args, models, pick, shown, width)
    except JsonPathError as e:
        raise CtlError(f"get: {e}", BAD_INPUT)


async def _about_models(args, where: Where, models: ReadModels | None) -> dict[str, dict] | None:
    """Each model's owner and class, when the kind's rows name a model: the
    owner from the read models, the class (which they do not keep) from the
    catalog on the log, read only when the selector asks for it."""
    if not args.selector or args.kind not in ("models", "replicas", "decisions", "preemptions"):
        return None
    if selectors.needs_classes(args.selector) or models is None:
        state, _ = await _live_catalog(where)
        return classes(state)
    return {m["name"]: {"owner": m["owner"]} for m in models.models()}


async def _watch(args, models: ReadModels, pick: Pick, rows: list[dict], width: int | None) -> int:
    """The listing, then each change as the read models move (Ctrl-C ends)."""
    from .ctl_bus import _lift_deadline
    from .ctl_errors import say

    watch = Watch(args.kind, args.output, headers=not args.no_headers, width=width)
    text = watch.first(rows)
    if text:
        print(text, flush=True)
    if not rows:  # nothing on stdout yet for a tool: say on stderr that it runs
        say(f"no {args.kind} yet; watching for changes (Ctrl-C ends)")
    _lift_deadline()  # what was asked for in time is shown; the watch runs until Ctrl-C
    # Follow: the rows are read again whenever the read models move, and what
    # differs is printed. Decisions and preemptions only ever grow: those
    # after the last one shown are the change (never the older ones --limit left out).
    growing = args.kind in GROWING
    seen = {views.key_of(args.kind, r): r for r in rows}
    last = max(((r["seq"], r["idx"]) for r in rows), default=(models.position(), 1 << 30)) if growing else None
    position = models.position()
    while True:
        await asyncio.sleep(CONFIG.watch_interval_s)
        now = models.position()
        if now == position:
            continue
        position = now
        if growing:
            for row in _listing(models, args, after=last):
                last = max(last, (row["seq"], row["idx"]))
                if pick([row], sort=False):
                    print(watch.change("ADDED", row))
            sys.stdout.flush()
            continue
        current = {views.key_of(args.kind, r): r for r in pick(_listing(models, args), sort=False)}
        for key, row in current.items():
            if key not in seen:
                print(watch.change("ADDED", row))
            elif seen[key] != row:
                print(watch.change("MODIFIED", row))
        for key, row in seen.items():
            if key not in current:
                print(watch.change("DELETED", row))
        sys.stdout.flush()
        seen = current
