"""Quotas: a tree of owners, each with a guarantee and a limit.

Owners are paths: "org" is an organisation, "org/team" one of its teams.
What a team's replicas hold counts for the team and for every owner above
it, so an organisation's limit caps all its teams together.

- A limit is the most an owner may hold: a placement that would take it (or
  an ancestor) past one is refused with the reason (`over_limit`).
- A guarantee is what an owner can count on. What it holds beyond its
  guarantee is borrowed (`borrowed`): idle capacity lent while nobody with a
  guarantee needs it, taken back (preempt.py, tier 1) when an owner within
  its own guarantee asks for room. A replica within its owner's guarantee is
  never taken by another owner.

Usage is kept by the fold (`State.usage`, per owner and ancestor) as shards
come and go; everything here is read from it and from the replicas, with no
clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import msgspec

from ..contract.events import Cause, Limit, ProfileSpec, Resources
from ..contract.reasons import K, cause, render
from ..folding.state import Replica, Shard, State, add_gb


@lru_cache(maxsize=4096)
def ancestors(owner: str) -> tuple[str, ...]:
    """The owner and those above it, nearest first: "a/b/c" -> a/b/c, a/b, a.
    (Kept per owner: the fold asks it at every shard's start and end, and an
    org has a few owners; split and joined each time it was a twentieth of
    folding a log with owners, benchmarks/replay.py.)"""
    if not owner:
        return ()
    parts = owner.split("/")
    return tuple("/".join(parts[:i]) for i in range(len(parts), 0, -1))


def shard_amount(sh: Shard) -> Resources:
    return Resources(gpus=len(sh.gpus), cpu_cores=sh.cpu_cores, memory_gb=sh.memory_gb)


def replica_amount(rep: Replica) -> Resources:
    """What a replica's live shards hold."""
    out = Resources()
    for sh in rep.shards:
        if sh.state not in ("failed", "stopped"):
            out = plus(out, shard_amount(sh))
    return out


def need(p: ProfileSpec) -> Resources:
    """What one replica of a profile takes."""
    n = max(p.nodes, 1)
    return Resources(gpus=p.gpus * n, cpu_cores=p.cpu_cores * n, memory_gb=p.memory_gb * n)


def plus(a: Resources, b: Resources, sign: int = 1) -> Resources:
    return Resources(
        gpus=a.gpus + sign * b.gpus,
        cpu_cores=a.cpu_cores + sign * b.cpu_cores,
        memory_gb=add_gb(a.memory_gb, sign * b.memory_gb),
    )


def count(state: State, owner: str, amount: Resources, sign: int) -> None:
    """Add (or take away) an amount to its owner and every ancestor."""
    if owner:
        _add(state.usage, owner, amount.gpus, amount.cpu_cores, amount.memory_gb, sign)


def count_shard(state: State, owner: str, sh: Shard, sign: int) -> None:
    """Add (or take away) what a shard holds (`shard_amount`) to its owner
    and every ancestor: the fold does at every shard's start and end, so
    without making the amount first (benchmarks/replay.py --mixes decisions)."""
    if owner:
        _add(state.usage, owner, len(sh.gpus), sh.cpu_cores, sh.memory_gb, sign)


def add(usage: dict[str, Resources], owner: str, amount: Resources, sign: int = 1) -> None:
    """Add an amount to an owner and its ancestors in a usage map."""
    if owner:
        _add(usage, owner, amount.gpus, amount.cpu_cores, amount.memory_gb, sign)


def _add(usage: dict[str, Resources], owner: str, gpus: int, cores: int, memory: float, sign: int) -> None:
    """`add` of an amount given by its parts: each owner's new usage is what
    `plus` makes of it, computed here without one Resources made per step
    (the fold's quota bookkeeping, benchmarks/replay.py --mixes decisions)."""
    if not (gpus or cores or memory):
        return
    gpus, cores, memory = sign * gpus, sign * cores, sign * memory
    for o in ancestors(owner):
        u = usage.get(o)
        if u is None:
            g, c, m = gpus, cores, add_gb(0.0, memory)  # 0.0 + memory, as plus(Resources(), ...): no -0.0
        else:
            g, c, m = u.gpus + gpus, u.cpu_cores + cores, add_gb(u.memory_gb, memory)
        if g or c or m:
            usage[o] = Resources(gpus=g, cpu_cores=c, memory_gb=m)
        else:
            usage.pop(o, None)


def over_limit(state: State, owner: str, amount: Resources, pending: dict[str, Resources] | None = None) -> str:
    """`over_limit_cause` in words ("" when within the limits)."""
    why = over_limit_cause(state, owner, amount, pending)
    return render(why) if why is not None else ""


def over_limit_cause(
    state: State, owner: str, amount: Resources, pending: dict[str, Resources] | None = None,
) -> Cause | None:
    """Why taking `amount` more would put the owner or an ancestor past its
    limit, or None when it would not. `pending`: what placements not folded
    yet (earlier in the same pass) add, per owner and ancestor."""
    if not state.owners:
        return None
    for o in ancestors(owner):
        q = state.owners.get(o)
        if q is None:
            continue
        lim = q.limit
        if lim.gpus is None and lim.cpu_cores is None and lim.memory_gb is None:
            continue  # no limit to pass (most owners: a guarantee alone)
        used = state.usage.get(o, Resources())
        if pending and o in pending:
            used = plus(used, pending[o])
        for what, have, more, most in (
            ("gpus", used.gpus, amount.gpus, lim.gpus),
            ("cpu_cores", used.cpu_cores, amount.cpu_cores, lim.cpu_cores),
            ("memory_gb", used.memory_gb, amount.memory_gb, lim.memory_gb),
        ):
            if most is not None and more and have + more > most + 1e-9:
                return cause(K.OVER_LIMIT, owner=o, resource=what, held=float(have), more=float(more), limit=float(most))
    return None


def governing(state: State, owner: str) -> str:
    """The nearest owner up the tree with a guarantee ("" when none has one)."""
    for o in ancestors(owner):
        q = state.owners.get(o)
        if q is not None and _any(q.guarantee):
            return o
    return ""


def _any(r: Resources) -> bool:
    return bool(r.gpus or r.cpu_cores or r.memory_gb)


def _within(used: Resources, g: Resources) -> bool:
    """Within a guarantee, on what it guarantees: a guarantee of GPUs alone
    says nothing of the cores that come with them."""
    return (
        (not g.gpus or used.gpus <= g.gpus)
        and (not g.cpu_cores or used.cpu_cores <= g.cpu_cores)
        and (not g.memory_gb or used.memory_gb <= g.memory_gb + 1e-9)
    )


def within_guarantee(state: State, owner: str, amount: Resources) -> bool:
    """Whether the owner would still be within its guarantee holding `amount`
    more: such an owner takes back what others borrowed."""
    g = governing(state, owner)
    if not g:
        return False
    used = plus(state.usage.get(g, Resources()), amount)
    return _within(used, state.owners[g].guarantee)


def borrowed(state: State, replicas: Iterable[Replica] | None = None) -> set[str]:
    """Replicas held past their owner's guarantee: of each governing owner's
    replicas, oldest first, those that take it past what it is guaranteed;
    and every replica of an owner with no guarantee up its tree."""
    by_governor: dict[str, list[Replica]] = {}
    out: set[str] = set()
    for rep in state.replicas.values() if replicas is None else replicas:
        if rep.state == "stopping":
            continue
        g = governing(state, rep.owner)
        if not g:
            out.add(rep.id)
        else:
            by_governor.setdefault(g, []).append(rep)
    for g, reps in by_governor.items():
        guarantee = state.owners[g].guarantee
        used = Resources()
        for rep in sorted(reps, key=lambda r: (r.placed_at, r.id)):
            used = plus(used, replica_amount(rep))
            if not _within(used, guarantee):
                out.add(rep.id)
    return out


class QuotaRow(msgspec.Struct, kw_only=True):
    owner: str
    guarantee: Resources
    limit: Limit
    usage: Resources
    borrowed: Resources


def report(state: State) -> list[QuotaRow]:
    """Each owner the catalog names, and each owner replicas run for: its
    guarantee, limit, usage and what of it is borrowed (`llmgw ctl get quotas`)."""
    lent = borrowed(state)
    owed: dict[str, Resources] = {}
    for rep in state.replicas.values():
        if rep.id in lent:
            amount = replica_amount(rep)
            for o in ancestors(rep.owner):
                owed[o] = plus(owed.get(o, Resources()), amount)
    names = sorted(set(state.owners) | set(state.usage))
    return [
        QuotaRow(
            owner=o,
            guarantee=state.owners[o].guarantee if o in state.owners else Resources(),
            limit=state.owners[o].limit if o in state.owners else Limit(),
            usage=state.usage.get(o, Resources()),
            borrowed=owed.get(o, Resources()),
        )
        for o in names
    ]
