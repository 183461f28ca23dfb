"""The console's Map and Fleet views and a node's "Running now": what the
fleet runs, where, as JSON-ready data made from a folded State (now or at
any point of the log, like views.py). The Map and the Fleet view draw the
same data (`fleet_map`), each its own way (static/fleetmap.js, app.js).

WHY the map's data is columns of small numbers and not a dict per node: the
Map is the landing view and must paint 2,000 nodes in well under a second,
so every node is one short array and every repeated string (a location, a
model's name) is sent once and named by its index. The browser draws each
domain as one canvas, a cell per node (static/fleetmap.js).

WHY the Fleet view has no data of its own since issue 34: it sent 835 KB for
2,000 nodes (a dict per node, a location dict, a model name per GPU, every
domain with its zero fields), which took longer to make, send and parse than
the page took to draw; the domains' counts are sums the browser makes from
the nodes in a few milliseconds.

WHY CPU-only shards are counted here: a shard with no
GPU holds only cores and memory (a llama.cpp model on the `vm` node of the
demo), so a map made from GPUs alone never shows it. A node's models are
read from the replicas' shards, not from its GPUs.
"""

from __future__ import annotations

import urllib.parse

from ..core.folding import facility_facts
from ..core.folding.state import State

# A node's state, as a number in the map's rows (the names travel once, in `states`).
STATES = ("ready", "lost")
FREE, STRAY = -1, -2  # a GPU's model index when no shard holds it, and when one no replica claims does


def _shards_by_node(state: State) -> dict[str, list[tuple[str, object]]]:
    """node -> [(model, shard)] of every shard placed on it."""
    out: dict[str, list[tuple[str, object]]] = {}
    for r in state.replicas.values():
        for s in r.shards:
            out.setdefault(s.node, []).append((r.model, s))
    return out


def fleet_map(state: State) -> dict:
    """Every node as one row [name, place, state, gpus, cpu_used, cpu_cores,
    memory_used, memory_gb, cpu_models]: `place` an index into `places`
    (site, room, row, rack, pdu; "" where a node has no such label), `state`
    an index into `states`, `gpus` the model index on each GPU (FREE, or
    STRAY: held by a shard no replica claims), `cpu_models` the indexes of the
    models whose GPU-less shards run there. `owners` is each model's owner,
    `held` the held domains (KIND/NAME: [drain, reason]) and `power` each
    domain's [draw, cap] in watts where it has either."""
    models = sorted(state.models)
    index = {m: i for i, m in enumerate(models)}

    def model_index(name: str) -> int:
        i = index.get(name)
        if i is None:  # a replica of a model deleted since: still shown, under its name
            i = index[name] = len(models)
            models.append(name)
        return i

    shard_model: dict[str, int] = {}
    cpu_on: dict[str, set[int]] = {}
    for r in state.replicas.values():
        m = model_index(r.model)
        for s in r.shards:
            shard_model[s.id] = m
            if not s.gpus:
                cpu_on.setdefault(s.node, set()).add(m)
    places: dict[tuple[str, ...], int] = {}
    states = {s: i for i, s in enumerate(STATES)}
    state_names = list(STATES)
    rows = []
    for n in sorted(state.nodes.values(), key=lambda n: n.name):
        loc = facility_facts.location(n)
        key = tuple(loc.get(k, "") for k in facility_facts.KINDS)
        place = places.setdefault(key, len(places))
        st = states.get(n.state)
        if st is None:
            st = states[n.state] = len(state_names)
            state_names.append(n.state)
        gpus = [shard_model.get(n.used[g.index], STRAY) if g.index in n.used else FREE for g in n.gpus]
        rows.append([n.name, place, st, gpus, n.cpu_used, n.cpu_cores, round(n.memory_used, 1), round(n.memory_gb, 1),
                     sorted(cpu_on.get(n.name, ()))])
    # Each domain's draw and cap as the fold keeps them (facility_facts.domain_rows sums them afresh, at
    # twice the cost of the rest of the map).
    power = {d: [round(w), state.budgets.get(d, 0.0)] for d, w in state.domain_draw.items() if w}
    for d, cap in state.budgets.items():
        power.setdefault(d, [0, cap])
    return {
        "kinds": list(facility_facts.KINDS), "places": [list(p) for p in places], "states": state_names,
        "models": models, "owners": [state.models[m].spec.owner if m in state.models else "" for m in models],
        "nodes": rows, "held": {d: [h.drain, h.reason] for d, h in state.holds.items()}, "power": power,
    }


def _listening(shard) -> int:
    """The port a shard's engine listens on: its endpoint's, once it said one
    (a simulated node's may differ from the port placed, issue 34), else the
    port it was given."""
    port = urllib.parse.urlsplit(shard.endpoint).port if shard.endpoint else None
    return port or shard.port


def running_on(state: State, name: str) -> list[dict]:
    """What runs on node `name` now: a row per shard of every replica placed
    there (replica, model, profile, the replica's and the shard's state, its
    port, GPUs, cores and memory), in replica order."""
    out = []
    for r in sorted(state.replicas.values(), key=lambda r: (r.model, r.id)):
        for s in r.shards:
            if s.node != name:
                continue
            out.append({
                "replica": r.id, "model": r.model, "profile": r.profile, "state": r.state, "shard": s.id,
                "shard_state": s.state, "rank": s.rank, "port": _listening(s), "endpoint": s.endpoint, "gpus": list(s.gpus),
                "cpu_cores": s.cpu_cores, "memory_gb": s.memory_gb, "restart": r.restart,
            })
    return out
