"""`llmgw ctl`: the operator's commands.

Reads come from the SQLite read models (`get`, `describe`); changes are
events published on the log (`apply`, `delete`). `--wait` joins the two: the
command returns only once the read models include the event it published,
so `apply --wait` then `get` shows the change (read-your-writes).

Exit status: 0 done, 1 no such thing, 2 bad input (nothing was published),
3 NATS or the read models cannot be reached, 4 the read models did not reach
the event in time.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
import uuid

import msgspec

from ..bus import read_log
from ..core import events as ev
from ..core.fold import apply
from ..core.state import State
from ..ctl import views
from ..ctl.catalog_file import CatalogError, load_catalog
from ..ctl.locate import Where, locate
from ..ctl.readmodels import NoReadModels, ReadModels

OK, NOT_FOUND, BAD_INPUT, UNREACHABLE, BEHIND = 0, 1, 2, 3, 4
WATCH_INTERVAL_S = 0.2


class CtlError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def add_parser(sub) -> None:
    ctl = sub.add_parser("ctl", help="operate the fleet: apply a catalog, get and describe what runs")
    _where_flags(ctl, None)
    verbs = ctl.add_subparsers(dest="verb", required=True)

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help)
        _where_flags(p, argparse.SUPPRESS)  # also accepted after the verb
        return p

    apply_ = verb("apply", "publish the models of a catalog file that changed")
    apply_.add_argument("-f", "--file", required=True)
    _wait_flags(apply_)

    delete = verb("delete", "remove a model, an owner or an API key from the catalog")
    delete.add_argument("kind", choices=["model", "owner", "apikey"])
    delete.add_argument("name")
    _wait_flags(delete)

    get = verb("get", "list models, nodes, replicas or decisions from the read models")
    get.add_argument("kind", choices=views.KINDS)
    get.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    get.add_argument("-w", "--watch", action="store_true", help="then print each change as it is projected")
    get.add_argument("--model", help="only this model's replicas or decisions")
    get.add_argument("--limit", type=int, default=50, help="decisions: the latest N (0: all; default 50)")
    get.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the read models to catch up")

    describe = verb("describe", "one model, replica or node: its state now and its history, with reasons")
    describe.add_argument("kind", choices=("model", "replica", "node"))
    describe.add_argument("name")
    describe.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    describe.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the read models to catch up")

    restart = verb("restart", "replace replicas: beside themselves (surge), or in place")
    restart.add_argument("replicas", nargs="+", metavar="REPLICA")
    restart.add_argument("--in-place", action="store_true", help="stop each first, then start its replacement")
    restart.add_argument("--max-surge", type=int, default=0, help="replaced beside themselves at once (default 1)")
    restart.add_argument("--max-unavailable", type=int, default=0, help="stopped first at once (default 0)")
    _wait_flags(restart)

    retry = verb("retry", "try again a model parked after replicas kept failing to start")
    retry.add_argument("model")
    _wait_flags(retry)

    logs = verb("logs", "the engine log of a replica, from the agents of its nodes")
    logs.add_argument("replica")
    logs.add_argument("-n", "--lines", type=int, default=100, help="the last N lines (default 100)")
    logs.add_argument("-f", "--follow", action="store_true", help="then print lines as they are written")

    explain = verb("explain-placement", "for every node, why the next replica of a model would or would not go there")
    explain.add_argument("model")
    explain.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")

    from .main import cmd_ctl

    ctl.set_defaults(func=cmd_ctl)


def _where_flags(p: argparse.ArgumentParser, default) -> None:
    p.add_argument("--nats", default=default, help="NATS URL (default $LLMGW_NATS, else the local llmgw up)")
    p.add_argument("--db", default=default, help="the read models' SQLite file (default $LLMGW_DB, else the local llmgw up's)")
    p.add_argument("--creds", default=default, help="NATS credential (default $LLMGW_CREDS, else the local llmgw up's creds/operator.creds)")


def _wait_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", action="store_true", help="return once the read models include the change")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds --wait waits (default 30)")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the bus


async def _connect(where: Where):
    from ..bus.auth import CredentialError
    from ..bus.nats import NatsBus

    try:
        bus = await NatsBus.connect(where.nats, name="llmgw-ctl", creds=where.creds)
    except CredentialError as e:
        raise CtlError(str(e), UNREACHABLE)
    except ConnectionError as e:
        raise CtlError(f"{e} (found from {where.found}; is llmgw up running? give --nats URL)", UNREACHABLE)
    try:
        # Just started, `llmgw up` may not have made the streams yet.
        await bus.wait_for_streams(timeout=10)
    except TimeoutError as e:
        await bus.close()
        raise CtlError(f"{e} (NATS at {where.nats})", UNREACHABLE)
    return bus


async def _catalog(bus) -> tuple[State, dict[tuple[str, str], int]]:
    """The catalog as the log has it, and the sequence of each model's latest
    event: folded from the operators' events alone (llmgw.ctl.>), which are
    all that define it, so the answer is exact without reading the whole log
    or trusting read models that may be behind."""
    state = State()
    latest: dict[tuple[str, str], int] = {}
    for seq, subject, data in await bus.read_matching("llmgw.ctl.>"):
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
        if waited >= timeout:
            raise CtlError(
                f"the read models at {db} stand at event {at} and did not reach {seq} ({what}) in {timeout:g}s: "
                f"the projector is behind or not running (llmgw up runs it; `llmgw projections rebuild` remakes them)",
                BEHIND,
            )
        if waited - told >= 1.0:
            told = waited
            say(f"  waiting for the read models to reach event {seq} ({what}): at {at}, {waited:.0f}s")
        await asyncio.sleep(0.02)


async def _fresh(where: Where, timeout: float) -> ReadModels:
    """The read models, once they include everything the log held when we
    asked (so a `get` after another process's `apply --wait` sees it). When
    the log cannot be reached the rows are shown as they are, with a warning."""
    if where.db is None:
        raise CtlError(
            "no read models found: run `llmgw up` here (or below the folder it runs in), or give --db PATH",
            UNREACHABLE,
        )
    models = ReadModels(where.db)
    try:
        bus = await _connect(where)
    except CtlError as e:
        say(f"warning: {e}; showing the read models as they are (event {models.position()})")
        return models
    try:
        last = await bus.last_seq()
    finally:
        await bus.close()
    try:
        await wait_projected(where.db, last, timeout, what="the end of the log")
    except CtlError as e:
        say(f"warning: {e}; showing them as they are")
    return models


# --------------------------------------------------------------------------- verbs


async def cmd_apply(args, where: Where) -> int:
    try:
        catalog = load_catalog(args.file)  # before connecting: a bad file publishes nothing
    except CatalogError as e:
        raise CtlError(f"apply: {e}", BAD_INPUT)
    specs = catalog.models
    bus = await _connect(where)
    ids = (f"ctl-{uuid.uuid4().hex[:12]}-{n}" for n in itertools.count())
    wait_for = 0
    try:
        state, latest = await _catalog(bus)
        for spec in specs:
            current = state.models.get(spec.name)
            if current is not None and current.spec == spec:
                print(f"model {spec.name} unchanged")
                wait_for = max(wait_for, latest.get(("model", spec.name), 0))
                continue
            event = ev.ModelApplied(at=time.time(), model=spec)
            seq = await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=next(ids))
            print(f"model {spec.name} {'configured' if current else 'created'} (event {seq})")
            wait_for = max(wait_for, seq)
        for owner in catalog.owners:
            had = state.owners.get(owner.name)
            if had is not None and (had.guarantee, had.limit) == (owner.guarantee, owner.limit):
                print(f"owner {owner.name} unchanged")
                wait_for = max(wait_for, latest.get(("owner", owner.name), 0))
                continue
            event = msgspec.structs.replace(owner, at=time.time())
            seq = await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=next(ids))
            print(f"owner {owner.name} {'configured' if had else 'created'} (event {seq})")
            wait_for = max(wait_for, seq)
        for key in catalog.api_keys:
            had = state.api_keys.get(key.name)
            same = had is not None and (had.owner, had.key_sha256, had.requests_per_minute, had.tokens_per_minute) == (
                key.owner, key.key_sha256, key.requests_per_minute, key.tokens_per_minute)
            if same:
                print(f"api key {key.name} unchanged")
                wait_for = max(wait_for, latest.get(("apikey", key.name), 0))
                continue
            event = msgspec.structs.replace(key, at=time.time())
            seq = await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=next(ids))
            print(f"api key {key.name} {'configured' if had else 'created'} for {key.owner} (event {seq})")
            wait_for = max(wait_for, seq)
    finally:
        await bus.close()
    if args.wait and wait_for:
        await wait_projected(where.db, wait_for, args.timeout, what="the catalog")
    return OK


async def cmd_delete(args, where: Where) -> int:
    bus = await _connect(where)
    try:
        state, _ = await _catalog(bus)
        event: ev.Event
        if args.kind == "model":
            if args.name not in state.models:
                raise CtlError(f"delete: there is no model {args.name}", NOT_FOUND)
            event = ev.ModelRemoved(at=time.time(), name=args.name)
        elif args.kind == "owner":
            if args.name not in state.owners:
                raise CtlError(f"delete: there is no owner {args.name}", NOT_FOUND)
            event = ev.OwnerRemoved(at=time.time(), name=args.name)
        else:
            if args.name not in state.api_keys:
                raise CtlError(f"delete: there is no api key {args.name}", NOT_FOUND)
            event = ev.ApiKeyRemoved(at=time.time(), name=args.name)
        seq = await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=f"ctl-{uuid.uuid4().hex}")
        print(f"{args.kind.replace('apikey', 'api key')} {args.name} deleted (event {seq})")
    finally:
        await bus.close()
    if args.wait:
        await wait_projected(where.db, seq, args.timeout, what=f"the removal of {args.name}")
    return OK


async def _publish(where: Where, event: ev.Event, args, what: str) -> int:
    """Publish one operator event; with --wait, return once the read models include it."""
    bus = await _connect(where)
    try:
        seq = await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=f"ctl-{uuid.uuid4().hex}")
    finally:
        await bus.close()
    if args.wait:
        await wait_projected(where.db, seq, args.timeout, what=what)
    return seq


async def cmd_restart(args, where: Where) -> int:
    models = await _fresh(where, 5.0)
    for rid in args.replicas:
        rep = models.replica(rid)
        if rep is None:
            raise CtlError(f"restart: there is no replica {rid}", NOT_FOUND)
        if rep["state"] != "ready":
            raise CtlError(f"restart: replica {rid} is {rep['state']}, not ready: only a serving replica is restarted",
                           BAD_INPUT)
        if rep["restart"] in ("queued", "replacing", "in place"):
            raise CtlError(f"restart: replica {rid} is restarting already ({rep['restart']})", BAD_INPUT)
    if args.max_surge < 0 or args.max_unavailable < 0:
        raise CtlError("restart: --max-surge and --max-unavailable are counts (0 or more)", BAD_INPUT)
    event = ev.ReplicasRestart(
        at=time.time(), replicas=args.replicas, in_place=args.in_place,
        max_surge=args.max_surge, max_unavailable=args.max_unavailable,
    )
    seq = await _publish(where, event, args, "the restart")
    print(f"restart of {', '.join(args.replicas)} asked (event {seq}); `llmgw ctl get replicas` shows how it stands")
    return OK


async def cmd_retry(args, where: Where) -> int:
    models = await _fresh(where, 5.0)
    model = models.model(args.model)
    if model is None:
        raise CtlError(f"retry: there is no model {args.model}", NOT_FOUND)
    if not model["parked"]:
        print(f"model {args.model} is not parked: nothing to retry")
        return OK
    seq = await _publish(where, ev.ModelRetry(at=time.time(), name=args.model), args, "the retry")
    print(f"model {args.model} unparked (event {seq}): its replicas will be placed again")
    return OK


async def cmd_explain(args, where: Where) -> int:
    """Folded from the log itself (the read models do not keep GPUs per
    profile): what the control plane's next pass would see."""
    from ..core.placement import explain, render_explanation

    bus = await _connect(where)
    try:
        state = State()
        for seq, subject, data in await read_log(bus):
            apply(state, seq, subject, data)
    finally:
        await bus.close()
    if args.model not in state.models:
        raise CtlError(f"explain-placement: there is no model {args.model} in the catalog", NOT_FOUND)
    explanation = explain(state, args.model)
    if args.output == "text":
        print("\n".join(render_explanation(explanation)))
    else:
        data = msgspec.to_builtins(explanation)
        print(views.render("explanation", data, args.output))  # type: ignore[arg-type]
    return OK


async def cmd_logs(args, where: Where) -> int:
    """Asked of the agents of the replica's nodes (core NATS requests on
    llmgw.agent-logs.<node>): logs stay on the nodes, never in the log."""
    from ..agent import logs

    models = await _fresh(where, 5.0)
    rep = models.replica(args.replica)
    if rep is None:
        raise CtlError(f"logs: there is no replica {args.replica} (`llmgw ctl get replicas` lists them)", NOT_FOUND)
    nodes = sorted(set(rep["nodes"]))
    bus = await _connect(where)

    async def get(lines, offsets):
        return await logs.fetch_all(bus.nc, nodes, args.replica, lines, offsets)

    try:
        if not args.follow:
            got = (await get(args.lines, None))["shards"]
            if not got:
                raise CtlError(f"logs: the agents of {', '.join(nodes)} have no log of {args.replica}", NOT_FOUND)
            for shard, part in sorted(got.items()):
                for line in part["lines"]:
                    print(f"{shard}: {line}" if len(got) > 1 else line)
            return OK
        async for shard, line in logs.follow(get, args.lines):
            print(f"{shard}: {line}", flush=True)
        return OK
    except ConnectionError as e:
        raise CtlError(f"logs: {e}", UNREACHABLE)
    except ValueError as e:
        raise CtlError(f"logs: {e}", NOT_FOUND)
    finally:
        await bus.close()


def _listing(models: ReadModels, args) -> list[dict]:
    if args.kind == "models":
        return models.models()
    if args.kind == "nodes":
        return models.nodes()
    if args.kind == "replicas":
        return models.replicas(args.model)
    if args.kind == "quotas":
        return models.quotas()
    if args.kind == "preemptions":
        return models.preemptions(model=args.model, limit=args.limit)
    return models.decisions(model=args.model, limit=args.limit)


async def cmd_get(args, where: Where) -> int:
    models = await _fresh(where, args.timeout)
    rows = _listing(models, args)
    print(views.render(args.kind, rows, args.output), flush=True)
    if not args.watch:
        return OK
    # Follow: the rows are read again whenever the read models move, and what
    # differs is printed. Decisions only ever grow: new ones are the change.
    seen = {views.key_of(args.kind, r): r for r in rows}
    position = models.position()
    if args.kind in ("decisions", "preemptions"):
        args.limit = 0
    while True:
        await asyncio.sleep(WATCH_INTERVAL_S)
        now = models.position()
        if now == position:
            continue
        position = now
        rows = _listing(models, args)
        current = {views.key_of(args.kind, r): r for r in rows}
        for key, row in current.items():
            if key not in seen:
                print(views.render_change(args.kind, "ADDED", row, args.output))
            elif seen[key] != row:
                print(views.render_change(args.kind, "MODIFIED", row, args.output))
        if args.kind not in ("decisions", "preemptions"):
            for key, row in seen.items():
                if key not in current:
                    print(views.render_change(args.kind, "DELETED", row, args.output))
        sys.stdout.flush()
        seen = current


async def cmd_describe(args, where: Where) -> int:
    models = await _fresh(where, args.timeout)
    kind, name = args.kind, args.name
    if not models.known(kind, name):
        raise CtlError(f"describe: the log never mentioned a {kind} {name}", NOT_FOUND)
    page: dict = {"name": name}
    if kind == "model":
        page["model"] = models.model(name)
        page["replicas"] = models.replicas(name)
    elif kind == "replica":
        page["replica"] = models.replica(name)
    else:
        page["node"] = models.node(name)
        page["shards"] = models.shards_on(name)
    page["history"] = models.history(kind, name)
    print(views.describe(kind, page, args.output))
    return OK


VERBS = {
    "apply": cmd_apply,
    "delete": cmd_delete,
    "get": cmd_get,
    "describe": cmd_describe,
    "restart": cmd_restart,
    "retry": cmd_retry,
    "explain-placement": cmd_explain,
    "logs": cmd_logs,
}


async def run(args) -> int:
    where = locate(args.nats, args.db, getattr(args, "creds", None))
    try:
        return await VERBS[args.verb](args, where)
    except CtlError as e:
        say(f"llmgw ctl: {e}")
        return e.status
    except (LookupError, TimeoutError) as e:  # no read models, no stream

        say(f"llmgw ctl: {e}")
        return UNREACHABLE
