"""decide(state, now): what the control plane should do next, as plain data.

Pure given `now`: the same state and time give the same actions, which is what
lets `llmgw replay --verify` re-run every recorded pass and compare.

A pass returns everything it decided as one list; the shell publishes it as
one `Decided` message, so what must happen together (a failed replica stopped
and its replacement placed) cannot be split by a crash. A pass is bounded
(`MAX_ACTIONS`) so its message stays well under the server's payload limit;
what is left is decided by the next pass.
"""

from __future__ import annotations

from . import events as ev
from .catalog import max_replicas
from .fold import replica_number
from .placement import Inventory, first_fit, why_no_fit
from .state import Replica, State

MAX_ACTIONS = 500


def decide(state: State, now: float) -> list[ev.Action]:
    actions: list[ev.Action] = []
    inv = Inventory(state)

    # Strays first: they hold GPUs that placements are waiting for.
    for name in inv.nodes:
        for shard, stray in state.nodes[name].strays.items():
            if not stray.stopping:
                actions.append(ev.StopStray(node=name, shard=shard, generation=stray.generation, reason=stray.reason))

    by_model: dict[str, list[Replica]] = {}
    for rep in state.replicas.values():
        if rep.state == "stopping":
            continue
        why = _why_stop(state, rep)
        if why:
            actions.append(ev.StopReplica(replica=rep.id, reason=why))
        else:
            by_model.setdefault(rep.model, []).append(rep)

    for name in sorted(state.models):
        if len(actions) >= MAX_ACTIONS:
            break
        model = state.models[name]
        spec = model.spec
        live = by_model.get(name, [])
        want = spec.min_replicas
        if len(live) > max_replicas(spec):
            # The newest first, and those not yet serving before those that are.
            extra = sorted(live, key=lambda r: (r.state == "ready", -r.placed_at, -replica_number(r.id)))
            for rep in extra[: len(live) - max_replicas(spec)]:
                actions.append(ev.StopReplica(replica=rep.id, reason=f"{name} wants at most {max_replicas(spec)}"))
            continue
        on_nodes = {s.node for r in live for s in r.shards}
        number = state.replica_numbers.get(name, 1)
        have = len(live)
        waiting = ""
        while have < want and len(actions) < MAX_ACTIONS:
            placed = _place_one(inv, model.spec, model.fingerprints, f"{name}-{number}", have, on_nodes)
            if placed is None:
                waiting = why_no_fit(inv, spec.profiles)
                break
            actions.append(placed)
            on_nodes.update(s.node for s in placed.shards)
            number += 1
            have += 1
        # Said only when it changes: a placement clears it at fold time.
        if waiting != model.waiting and (waiting or have == len(live)):
            actions.append(ev.ModelWaiting(model=name, reason=waiting))
    return actions[:MAX_ACTIONS]


def _place_one(
    inv: Inventory, spec: ev.ModelSpec, fingerprints: dict[str, str], replica: str, have: int, on_nodes: set[str]
) -> ev.PlaceReplica | None:
    """The first profile, in the catalog's order of preference, that fits."""
    for profile in spec.profiles:
        shards = first_fit(inv, profile, replica, on_nodes)
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
