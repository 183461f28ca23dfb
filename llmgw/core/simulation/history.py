"""What an event is about, and how to say it in a line: for `llmgw replay`'s
history of a model, replica or node, and for the verification report."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec

from ..contract import events as ev
from ..rules.decide import decide
from ..folding.decisions import as_recorded, describe_action
from ..folding.fold import apply
from ..contract.reasons import words
from ..folding.state import State

Entity = tuple[str, str]  # ("model" | "replica" | "node", name)


def mentions(event: ev.Event) -> set[Entity]:
    out: set[Entity] = set()
    if isinstance(event, ev.ModelApplied):
        out.add(("model", event.model.name))
    elif isinstance(event, ev.ModelRemoved):
        out.add(("model", event.name))
    elif isinstance(event, ev.NodeRegistered):
        out.add(("node", event.node))
        for r in event.running:
            out.update({("replica", r.replica), ("model", r.model)})
    elif isinstance(event, ev.ShardStatus):
        out.update({("node", event.node), ("replica", event.replica)})
        out.add(("model", event.replica.rpartition("-")[0]))
    elif isinstance(event, (ev.NodeLost, ev.NodePorts, ev.NodeLabeled, ev.NodePower, ev.NodeMuted, ev.NodeUnmuted,
                            ev.NodeAdmitted)):
        out.add(("node", event.node))
    elif isinstance(event, ev.ReplicasRestart):
        for r in event.replicas:
            out.update({("replica", r), ("model", r.rpartition("-")[0])})
    elif isinstance(event, (ev.ModelRetry,)):
        out.add(("model", event.name))
    elif isinstance(event, ev.ModelLoad):
        out.add(("model", event.model))
    elif isinstance(event, ev.Decided):
        for a in event.actions:
            out.update(_action_mentions(a))
    return out


def action_about(a: ev.Action) -> tuple[str, str, str, str]:
    """(kind, model, replica, node) of one action, for its row in the read
    models and its span; node is "" when the action does not name it (a
    stop names only the replica: where it runs is in the state)."""
    cls = type(a)
    if cls is ev.PlaceReplica:
        shards = sorted(a.shards, key=lambda s: s.rank)
        return "place", a.model, a.replica, ",".join(s.node for s in shards)
    if cls is ev.StopReplica:
        return "stop", a.replica.rpartition("-")[0], a.replica, ""
    if cls is ev.ModelWaiting:
        return "wait", a.model, "", ""
    if cls is ev.StopStray:
        replica = a.shard.rpartition(".")[0]
        return "stop-stray", replica.rpartition("-")[0], replica, a.node
    if cls is ev.ScaleModel or cls is ev.ParkModel or cls is ev.Preempt:
        return str(a.__struct_config__.tag), a.model, "", ""
    if cls is ev.RestartReplica or cls is ev.RefuseRestart:
        return str(a.__struct_config__.tag), a.replica.rpartition("-")[0], a.replica, ""
    return str(a.__struct_config__.tag), "", "", ""


def _action_mentions(a: ev.Action) -> set[Entity]:
    kind, model, replica, node = action_about(a)
    out: set[Entity] = set()
    if type(a) is ev.Preempt:  # about its victims and their models too
        for v in a.victims:
            out.update({("replica", v.replica), ("model", v.model)})
    if model:
        out.add(("model", model))
    if replica:
        out.add(("replica", replica))
    if node:
        out.update(("node", n) for n in node.split(","))
    return out


def _or_none(x) -> str:
    return "no limit of" if x is None else f"{x:g}"


def summary(event: ev.Event, about: Entity | None = None) -> str:
    """One line for people. With `about`, only the actions that concern it."""
    if isinstance(event, ev.ModelApplied):
        m = event.model
        profiles = ", ".join(f"{p.name} ({p.gpus} GPU x {p.nodes} node)" for p in m.profiles)
        return f"model {m.name} applied: min {m.min_replicas}, profiles {profiles}"
    if isinstance(event, ev.ModelRemoved):
        return f"model {event.name} removed"
    if isinstance(event, ev.NodeRegistered):
        return f"node {event.node} registered: {len(event.gpus)} GPUs, running {len(event.running)} shard(s)"
    if isinstance(event, ev.ShardStatus):
        why = f": {event.reason}" if event.reason else ""
        return f"shard {event.shard} on {event.node} {event.state}{why}"
    if isinstance(event, ev.NodeLost):
        return f"node {event.node} lost: {event.reason}"
    if isinstance(event, ev.NodeMuted):
        return (f"node {event.node} muted: {event.events} events at {event.rate:.0f}/s, past its limit of "
                f"{event.limit:.0f}/s; what it says is ignored until an operator unmutes it")
    if isinstance(event, ev.NodeUnmuted):
        return f"node {event.node} unmuted" + (f": {event.reason}" if event.reason else "")
    if isinstance(event, ev.NodePorts):
        held = ", ".join(map(str, event.taken)) or "none"
        return f"node {event.node}: ports held by other programs: {held}"
    if isinstance(event, ev.ReplicasRestart):
        how = " in place" if event.in_place else ""
        pace = f" (max surge {event.max_surge}, max unavailable {event.max_unavailable})" if (
            event.max_surge or event.max_unavailable) else ""
        return f"restart of {', '.join(event.replicas)} asked{how}{pace}"
    if isinstance(event, ev.ModelRetry):
        return f"model {event.name} retried: unparked"
    if isinstance(event, ev.ModelLoad):
        return f"load on {event.model} from gateway {event.gateway}: {event.in_flight} in flight, {event.queued} queued"
    if isinstance(event, ev.OwnerApplied):
        g, lim = event.guarantee, event.limit
        return (
            f"owner {event.name} applied: guarantee {g.gpus} GPUs, {g.cpu_cores} cores, {g.memory_gb:g} GB; "
            f"limit {_or_none(lim.gpus)} GPUs, {_or_none(lim.cpu_cores)} cores, {_or_none(lim.memory_gb)} GB"
        )
    if isinstance(event, ev.OwnerRemoved):
        return f"owner {event.name} removed"
    if isinstance(event, ev.ApiKeyApplied):
        return f"api key {event.name} applied for {event.owner}"
    if isinstance(event, ev.ApiKeyRemoved):
        return f"api key {event.name} removed"
    if isinstance(event, ev.LeaderElected):
        after = f", after {event.previous}" if event.previous else ""
        return f"control plane {event.leader} leads: term {event.term}{after}"
    if isinstance(event, ev.CredentialRevoked):
        return f"credential of {event.role} {event.name} revoked"
    if isinstance(event, ev.NodeLabeled):
        said = [f"{k}={v}" for k, v in sorted(event.set.items())] + [f"{k}-" for k in event.remove]
        return f"node {event.node} labeled: {' '.join(said)}"
    if isinstance(event, ev.NodeAdmitted):
        pool = f", pool {event.pool}" if event.pool else ""
        return (f"node {event.node} admitted: {event.gpus} GPU(s) "
                f"({', '.join(event.gpu_models) or 'no model'}){pool}")
    if isinstance(event, ev.DomainHeld):
        how = " for draining" if event.drain else ""
        return f"{event.domain} held{how}: {event.reason or 'no reason given'}"
    if isinstance(event, ev.DomainReleased):
        return f"{event.domain} released"
    if isinstance(event, ev.FacilityApplied):
        caps = ", ".join(f"{d} {w:g} W" for d, w in sorted(event.budgets.items())) or "none"
        return f"facility applied: power caps {caps}"
    if isinstance(event, ev.NodePower):
        return f"node {event.node} draws {event.watts:g} W"
    if isinstance(event, ev.Decided):
        acts = [a for a in event.actions if about is None or about in _action_mentions(a)]
        return "; ".join(_said(a) for a in acts)
    return ev.tag_of(type(event))


def _said(a: ev.Action) -> str:
    """One action in words, with its reason (and, for a preemption, what the
    nodes it freed had before)."""
    out = describe_action(a)
    why = words(a)
    if why:
        out += f" ({why})"
    if type(a) is ev.Preempt and a.inventory:
        out += f" [before: {a.inventory}]"
    return out


class Difference(msgspec.Struct, kw_only=True):
    """A recorded decision that deciding again on its basis does not give."""

    seq: int
    basis: int
    at: float
    recorded: list[str]
    decided_again: list[str]


Record = tuple[int, str, bytes]  # (seq, subject, data) as the log holds them


def verify(records: Iterable[Record]) -> tuple[int, list[Difference]]:
    """Re-run `decide` on the state each recorded pass was taken on, at its
    recorded time, and list the passes that come out differently.

    Returns (passes checked, differences). `records` is iterated twice, so it
    must be a sequence, not a one-shot iterator.
    """
    wanted: dict[int, list[tuple[int, ev.Decided]]] = {}
    for seq, subject, data in records:
        if subject.startswith("llmgw.control.") and b'"control.decided"' in data:
            try:
                e = ev.decode(data)
            except msgspec.MsgspecError:
                continue
            if isinstance(e, ev.Decided):
                wanted.setdefault(e.basis, []).append((seq, e))
    differences: list[Difference] = []
    state = State()

    def check(basis: int) -> None:
        for seq, e in wanted.pop(basis, ()):
            again = as_recorded(decide(state, e.at), e.actions)
            if again != e.actions:
                differences.append(
                    Difference(
                        seq=seq,
                        basis=basis,
                        at=e.at,
                        recorded=[describe_action(a) for a in e.actions],
                        decided_again=[describe_action(a) for a in again],
                    )
                )

    checked = sum(len(v) for v in wanted.values())
    check(0)
    for seq, subject, data in records:
        apply(state, seq, subject, data)
        if seq in wanted:
            check(seq)
    return checked, differences


def history(records: Iterable[Record], about: Entity) -> Iterator[tuple[int, ev.Event]]:
    for seq, _subject, data in records:
        try:
            e = ev.decode(data)
        except msgspec.MsgspecError:
            continue
        if about in mentions(e):
            yield seq, e
