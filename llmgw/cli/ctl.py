"""`llmgw ctl`: the operator's commands.

Reads come from the SQLite read models (`get`, `describe`); changes are
events published on the log (`apply`, `delete`, `restart`, `retry`). Every
change returns once the read models include the event it published, so a
`get` after it shows the change (read-your-writes); with `--wait` it returns
once the change took effect in the fleet (placed and ready; gone; replaced),
showing progress, or fails (exit 5) saying why not.

Exit status: one table for every command, llmgw/cli/exits.py.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import sys
import time
import uuid
from collections.abc import Callable
from typing import NamedTuple

import msgspec

from ..bus import read_log
from ..bus.msgids import MsgIds
from ..core import events as ev
from ..core.fold import apply
from ..core.state import State
from ..ctl import deadline, loadfold, views
from ..ctl.catalog_file import CatalogError, items, load_catalog
from ..ctl.config import CONFIG
from ..ctl.locate import Where, locate
from ..ctl.progress import Progress
from ..ctl.readmodels import NoReadModels, ReadModels
from . import facility as facility_cli
from . import get as get_cli
from . import node_ctl
from .exits import Exit

OK, NOT_FOUND, BAD_INPUT, UNREACHABLE, BEHIND, NOT_AS_WANTED = (
    Exit.OK, Exit.NOT_FOUND, Exit.BAD_INPUT, Exit.UNREACHABLE, Exit.BEHIND, Exit.NOT_AS_WANTED,
)  # fmt: skip
WATCH_INTERVAL_S = CONFIG.watch_interval_s


class CtlError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def did_you_mean(name: str, known) -> str:
    """ ' (did you mean x?)' for a name close to known ones, else ''."""
    close = difflib.get_close_matches(name, list(known), n=CONFIG.suggest_count, cutoff=CONFIG.suggest_cutoff)
    if not close:
        return ""
    return f" (did you mean {' or '.join(close)}?)"


def kind_type(allowed: tuple[str, ...]) -> Callable[[str], str]:
    """An argparse type: a kind by any of its names (plural, singular, short), as its plural."""

    def parse(text: str) -> str:
        kind = views.ALIASES.get(text.lower())
        if kind in allowed:
            return kind
        names = [n for k in allowed for n in (k, *views.KIND_NAMES[k])]
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a kind here{did_you_mean(text.lower(), names)}; "
            f"give one of {', '.join(f'{k} ({views.SINGULAR[k]}, {views.KIND_NAMES[k][1]})' for k in allowed)}"
        )

    parse.__name__ = "kind"
    parse.completions = [n for k in allowed for n in (k, *views.KIND_NAMES[k])]  # type: ignore[attr-defined]
    return parse


CATALOG_KINDS = {
    "model": ("models", "mo"), "owner": ("owners",), "apikey": ("apikeys", "api-key", "api-keys", "key", "keys"),
}  # fmt: skip


def _catalog_kind(text: str) -> str:
    """What `delete` removes, by any of its names."""
    for kind, names in CATALOG_KINDS.items():
        if text.lower() in (kind, *names):
            return kind
    every = [n for kind, names in CATALOG_KINDS.items() for n in (kind, *names)]
    raise argparse.ArgumentTypeError(f"{text!r} is not model, owner or apikey{did_you_mean(text.lower(), every)}")


_catalog_kind.completions = list(CATALOG_KINDS)  # type: ignore[attr-defined]


def _examples(*lines: str) -> list[str]:
    return [f"llmgw ctl {line}" for line in lines]


# Per command: its description and examples (see llmgw/cli/main.py, which shows them in --help).
ABOUT = {
    "ctl": (
        "Operate the fleet: publish a catalog, read what runs, restart, retry, read an engine's log.\n"
        "Reads come from the read models (SQLite, kept by the projector that llmgw up runs); every change\n"
        "returns once the read models include it (read-your-writes), and with --wait once it took effect.\n"
        "The local llmgw up is found by itself (.llmgw/up.json here or in a folder above); elsewhere give\n"
        "--nats URL (or $LLMGW_NATS) and --db PATH (or $LLMGW_DB).\n\n"
        "kinds: models (model, mo), nodes (node, no), replicas (replica, rs), decisions (decision, dec),\n"
        "quotas (quota, q), preemptions (preemption, pre), domains (domain, dom), owners (owner, own),\n"
        "apikeys (apikey, keys), leader (lead), policy (pol). Shell completion: `llmgw completion bash|zsh|fish`",
        _examples("get replicas", "get rs -o wide", "get decisions --watch --limit 3",
                  "apply -f deploy/catalog.cpu.yaml --wait", "describe replica smollm2-1"),
    ),
    "ctl apply": (
        "Publish the models, owners, API keys and policy of a catalog file that changed. A file with an error\n"
        "names the file, line and field of every error and publishes nothing. Returns once the read models\n"
        "include the change; with --wait, once every model of the file is placed and ready (or says why not).\n"
        "With --dry-run, publishes nothing and prints what the file changes (before → after) and what the\n"
        "control plane would then decide, in order, until the fleet settles.",
        _examples("apply -f deploy/catalog.cpu.yaml", "apply -f catalog.yaml --wait --timeout 600",
                  "apply -f catalog.yaml --dry-run", "apply -f catalog.yaml --dry-run -o json --ready-after 30"),
    ),
    "ctl delete": (
        "Remove a model (its replicas are drained and stopped), an owner or an API key from the catalog.\n"
        "With --wait, a model's return waits until its replicas are gone.",
        _examples("delete model qwen-8b --wait", "delete apikey team-a"),
    ),
    "ctl get": (
        "List things from the read models: models, nodes, replicas, decisions, quotas, preemptions or domains;\n"
        "and, live from the log, the catalog's owners and API keys (names, owners, limits; never a hash), who\n"
        "leads (leader) and the numbers the rules decide with (policy, beside their defaults). With names, only\n"
        "those (-o json: one object itself). Kinds go by any of their names (plural, singular or short: mo, no,\n"
        "rs, dec, q, pre, dom, own, keys, lead, pol). -l selects (labels, owner, class, state, any field),\n"
        "--sort-by orders, -o also takes jsonpath=TEMPLATE and custom-columns=HEADER:PATH,... as kubectl does\n"
        "(a listing is {\"kind\": \"List\", \"items\": [...]}, the rows as -o json shows them). It first waits (up\n"
        "to --timeout) for the read models to reach the end of the log. Tables fit the terminal; -o wide shows\n"
        "all of them.",
        _examples("get replicas", "get replica smollm2-1 -o yaml", "get rs --model smollm2 -o wide", "get no -o name",
                  "get rs -l state=ready,owner=org/team", "get mo -l 'class in (critical,standard)'",
                  "get no -l rack=r4-12", "get rs --sort-by .placed_at",
                  "get rs -o jsonpath='{range .items[*]}{.id}{\"\\t\"}{.state}{\"\\n\"}{end}'",
                  "get rs -o custom-columns=ID:.id,NODE:.nodes[0],STATE:.state", "get decisions --limit 10",
                  "get dec --watch", "get models --watch -o json", "get owners", "get apikeys",
                  "get replicas --no-headers | wc -l", "get policy"),
    ),
    "ctl describe": (
        "One model, replica or node: its state now and its history, every decision with its reason.",
        _examples("describe model smollm2", "describe rs smollm2-1", "describe node gpu-1 -o yaml"),
    ),
    "ctl restart": (
        "Replace replicas with new ones: each beside itself first (surge), then drained; or stopped first\n"
        "(--in-place). With --wait, returns once they are replaced and their models ready again.",
        _examples("restart qwen-8b-1 qwen-8b-2 --max-surge 1", "restart smollm2-1 --in-place --wait",
                  "restart qwen-8b-1 --dry-run"),
    ),
    "ctl retry": (
        "Try again a model parked after its replicas kept failing to start (fix the cause first: its\n"
        "`describe` says what failed). With --wait, returns once it is placed and ready.",
        _examples("retry qwen-8b --wait"),
    ),
    "ctl logs": (
        "The engine log of a replica, asked of the agents of its nodes (logs stay on the nodes).",
        _examples("logs smollm2-1", "logs smollm2-1 -n 20 -f"),
    ),
    "ctl explain-placement": (
        "For every node and profile, why a replica of the model would or would not go there: the next one\n"
        "when the model has fewer than it wants, else a further one. Folded from the log itself.",
        _examples("explain-placement llama-70b", "explain-placement smollm2 -o json"),
    ),
    **facility_cli.ABOUT,
    **node_ctl.ABOUT,
}


READ_TIMEOUT_HELP = (
    "seconds the whole command may take, whatever NATS does (first it waits for the read models to "
    "reach the end of the log; past it, they are shown as they are, exit 3 or 4)"
)


def add_parser(sub) -> None:
    ctl = sub.add_parser("ctl", help="operate the fleet: apply a catalog, get and describe what runs")
    _where_flags(ctl, None)
    verbs = ctl.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of these (llmgw ctl VERB --help says more)")

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help)
        _where_flags(p, argparse.SUPPRESS)  # also accepted after the verb
        return p

    apply_ = verb("apply", "publish the models, owners and API keys of a catalog file that changed")
    apply_.add_argument("-f", "--file", required=True, metavar="FILE", help="the catalog (YAML; see deploy/catalog.example.yaml)")
    _wait_flags(apply_, "every model of the file is placed and ready")
    dry_run_flags(apply_)

    delete = verb("delete", "remove a model, an owner or an API key from the catalog")
    delete.add_argument(
        "kind", type=_catalog_kind, metavar="KIND", help="model, owner or apikey (or models, mo, owners, apikeys, api-key)"
    )
    delete.add_argument("name", metavar="NAME", help="the model's, owner's or key's name")
    _wait_flags(delete, "a model's replicas are gone")

    get_cli.add_parser(verb, kind_type, READ_TIMEOUT_HELP)

    describe = verb("describe", "one model, replica or node: its state now and its history, with reasons")
    describe.add_argument(
        "kind", type=kind_type(("models", "replicas", "nodes")), metavar="KIND",
        help="model, replica or node (or plural, or mo, rs, no)",
    )  # fmt: skip
    describe.add_argument("name", metavar="NAME", help="the model's, replica's or node's name")
    describe.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text", help="text for people, json or yaml")
    describe.add_argument("--timeout", type=float, default=CONFIG.catch_up_timeout_s, metavar="S", help=READ_TIMEOUT_HELP)

    restart = verb("restart", "replace replicas: beside themselves (surge), or in place")
    restart.add_argument("replicas", nargs="+", metavar="REPLICA", help="the replicas to replace (ready ones)")
    restart.add_argument("--in-place", action="store_true", help="stop each first, then start its replacement")
    restart.add_argument(
        "--max-surge", type=int, default=0, metavar="N", help="replaced beside themselves at once (0 and 0: one at a time)"
    )
    restart.add_argument(
        "--max-unavailable", type=int, default=0, metavar="N", help="stopped first at once (0 and 0: one at a time)"
    )
    _wait_flags(restart, "they are replaced and their models ready again")
    dry_run_flags(restart)

    retry = verb("retry", "try again a model parked after its replicas kept failing to start")
    retry.add_argument("model", metavar="MODEL", help="the parked model")
    _wait_flags(retry, "it is placed and ready")

    logs = verb("logs", "the engine log of a replica, from the agents of its nodes")
    logs.add_argument("replica", metavar="REPLICA", help="the replica (`llmgw ctl get replicas` lists them)")
    logs.add_argument("-n", "--lines", type=int, default=100, metavar="N", help="the last N lines")
    logs.add_argument("-f", "--follow", action="store_true", help="then print lines as they are written (Ctrl-C ends)")

    explain = verb("explain-placement", "for every node, why a replica of a model would or would not go there")
    explain.add_argument("model", metavar="MODEL", help="the model (in the catalog)")
    explain.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text", help="text for people, json or yaml")

    facility_cli.add_parsers(verb, lambda p: _where_flags(p, argparse.SUPPRESS), _wait_flags, dry_run_flags)
    node_ctl.add_parsers(verb, lambda p: _where_flags(p, argparse.SUPPRESS), _wait_flags)

    from .main import cmd_ctl

    ctl.set_defaults(func=cmd_ctl)


def _where_flags(p: argparse.ArgumentParser, default) -> None:
    p.add_argument("--nats", default=default, metavar="URL", help="NATS URL (default: $LLMGW_NATS, else the local llmgw up's)")
    p.add_argument(
        "--db", default=default, metavar="PATH", help="the read models' SQLite file (default: $LLMGW_DB, else the local llmgw up's)"
    )
    p.add_argument(
        "--creds", default=default, metavar="FILE",
        help="NATS credential (default: $LLMGW_CREDS, else the local llmgw up's creds/operator.creds)",
    )  # fmt: skip


def _wait_flags(p: argparse.ArgumentParser, effect: str) -> None:
    p.add_argument(
        "--wait", action="store_true",
        help=f"return once the change took effect: {effect} (progress on stderr; exit 5 if not in time or if it "
        f"cannot, with the reason). Without it: once the read models include the change",
    )  # fmt: skip
    p.add_argument(
        "--timeout", type=float, default=None, metavar="S",
        help=f"seconds the whole command may take, publishing and waiting, whatever NATS does (default: "
        f"{CONFIG.projected_timeout_s:g}, {CONFIG.effect_timeout_s:g} with --wait); NATS not answering in time is "
        f"exit 3, the read models not reaching the change exit 4, the change not taking effect exit 5",
    )  # fmt: skip


def dry_run_flags(p: argparse.ArgumentParser) -> None:
    """--dry-run and its options, for every command that changes the fleet."""
    p.add_argument(
        "--dry-run", action="store_true",
        help="publish nothing: fold the log, apply the change to a copy of the state and print what the control "
        "plane would decide until it settles (placements, stops, restarts, preemptions, waits), with simulated agents",
    )  # fmt: skip
    p.add_argument(
        "--ready-after", type=float, default=None, metavar="S",
        help="--dry-run: a placed shard is ready this long after (default: its profile's typical start time in the "
        "log, else 1 s)",
    )  # fmt: skip
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="--dry-run: text for people, or json")


def say(text: str) -> None:
    """A message on stderr; what it quotes from the log (names, reasons) with its control characters escaped."""
    print(views.printable_lines(text), file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the bus


async def _connect(where: Where):
    from ..bus.auth import CredentialError
    from ..bus.nats import NatsBus

    try:
        bus = await NatsBus.connect(where.nats, name="llmgw-ctl", creds=where.creds)
    except CredentialError as e:
        raise CtlError(str(e), UNREACHABLE)
    except ConnectionError as e:
        raise CtlError(f"{e} ({where.how_nats})", UNREACHABLE)
    bus.drain_at_close = False  # a drain of a frozen NATS would outlast --timeout (bus/nats.py)
    try:
        # Just started, `llmgw up` may not have made the streams yet.
        await bus.wait_for_streams(timeout=max(0.1, deadline.left(30.0)))
    except TimeoutError as e:
        await bus.close()
        raise CtlError(f"{e} (NATS at {where.nats})", UNREACHABLE)
    return bus


async def _live_state(where: Where) -> State:
    """The state folded from the whole log, as the control plane has it (not the read models)."""
    bus = await _connect(where)
    try:
        state = State()
        for seq, subject, data in await read_log(bus):
            apply(state, seq, subject, data)
    finally:
        await bus.close()
    return state


async def _catalog(bus) -> tuple[State, dict[tuple[str, str], int]]:
    """The catalog as the log has it, and the sequence of each model's latest
    event: folded from the operators' events alone (llmgw.ctl.>), which are
    all that define it, so the answer is exact without reading the whole log
    or trusting read models that may be behind."""
    state = State()
    latest: dict[tuple[str, str], int] = {}
    for seq, subject, data in await deadline.retrying("a read of the catalog", lambda: bus.read_matching("llmgw.ctl.>")):
        apply(state, seq, subject, data)
        try:
            event = ev.decode(data)
        except Exception:  # quarantined by the fold; says nothing of a model
            continue
        # The latest event of each model and key: what --wait waits for when nothing changed.
        if isinstance(event, ev.ModelApplied):
            latest[("model", event.model.name)] = seq
        elif isinstance(event, ev.ModelRemoved):
            latest[("model", event.name)] = seq
        elif isinstance(event, (ev.ApiKeyApplied, ev.ApiKeyRemoved)):
            latest[("apikey", event.name)] = seq
        elif isinstance(event, (ev.OwnerApplied, ev.OwnerRemoved)):
            latest[("owner", event.name)] = seq
        elif isinstance(event, ev.PolicyApplied):
            latest[("policy", "")] = seq
    return state, latest


# --------------------------------------------------------------------------- waiting for the read models


async def wait_projected(db, seq: int, timeout: float, *, what: str) -> None:
    """Wait until the read models include event `seq`, saying so when it takes a while."""
    if db is None:
        raise CtlError("--wait needs the read models: give --db (or run llmgw up)", UNREACHABLE)
    models = ReadModels(db)
    started = time.monotonic()
    told = 0.0
    while True:
        try:
            at = models.position()
        except NoReadModels:
            at = 0
        if at >= seq:
            if told:
                say(f"  the read models reached event {seq}")
            return
        waited = time.monotonic() - started
        if waited >= timeout or _passed():
            raise CtlError(
                f"the read models at {db} stand at event {at} and did not reach {seq} ({what}) in {_total(timeout):g}s: "
                f"the projector is behind or not running (llmgw up runs it; `llmgw projections rebuild` remakes them)",
                BEHIND,
            )
        if waited - told >= CONFIG.progress_every_s:
            told = waited
            say(f"  waiting for the read models to reach event {seq} ({what}): at {at}, {waited:.0f}s")
        await asyncio.sleep(0.02)


def _passed() -> bool:
    """Whether the command's deadline (its --timeout) has passed."""
    d = deadline.current()
    return d is not None and d.passed()


def _total(timeout: float) -> float:
    """The time a wait was given, as the operator gave it: the command's --timeout."""
    d = deadline.current()
    return d.seconds if d is not None else timeout


class Fresh(NamedTuple):
    models: ReadModels
    status: int  # OK, or why the rows may be old: UNREACHABLE, BEHIND (they are shown, with a warning)


async def _last_seq(where: Where) -> int:
    bus = await _connect(where)
    try:
        return await deadline.retrying("about the log", bus.last_seq)
    finally:
        await bus.close()


async def _fresh(where: Where, timeout: float) -> Fresh:
    """The read models, once they include everything the log held when we
    asked (so a `get` after another process's `apply` sees it). When the log
    cannot be reached, or they do not catch up in time, the rows are shown as
    they are, with a warning, and the command's exit status says so."""
    if where.db is None:
        raise CtlError(
            "no read models found: run `llmgw up` here (or below the folder it runs in), or give --db PATH",
            UNREACHABLE,
        )
    models = ReadModels(where.db)
    try:
        # The log's end, within the command's deadline: else the rows as they are (exit 3).
        async with asyncio.timeout(deadline.left(timeout)):
            last = await _last_seq(where)
    except CtlError as e:
        say(f"warning: {e}; showing the read models as they are (event {models.position()})")
        return Fresh(models, e.status)
    except TimeoutError as e:  # (a BusUnavailable too)
        why = str(e) or f"NATS at {where.nats} did not answer in {_total(timeout):g}s"
        say(f"warning: {why}; showing the read models as they are (event {models.position()})")
        return Fresh(models, UNREACHABLE)
    try:
        await wait_projected(where.db, last, timeout, what="the end of the log")
    except CtlError as e:
        say(f"warning: {e}; showing them as they are")
        return Fresh(models, e.status)
    return Fresh(models, OK)


# --------------------------------------------------------------------------- waiting for the effect


class Effect(NamedTuple):
    done: bool
    impossible: str  # why it cannot take effect as things stand ("" when it may)
    where: str  # how it stands, for the progress lines


async def wait_effect(
    where: Where, check: Callable[[ReadModels], Effect], timeout: float, *, what: str, started: float | None = None
) -> None:
    """--wait: until `check` says the change took effect in the fleet (as the
    read models show it), saying how it stands whenever that changes (and
    about once a second while it waits); CtlError NOT_AS_WANTED if it cannot
    or does not in time."""
    if where.db is None:
        raise CtlError("--wait needs the read models: give --db (or run llmgw up)", UNREACHABLE)
    models = ReadModels(where.db)
    progress = Progress()
    if started is not None:  # the command's wait began earlier (for the read models)
        progress.started = started
    said = ""
    while True:
        try:
            effect = check(models)
        except NoReadModels:
            effect = Effect(False, "", "no read models yet")
        if effect.done:
            if progress.told:
                say(f"  {effect.where}")
            say(f"{what}: done in {progress.elapsed():.1f}s")
            return
        if effect.impossible:
            raise CtlError(f"{what}: cannot take effect: {effect.impossible}", NOT_AS_WANTED)
        waited = progress.elapsed()
        if waited >= timeout or _passed():
            raise CtlError(f"{what}: not done in {_total(timeout):g}s: {effect.where}", NOT_AS_WANTED)
        if effect.where != said or progress.due():
            said = effect.where
            progress.last = time.monotonic()
            progress.say(f"  waiting ({waited:.0f}s): {effect.where}")
        await asyncio.sleep(0.1)


def model_effect(models: ReadModels, name: str) -> Effect:
    """A model took effect: as many ready replicas as it wants, each running
    a profile of its catalog entry now, no restart pending; parked: it cannot."""
    m = models.model(name)
    if m is None:
        return Effect(False, "", f"{name}: not in the read models yet")
    if m["parked"]:
        return Effect(False, f"{name} is parked: {m['parked']} (fix it, then `llmgw ctl retry {name}`)", "")
    current = {p["fingerprint"] for p in m["profiles"]}
    reps = models.replicas(name)
    ready = [r for r in reps if r["state"] == "ready" and r["fingerprint"] in current and not r["restart"]]
    old = [r for r in reps if r["fingerprint"] not in current or r["restart"]]
    want = m["desired"]
    parts = [f"{name}: {len(ready)}/{want} ready"]
    for r in reps:
        if r in ready:
            continue
        why = f": {r['reason']}" if r["reason"] and r["state"] != "ready" else ""
        restart = f", restart {r['restart']}" if r["restart"] else ""
        parts.append(f"{r['id']} {r['state']}{restart}{why}")
    if m["waiting"]:
        parts.append(f"waiting: {m['waiting']}")
    refused = [r for r in reps if r["restart"].startswith("refused")]
    if refused:
        return Effect(False, f"the restart of {refused[0]['id']} was {refused[0]['restart']}", "; ".join(parts))
    return Effect(len(ready) >= want and not old, "", "; ".join(parts))


def _timeout(args, waiting_for_effect: bool) -> float:
    if args.timeout is not None:
        return args.timeout
    return CONFIG.effect_timeout_s if waiting_for_effect else CONFIG.projected_timeout_s


async def _took_effect(args, where: Where, seq: int, what: str, check: Callable[[ReadModels], Effect] | None) -> None:
    """What every change does once published: wait until the read models
    include it (read-your-writes; skipped when no read models are known and
    --wait was not given); with --wait, then until it took effect."""
    if where.db is None and not args.wait:
        return
    started = time.monotonic()
    timeout = _timeout(args, args.wait)
    if seq:
        await wait_projected(where.db, seq, timeout, what=what)
    if args.wait and check is not None:
        await wait_effect(where, check, timeout, what=what, started=started)


# --------------------------------------------------------------------------- verbs


def _all(checks: list[Callable[[ReadModels], Effect]]) -> Callable[[ReadModels], Effect]:
    def check(models: ReadModels) -> Effect:
        effects = [c(models) for c in checks]
        impossible = next((e.impossible for e in effects if e.impossible), "")
        return Effect(all(e.done for e in effects), impossible, "; ".join(e.where for e in effects if e.where))

    return check


async def cmd_apply(args, where: Where) -> int:
    try:
        catalog = load_catalog(args.file)  # before connecting: a bad file publishes nothing
    except CatalogError as e:
        raise CtlError(f"apply: {e}", BAD_INPUT)
    if not (catalog.models or catalog.owners or catalog.api_keys or catalog.facility or catalog.policy):
        raise CtlError(
            f"apply: {args.file} defines no models, owners, api_keys, facility or policy: nothing to apply "
            f"(to remove something, `llmgw ctl delete`)",
            BAD_INPUT,
        )
    specs = catalog.models
    if getattr(args, "dry_run", False):
        return await _dry_run(args, where, "apply", lambda state: _apply_as_if(state, catalog))
    bus = await _connect(where)
    ids = MsgIds(f"ctl-{uuid.uuid4().hex[:12]}")
    wait_for = 0
    try:
        state, latest = await _catalog(bus)
        for item in items(state, catalog):
            label = f"{item.kind} {item.name}".rstrip()
            whose = f" for {item.now.owner}" if item.kind == "api key" else ""
            if item.event is None:
                print(f"{label} unchanged")
                wait_for = max(wait_for, latest.get((item.kind.replace("api key", "apikey"), item.name), 0))
                continue
            event = msgspec.structs.replace(item.event, at=time.time())
            seq = await _publish_on(bus, event, next(ids))
            print(f"{label} {'configured' if item.had is not None else 'created'}{whose} (event {seq})")
            wait_for = max(wait_for, seq)
        if catalog.facility is not None:
            # Whole each time: a cap the file no longer names is lifted.
            if catalog.facility.budgets == state.budgets:
                print("facility unchanged")
            else:
                event = msgspec.structs.replace(catalog.facility, at=time.time())
                seq = await _publish_on(bus, event, next(ids))
                print(f"facility configured: {len(event.budgets)} power cap(s) (event {seq})")
                wait_for = max(wait_for, seq)
    finally:
        await bus.close()
    sys.stdout.flush()
    check = _all([lambda m, name=spec.name: model_effect(m, name) for spec in specs])
    await _took_effect(args, where, wait_for, "the catalog", check)
    return OK


def _apply_as_if(state: State, catalog) -> tuple[list[ev.Event], list]:
    """What `apply` would publish for the file, and what it changes, field by field."""
    from ..core.whatif import Changed, field_changes

    events, changes = [], []
    for item in items(state, catalog):
        if item.event is not None:
            events.append(item.event)
            changes.append(Changed(kind=item.kind, name=item.name, verb="configured" if item.had is not None else "created",
                                   fields=field_changes(item.had, item.now)))
    if catalog.facility is not None and catalog.facility.budgets != state.budgets:
        events.append(catalog.facility)  # whole, as apply publishes it
        changes.append(Changed(kind="facility", name="budgets", verb="configured",
                               fields=field_changes(dict(state.budgets), dict(catalog.facility.budgets))))
    return events, changes


async def _dry_run(args, where: Where, what: str, as_if: Callable[[State], tuple[list[ev.Event], list]]) -> int:
    """Fold the live log, fold what a command would publish on a copy of the
    state, decide until it settles (core/whatif.py), print what would happen.
    Publishes nothing. `as_if(state)` gives the events the command would
    publish and the changes to show (a facility hold: its DomainHeld, no changes)."""
    from ..core.whatif import Timing, dry_run
    from ..ctl.whatif_view import render

    state = await _live_state(where)
    events, changes = as_if(state)
    timing = Timing(fixed=args.ready_after).learn(state)
    report = dry_run(state, events, time.time(), timing=timing, changes=changes)
    text = render(report, what, args.output)
    print(views.printable_lines(text) if args.output == "text" else text, flush=True)
    return OK


async def cmd_delete(args, where: Where) -> int:
    bus = await _connect(where)
    try:
        state, _ = await _catalog(bus)
        event: ev.Event
        if args.kind == "model":
            if args.name not in state.models:
                raise CtlError(f"delete: there is no model {args.name}{did_you_mean(args.name, state.models)}", NOT_FOUND)
            event = ev.ModelRemoved(at=time.time(), name=args.name)
        elif args.kind == "owner":
            if args.name not in state.owners:
                raise CtlError(f"delete: there is no owner {args.name}{did_you_mean(args.name, state.owners)}", NOT_FOUND)
            event = ev.OwnerRemoved(at=time.time(), name=args.name)
        else:
            if args.name not in state.api_keys:
                raise CtlError(
                    f"delete: there is no api key {args.name}{did_you_mean(args.name, state.api_keys)}", NOT_FOUND
                )
            event = ev.ApiKeyRemoved(at=time.time(), name=args.name)
        seq = await publish_event(bus, event)
        print(f"{args.kind.replace('apikey', 'api key')} {args.name} deleted (event {seq})", flush=True)
    finally:
        await bus.close()

    def gone(models: ReadModels) -> Effect:
        reps = models.replicas(args.name)
        states = ", ".join(f"{r['id']} {r['state']}" for r in reps)
        return Effect(not reps, "", f"{args.name}: {len(reps)} replica(s) left ({states})" if reps else f"{args.name}: none left")

    await _took_effect(args, where, seq, f"the removal of {args.name}", gone if args.kind == "model" else None)
    return OK


async def publish_event(bus, event: ev.Event) -> int:
    """Publish one operator event on a bus already connected (as the operator); returns its sequence.
    The console publishes its actions through this too."""
    return await _publish_on(bus, event, f"ctl-{uuid.uuid4().hex}")


async def _publish_on(bus, event: ev.Event, msg_id: str) -> int:
    """Publish, tried again (the same Nats-Msg-Id: the stream drops a second
    copy) while the bus is busy, within the command's deadline."""
    subject, data = ev.subject_for(event), ev.encode(event)
    return await deadline.retrying(f"a publish to {subject}", lambda: bus.publish(subject, data, msg_id=msg_id))


async def _publish(where: Where, event: ev.Event) -> int:
    """Publish one operator event; returns its sequence."""
    bus = await _connect(where)
    try:
        return await publish_event(bus, event)
    finally:
        await bus.close()


def restart_problem(rid: str, rep: dict) -> str:
    """Why a replica (its read-model row) is not restarted now; "" when it may be."""
    if rep["state"] != "ready":
        return f"replica {rid} is {rep['state']}, not ready: only a serving replica is restarted"
    if rep["restart"] in ("queued", "replacing", "in place"):
        return f"replica {rid} is restarting already ({rep['restart']})"
    return ""


def _no_replica(verb: str, rid: str, models: ReadModels) -> CtlError:
    return CtlError(
        f"{verb}: there is no replica {rid}{did_you_mean(rid, models.names('replica'))} "
        f"(`llmgw ctl get replicas` lists them)",
        NOT_FOUND,
    )


def _no_model(verb: str, name: str, known) -> CtlError:
    return CtlError(f"{verb}: there is no model {name} in the catalog{did_you_mean(name, known)}", NOT_FOUND)


async def cmd_restart(args, where: Where) -> int:
    models = (await _fresh(where, CONFIG.catch_up_timeout_s)).models
    of_model = {}
    for rid in args.replicas:
        rep = models.replica(rid)
        if rep is None:
            raise _no_replica("restart", rid, models)
        problem = restart_problem(rid, rep)
        if problem:
            raise CtlError(f"restart: {problem}", BAD_INPUT)
        of_model[rid] = rep["model"]
    if args.max_surge < 0 or args.max_unavailable < 0:
        raise CtlError("restart: --max-surge and --max-unavailable are counts (0 or more)", BAD_INPUT)
    event = ev.ReplicasRestart(
        at=time.time(), replicas=args.replicas, in_place=args.in_place,
        max_surge=args.max_surge, max_unavailable=args.max_unavailable,
    )
    if args.dry_run:
        return await _dry_run(args, where, f"restart {' '.join(args.replicas)}", lambda state: ([event], []))
    seq = await _publish(where, event)
    print(f"restart of {', '.join(args.replicas)} asked (event {seq}); `llmgw ctl get replicas` shows how it stands",
          flush=True)

    def replaced(m: ReadModels) -> Effect:
        left = [r for r in (m.replica(rid) for rid in args.replicas) if r is not None]
        refused = [r for r in left if r["restart"].startswith("refused")]
        if refused:
            return Effect(False, f"the restart of {refused[0]['id']} was {refused[0]['restart']}", "")
        effects = [model_effect(m, name) for name in sorted(set(of_model.values()))]
        still = ", ".join(f"{r['id']} {r['state']}" + (f" ({r['restart']})" if r["restart"] else "") for r in left)
        where_ = "; ".join(([f"not yet replaced: {still}"] if left else []) + [e.where for e in effects])
        return Effect(not left and all(e.done for e in effects), next((e.impossible for e in effects if e.impossible), ""),
                      where_)

    await _took_effect(args, where, seq, "the restart", replaced)
    return OK


async def cmd_retry(args, where: Where) -> int:
    models = (await _fresh(where, CONFIG.catch_up_timeout_s)).models
    model = models.model(args.model)
    if model is None:
        raise _no_model("retry", args.model, [m["name"] for m in models.models()])
    if not model["parked"]:
        print(f"model {args.model} is not parked: nothing to retry")
        return OK
    seq = await _publish(where, ev.ModelRetry(at=time.time(), name=args.model))
    print(f"model {args.model} unparked (event {seq}): its replicas will be placed again", flush=True)

    def ready(m: ReadModels) -> Effect:
        row = m.model(args.model)
        if row is not None and row["parked"] and m.position() < seq:
            return Effect(False, "", f"{args.model}: the retry not read yet")
        return model_effect(m, args.model)

    await _took_effect(args, where, seq, f"the retry of {args.model}", ready)
    return OK


async def cmd_explain(args, where: Where) -> int:
    """Folded from the log itself (the read models do not keep GPUs per
    profile): what the control plane's next pass would see."""
    state = await _live_state(where)
    if args.model not in state.models:
        raise _no_model("explain-placement", args.model, state.models)
    lines, data = explanation(state, args.model)
    print(views.printable_lines("\n".join(lines)) if args.output == "text" else views.for_tools(data, args.output))
    return OK


def explanation(state: State, name: str) -> tuple[list[str], dict]:
    """Why a model's next (or a further) replica would or would not go on each
    node, as lines for people and as data: what explain-placement prints, and
    the console's Explain view."""
    from ..core.explain import explain
    from ..core.placement import render_explanation

    model = state.models[name]
    running = [r for r in state.replicas.values() if r.model == name and r.state != "stopped"]
    ready = sum(r.state == "ready" for r in running)
    wants = model.desired if model.desired >= 0 else model.spec.min_replicas
    further = len(running) >= wants  # it has what it wants: this is about one more
    explained = explain(state, name)
    lines = render_explanation(explained)
    if further and lines:
        lines[0] = lines[0].replace("the next replica would", "a further replica would").replace(
            "no profile fits anywhere", "a further replica would fit nowhere"
        )
    about = (
        f"model {name} has {ready} of {len(running)} replicas ready and wants {wants}: "
        + ("it needs no other; below, where a further one (a scale-up) would go" if further
           else f"below, where the next of the {wants - len(running)} it lacks would go")
    )
    data = {"replicas": {"ready": ready, "running": len(running), "wants": wants},
            "about": "a further replica" if further else "the next replica", **msgspec.to_builtins(explained)}
    return [about, *lines], data


async def cmd_logs(args, where: Where) -> int:
    """Asked of the agents of the replica's nodes (core NATS requests on
    llmgw.agent-logs.<node>): logs stay on the nodes, never in the log."""
    from ..agent import logs

    models = (await _fresh(where, CONFIG.catch_up_timeout_s)).models
    rep = models.replica(args.replica)
    if rep is None:
        raise _no_replica("logs", args.replica, models)
    nodes = sorted(set(rep["nodes"]))
    simulated = [n for n in nodes if (models.node(n) or {}).get("agent", "").startswith("simulated/")]
    if simulated:
        raise CtlError(
            f"logs: {args.replica} runs on simulated node {', '.join(simulated)}: a simulated agent starts no engine, "
            f"so there is no engine log to show (`llmgw ctl describe replica {args.replica}` shows its history)",
            NOT_FOUND,
        )
    bus = await _connect(where)

    async def get(lines, offsets):
        return await logs.fetch_all(bus.nc, nodes, args.replica, lines, offsets)

    try:
        if not args.follow:
            got = (await get(args.lines, None))["shards"]
            if not got:
                raise CtlError(f"logs: the agents of {', '.join(nodes)} have no log of {args.replica}", NOT_FOUND)
            for shard, part in sorted(got.items()):
                for line in part["lines"]:  # an engine's own words: escapes shown, never obeyed
                    print(views.printable(f"{shard}: {line}" if len(got) > 1 else line))
            return OK
        _lift_deadline()  # a follow runs until Ctrl-C
        async for shard, line in logs.follow(get, args.lines):
            print(views.printable(f"{shard}: {line}"), flush=True)
        return OK
    except ConnectionError as e:
        raise CtlError(f"logs: {e}", UNREACHABLE)
    except ValueError as e:
        raise CtlError(f"logs: {e}", NOT_FOUND)
    finally:
        await bus.close()


def _lift_deadline() -> None:
    d = deadline.current()
    if d is not None:
        d.lift()


async def cmd_describe(args, where: Where) -> int:
    fresh = await _fresh(where, args.timeout)
    models = fresh.models
    kind, name = views.SINGULAR[args.kind], args.name
    if not models.known(kind, name):
        raise CtlError(f"describe: the log never mentioned a {kind} {name}{did_you_mean(name, models.names(kind))}",
                       NOT_FOUND)
    page: dict = {"name": name}
    if kind == "model":
        page["model"] = models.model(name)
        page["replicas"] = models.replicas(name)
    elif kind == "replica":
        page["replica"] = models.replica(name)
    else:
        page["node"] = models.node(name)
        page["shards"] = models.shards_on(name)
    history = models.history(kind, name)
    if any(e["type"] == loadfold.LOAD for e in history):
        history = loadfold.fold(history, await _load_reports(where, args.timeout), CONFIG.load_interval_s)
    page["history"] = history
    print(views.describe(kind, page, args.output))
    return fresh.status


async def _load_reports(where: Where, timeout: float) -> dict[int, dict] | None:
    """The gateways' load reports, their numbers by sequence, read from the
    log (the read models keep their words only); None, with a warning, when
    the log is out of reach in the command's time: the lines then count reports."""
    try:
        async with asyncio.timeout(deadline.left(timeout)):
            bus = await _connect(where)
            try:
                records = await bus.read_matching(f"llmgw.gw.*.{loadfold.LOAD}")
            finally:
                await bus.close()
    except (CtlError, LookupError, TimeoutError) as e:
        say(f"warning: the load reports' numbers were not read ({_said(e) or 'no answer in time'}); counting reports only")
        return None
    out = {}
    for seq, _, data in records:
        try:
            report = ev.decode(data)
        except Exception:  # quarantined by the fold: not a report
            continue
        if isinstance(report, ev.ModelLoad):
            out[seq] = msgspec.to_builtins(report)
    return out


VERBS = {
    "apply": cmd_apply,
    "delete": cmd_delete,
    "get": get_cli.cmd_get,
    "describe": cmd_describe,
    "restart": cmd_restart,
    "retry": cmd_retry,
    "explain-placement": cmd_explain,
    "logs": cmd_logs,
    "label": facility_cli.cmd_label,
    "facility": facility_cli.cmd_facility,
    "node": node_ctl.cmd_node,
}


def command_timeout(args) -> float:
    """The whole command's deadline: its --timeout, else its default (that
    of its wait; CliConfig.command_timeout_s for a verb without --timeout)."""
    if hasattr(args, "wait"):  # a change: --timeout bounds it all, publishing and waiting
        return _timeout(args, args.wait)
    given = getattr(args, "timeout", None)
    return given if given is not None else CONFIG.command_timeout_s


async def run(args) -> int:
    where = locate(args.nats, args.db, getattr(args, "creds", None))
    command = None
    try:
        async with deadline.running(command_timeout(args)) as command:
            return await VERBS[args.verb](args, where)
    except CtlError as e:
        say(f"llmgw ctl: {_clean(str(e))}")
        return e.status
    except (LookupError, TimeoutError) as e:  # no read models, no stream, the bus in trouble
        if command is not None and command.expired():
            say(f"llmgw ctl: {args.verb}: NATS at {where.nats} did not answer in {command.seconds:g}s (--timeout): "
                f"the bus is busy, electing a stream leader, or unreachable")
            return UNREACHABLE
        say(f"llmgw ctl: {_clean(_said(e))}")
        return UNREACHABLE
    except BrokenPipeError:
        raise  # the reader went away: llmgw/cli/main.py ends quietly (exit 141)
    except Exception as e:  # never a traceback (issue 35): one line; NATS's own errors are exit 3
        # NATS's own errors name the bus: a CI run printed only "nats:
        # connection closed" when the server was killed mid-apply.
        if type(e).__module__.split(".")[0] == "nats":
            say(f"llmgw ctl: {args.verb}: NATS at {where.nats}: {_clean(_said(e))}")
            return UNREACHABLE
        say(f"llmgw ctl: {args.verb}: {_clean(f'{type(e).__name__}: {e}')}")
        return NOT_FOUND


def _clean(text: str) -> str:
    """An error, as the terminal may show it: it can quote what the log said (a name, a reason)."""
    return views.printable(text)


def _said(e: Exception) -> str:
    """What an error says to an operator. A bare client timeout ("nats:
    timeout", from a call the bus did not wrap) says what it means: a CI run
    printed only that when the stream leader was killed mid-apply."""
    from ..bus import BusUnavailable
    from ..bus.nats import describe_trouble, is_trouble

    if is_trouble(e) and not isinstance(e, BusUnavailable):
        return f"NATS did not answer ({describe_trouble(e)}): the bus is electing a stream leader, or is unreachable"
    return str(e)
