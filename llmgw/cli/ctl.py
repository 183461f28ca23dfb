"""`llmgw ctl`: the operator's commands.

Reads come from the SQLite read models (`get`, `describe`); changes are
events published on the log (`apply`, `delete`, `restart`, `retry`). Every
change returns once the read models include the event it published, so a
`get` after it shows the change (read-your-writes); with `--wait` it returns
once the change took effect in the fleet (placed and ready; gone; replaced),
showing progress, or fails (exit 5) saying why not.

Exit status: one table for every command, llmgw/ctl/exits.py.

Here: the verbs, and a command run within its deadline. Their parsers and
--help are ctl_parsers.py; reaching the log and the read models, ctl_bus.py;
--wait, ctl_effect.py; errors and messages, ctl_errors.py; `get`, get.py;
the facility's and nodes' verbs, facility.py and node_ctl.py.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable

import msgspec

from ..bus.msgids import MsgIds
from ..core.contract import events as ev
from ..core.folding.state import State
from ..ctl import deadline, loadfold, views
from ..ctl.catalog_file import CatalogError, items, load_catalog
from ..ctl.changes import publish_event, publish_on, restart_problem
from ..ctl.config import CONFIG
from ..ctl.explanation import explanation
from ..ctl.locate import Where, locate
from ..ctl.readmodels import ReadModels
from . import facility as facility_cli
from . import get as get_cli
from . import node_ctl
from .ctl_bus import _catalog, _connect, _fresh, _lift_deadline, _live_state, _publish
from .ctl_effect import Effect, _all, _timeout, _took_effect, model_effect
from .ctl_errors import BAD_INPUT, NOT_FOUND, OK, UNREACHABLE, CtlError, _clean, _said, did_you_mean, say


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
            seq = await publish_on(bus, event, next(ids))
            print(f"{label} {'configured' if item.had is not None else 'created'}{whose} (event {seq})")
            wait_for = max(wait_for, seq)
        if catalog.facility is not None:
            # Whole each time: a cap the file no longer names is lifted.
            if catalog.facility.budgets == state.budgets:
                print("facility unchanged")
            else:
                event = msgspec.structs.replace(catalog.facility, at=time.time())
                seq = await publish_on(bus, event, next(ids))
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
    from ..core.simulation.whatif import Changed, field_changes

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
    state, decide until it settles (core/simulation/whatif.py), print what would happen.
    Publishes nothing. `as_if(state)` gives the events the command would
    publish and the changes to show (a facility hold: its DomainHeld, no changes)."""
    from ..core.simulation.whatif import Timing, dry_run
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
