"""decide(state, now): what the control plane should do next, as plain data.

Pure given `now`: the same state and time give the same actions, which is what
lets `llmgw replay --verify` re-run every recorded pass and compare.

A pass returns everything it decided as one list; the shell publishes it as
one `Decided` message, so what must happen together (a failed replica stopped
and its replacement placed) cannot be split by a crash.

A pass is bounded by the size of that message, not by a count of actions:
the limit that matters is the server's payload limit (1 MB by default), and
an action weighs anything from 60 bytes (a stop) to a few kilobytes (a
multi-node placement). Counting bytes lets a cold start place ~2,000
replicas a pass instead of 500, so it takes a few passes, not dozens, each of
which reads the state again. What is left is decided by the next pass.

A pass reads only what may need doing: the fold keeps a tally per model
(`state.tallies`) of its replicas, failed ones and unwanted ones, so a model
with as many healthy replicas as it wants is passed over without reading
them, and a fleet with nothing to do costs one look at each model and node.
"""

from __future__ import annotations

import msgspec

from . import events as ev
from .catalog import max_replicas
from .fold import replica_number
from .placement import Inventory, replicas_per_node, why_no_fit
from .state import Replica, State

# Half the server's default payload limit: room for the message's own fields
# and headers, and for a server configured tighter than the default.
MAX_PASS_BYTES = 512 * 1024
# What a Decided message weighs besides its actions (type, times, basis, leader).
_ENVELOPE_BYTES = 256

_encode = msgspec.json.Encoder().encode


class _Pass:
    """The actions of one pass, and what their message will weigh."""

    def __init__(self, budget: int) -> None:
        self.actions: list[ev.Action] = []
        self.budget = budget
        self.size = _ENVELOPE_BYTES
        self.full = False

    def add(self, action: ev.Action) -> bool:
        """Keep an action if the message has room for it; once one does not
        fit, the pass is over (later actions must not overtake it)."""
        if self.full:
            return False
        size = len(_encode(action)) + 1
        if self.size + size > self.budget and self.actions:
            self.full = True
            return False
        self.size += size
        self.actions.append(action)
        return True


def decide(state: State, now: float, budget: int = MAX_PASS_BYTES) -> list[ev.Action]:
    out = _Pass(budget)

    # Strays first: they hold GPUs that placements are waiting for.
    with_strays = sorted(n for n, node in state.nodes.items() if node.strays and node.state == "ready")
    for name in with_strays:
        for shard, stray in state.nodes[name].strays.items():
            if not stray.stopping:
                out.add(ev.StopStray(node=name, shard=shard, generation=stray.generation, reason=stray.reason))

    look = _models_to_look_at(state)
    if not look:
        return out.actions

    # One read of the replicas, for the models that need a look only.
    by_model: dict[str, list[Replica]] = {}
    for rep in state.replicas.values():
        if rep.model not in look or rep.state == "stopping":
            continue
        why = _why_stop(state, rep)
        if why:
            out.add(ev.StopReplica(replica=rep.id, reason=why))
        else:
            by_model.setdefault(rep.model, []).append(rep)

    inv = Inventory(state)  # built at its first placement, if any
    for name in sorted(n for n in look if n in state.models):
        if out.full:
            break
        _decide_model(state, inv, name, by_model.get(name, []), out)
    return out.actions


def _models_to_look_at(state: State) -> set[str]:
    """Models with a replica to stop, fewer or more replicas than they want,
    or a waiting reason to say again: the others need nothing this pass."""
    look = set()
    tallies = state.tallies
    for name, t in tallies.items():
        if t.failed or t.unwanted:
            look.add(name)
    for name, model in state.models.items():
        t = tallies.get(name)
        live = t.live if t is not None else 0
        spec = model.spec
        if live < spec.min_replicas or live > max_replicas(spec) or model.waiting:
            look.add(name)
    return look


def _decide_model(state: State, inv: Inventory, name: str, live: list[Replica], out: _Pass) -> None:
    """Scale one model to what it wants: stop the extra, place the missing,
    or say why it waits."""
    model = state.models[name]
    spec = model.spec
    most = max_replicas(spec)
    if len(live) > most:
        # The newest first, and those not yet serving before those that are.
        extra = sorted(live, key=lambda r: (r.state == "ready", -r.placed_at, -replica_number(r.id)))
        for rep in extra[: len(live) - most]:
            out.add(ev.StopReplica(replica=rep.id, reason=f"{name} wants at most {most}"))
        return
    spread = replicas_per_node(live)
    number = state.replica_numbers.get(name, 1)
    have = len(live)
    waiting = ""
    while have < spec.min_replicas and not out.full:
        placed = _place_one(inv, spec, model.fingerprints, f"{name}-{number}", have, spread)
        if placed is None:
            waiting = why_no_fit(inv, spec.profiles)
            break
        if not out.add(placed):
            return
        for s in placed.shards:
            spread[s.node] = spread.get(s.node, 0) + 1
        number += 1
        have += 1
    # Said only when it changes: a placement clears it at fold time.
    if waiting != model.waiting and (waiting or have == len(live)):
        out.add(ev.ModelWaiting(model=name, reason=waiting))


def _place_one(
    inv: Inventory, spec: ev.ModelSpec, fingerprints: dict[str, str], replica: str, have: int, spread: dict[str, int]
) -> ev.PlaceReplica | None:
    """The first profile, in the catalog's order of preference, that fits."""
    for profile in spec.profiles:
        shards = inv.place(profile, replica, spread)
        if shards is not None:
            return ev.PlaceReplica(
                replica=replica,
                model=spec.name,
                profile=profile.name,
                fingerprint=fingerprints[profile.name],
                shards=shards,
                reason=f"{spec.name} has {have} of {spec.min_replicas} replicas",
            )
    return None


def _why_stop(state: State, rep: Replica) -> str:
    """Why a replica should stop now, or "" when it should keep running."""
    model = state.models.get(rep.model)
    if model is None:
        return f"model {rep.model} was removed from the catalog"
    if rep.state == "failed":
        return f"replaced: {rep.reason}"
    if model.fingerprints.get(rep.profile) != rep.fingerprint:
        return f"replaced: profile {rep.profile} of {rep.model} changed"
    return ""
