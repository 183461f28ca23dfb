"""The facility's cell search (core/scheduling/facility_search.py) makes the same choice
as the rule read plainly: of every node that fits (placement's own reasons,
the facility's included), the lowest level (its rack's count of the model's
replicas, then its PDU's, then its own; a missing label counts the node by
itself), then the fewest free GPUs that are enough, then the name.

Random located fleets: racks and PDUs, nodes that say only one of them or
neither, GPU power limits alike and not, caps that bind, a hold; several
models placing in turn into one pass's inventory, so that each one's cells
are changed by the others' placements (the cells' versions and cursors), and
a stop in the middle (room made: every refusal of the pass starts again);
replicas running already, from a first pass decided and folded.
"""

from __future__ import annotations

import random

import pytest

from llmgw.core.contract import events as ev
from llmgw.core.rules.decide import decide
from llmgw.core.folding.fold import apply
from llmgw.core.scheduling.placement import Inventory, replicas_per_node
from llmgw.core.folding.state import State

T0 = 1_760_000_000.0


def _publish(state: State, event: ev.Event) -> None:
    apply(state, state.seq + 1, ev.subject_for(event), ev.encode(event))


def _world(rng: random.Random) -> tuple[State, list[ev.ModelSpec]]:
    state = State()
    racks = rng.randint(2, 5)
    pdus_per_rack = rng.randint(1, 3)
    for i in range(rng.randint(12, 48)):
        rack, pdu = rng.randrange(racks), rng.randrange(pdus_per_rack)
        labels = {"llmgw.io/pool": rng.choice(["serve", "serve", "batch"])}
        where = rng.random()
        if where < 0.8:
            labels.update({"llmgw.io/rack": f"r{rack}", "llmgw.io/pdu": f"p{rack}-{pdu}"})
        elif where < 0.87:
            labels["llmgw.io/rack"] = f"r{rack}"
        elif where < 0.94:
            labels["llmgw.io/pdu"] = f"p{rack}-{pdu}"
        if rng.random() < 0.1:
            labels["llmgw.io/site"] = "s1"
        n_gpus = rng.choice([2, 4, 8, 8])
        limit = rng.choice([0.0, 400.0, 700.0, 700.0])
        gpus = [
            ev.Gpu(index=g, model="NVIDIA H100 80GB HBM3", memory_gb=80.0,
                   power_w=limit if rng.random() < 0.9 else rng.choice([300.0, 700.0]))
            for g in range(n_gpus)
        ]
        _publish(state, ev.NodeRegistered(at=T0, node=f"n{i:03d}", gpus=gpus, memory_gb=512.0, cpu_cores=64,
                                          labels=labels, agent=f"a/{i}"))
    caps_and_a_hold(state, rng, racks, pdus_per_rack, ([2_000.0, 5_000.0, 9_000.0], [1_500.0, 3_000.0, 6_000.0]),
                    0.4, "rack/r{}")
    specs = []
    for m in range(rng.randint(1, 4)):
        gpus = rng.choice([1, 1, 2, 4])
        power = rng.choice([0.0, 0.0, 500.0])
        profiles = [
            ev.ProfileSpec(name="any", gpus=gpus, memory_gb=rng.choice([0.0, 64.0, 200.0]), power_w=power,
                           pool=rng.choice(["", "", "serve"]))
        ]
        specs.append(ev.ModelSpec(name=f"m{m}", profiles=profiles, min_replicas=rng.randint(3, 30)))
    return state, specs


def caps_and_a_hold(state: State, rng: random.Random, racks: int, pdus_per_rack: int, watts: tuple[list, list],
                    hold_chance: float, held: str) -> None:
    """Caps on some racks (`rack/rN`) and PDUs (`pdu/pN-M`), of these watts, and maybe a hold on `held` of a rack's number."""
    budgets = {}
    for r in range(racks):
        if rng.random() < 0.7:
            budgets[f"rack/r{r}"] = rng.choice(watts[0])
        for p in range(pdus_per_rack):
            if rng.random() < 0.5:
                budgets[f"pdu/p{r}-{p}"] = rng.choice(watts[1])
    if budgets:
        _publish(state, ev.FacilityApplied(at=T0 + 1, budgets=budgets))
    if rng.random() < hold_chance:
        _publish(state, ev.DomainHeld(at=T0 + 2, domain=held.format(rng.randrange(racks)), reason="maintenance"))


def _level(state: State, spread: dict[str, int], name: str) -> tuple[int, int, int]:
    """The rule, plainly: the node's rack's count, its PDU's, its own."""
    loc = dict(d.split("/", 1) for d in state.located.get(name, ()))
    own = spread.get(name, 0)

    def count(kind: str) -> int:
        if kind not in loc:
            return own
        return sum(n for node, n in spread.items() if f"{kind}/{loc[kind]}" in state.located.get(node, ()))

    return (count("rack"), count("pdu"), own)


def _plain_choice(inv: Inventory, p: ev.ProfileSpec, spread: dict[str, int]) -> str | None:
    best = None
    for v in inv.ready():
        if len(v.free) < p.gpus or inv.reasons(v, p):
            continue
        key = (_level(inv._state, spread, v.name), len(v.free), v.name)
        if best is None or key < best:
            best = key
    return best[2] if best else None


def _first_pass(state: State, specs: list[ev.ModelSpec], rng: random.Random) -> None:
    """The catalog applied and a first pass decided and folded, small: some
    replicas run already (the models' spreads start from them)."""
    for spec in specs:
        _publish(state, ev.ModelApplied(at=T0 + 3, model=spec))
    actions = decide(state, T0 + 10, rng.choice([2048, 8192]))
    _publish(state, ev.Decided(at=T0 + 10, basis=state.seq, actions=actions, leader="test"))


@pytest.mark.parametrize("seed", range(80))
def test_cell_search_makes_the_plain_scans_choice(seed):
    rng = random.Random(seed)
    state, specs = _world(rng)
    _first_pass(state, specs, rng)
    inv = Inventory(state)
    spreads = {
        s.name: replicas_per_node([r for r in state.replicas.values() if r.model == s.name]) for s in specs
    }
    running = list(state.replicas.values())
    counts = {"placed": 0, "refused": 0}
    # The models take turns, a few replicas each, as passes of many models do.
    for round_ in range(6):
        for spec in specs:
            p, spread = spec.profiles[0], spreads[spec.name]
            for i in range(rng.randint(1, 6)):
                want = _plain_choice(inv, p, spread)
                shards = inv.place(p, f"{spec.name}-x{round_}-{i}", spread)
                got = shards[0].node if shards else None
                assert got == want, f"seed {seed}: {spec.name} placed on {got}, the rule says {want}"
                if shards is None:
                    counts["refused"] += 1
                    break
                counts["placed"] += 1
        if round_ in (2, 4) and running:
            # Replicas stopped in the pass: their GPUs and draw come back
            # (every refusal of the pass may be stale), as a restart's would;
            # those under a cap first, where it makes a difference.
            capped = [r for r in running if any(d in state.budgets for d in state.located.get(r.shards[0].node, ()))]
            for rep in rng.sample(capped or running, min(3, len(capped or running))):
                inv.release(rep.shards)
                running.remove(rep)
    assert counts["placed"] + counts["refused"] > 0


def test_cell_search_scenarios_meet_caps_holds_and_loose_nodes():
    """The seeds above are not idle: between them, placements are refused by
    a cap and by a hold on their way, and nodes that say no rack are placed on."""
    met_cap = met_hold = loose = 0
    for seed in range(80):
        rng = random.Random(seed)
        state, specs = _world(rng)
        _first_pass(state, specs, rng)
        for rep in state.replicas.values():
            met_cap += any(" would draw " in x for x in rep.rejections)
            met_hold += any(" is held" in x for x in rep.rejections)
            loose += any(not any(d.startswith("rack/") for d in state.located.get(s.node, ())) for s in rep.shards)
    assert met_cap and met_hold and loose


def test_a_stop_under_a_cap_lets_the_cells_it_refused_be_looked_at_again():
    """A rack at its cap refuses both its cells; a stop in the pass on one
    of them makes room for the other, whose node is then the best fit: the
    search must look again at what it passed over (PassFacility.epoch)."""
    state = State()
    for name, pdu in (("a", "p0"), ("b", "p1")):
        gpus = [ev.Gpu(index=g, model="NVIDIA H100 80GB HBM3", memory_gb=80.0, power_w=500.0) for g in range(4)]
        _publish(state, ev.NodeRegistered(at=T0, node=name, gpus=gpus, memory_gb=512.0, cpu_cores=64,
                                          labels={"llmgw.io/rack": "r0", "llmgw.io/pdu": pdu}, agent=name))
    big = ev.ModelSpec(name="big", profiles=[ev.ProfileSpec(name="any", gpus=2)], min_replicas=2)
    small = ev.ModelSpec(name="small", profiles=[ev.ProfileSpec(name="any", gpus=1)], min_replicas=1)
    for spec in (big, small):
        _publish(state, ev.ModelApplied(at=T0 + 1, model=spec))
    # Two replicas of `big`, one on each node (spread); then a cap at exactly their draw.
    actions = [a for a in decide(state, T0 + 2) if isinstance(a, ev.PlaceReplica) and a.model == "big"]
    _publish(state, ev.Decided(at=T0 + 2, basis=state.seq, actions=actions, leader="test"))
    assert sorted(s.node for r in state.replicas.values() for s in r.shards) == ["a", "b"]
    _publish(state, ev.FacilityApplied(at=T0 + 3, budgets={"rack/r0": 2000.0}))
    inv = Inventory(state)
    p, spread = small.profiles[0], {}
    assert inv.place(p, "small-1", spread) is None  # the rack is at its cap
    on_a = next(r for r in state.replicas.values() if r.shards[0].node == "a")
    inv.release(on_a.shards)  # a has 4 GPUs free now, b still 2: b is the best fit
    assert _plain_choice(inv, p, spread) == "b"
    shards = inv.place(p, "small-1", spread)
    assert shards is not None and shards[0].node == "b"


def _fabric_world(rng: random.Random) -> State:
    """Fabrics of consecutive nodes in racks and PDUs of consecutive nodes
    (as a hall is cabled), caps that bind, models of two-node replicas and
    of one-node ones."""
    state = State()
    per_fabric, per_rack, per_pdu = rng.choice([4, 6, 8]), rng.choice([6, 8]), rng.choice([2, 3, 4])
    for i in range(rng.randint(24, 64)):
        labels = {"llmgw.io/fabric": f"ib-{i // per_fabric}", "llmgw.io/rack": f"r{i // per_rack}",
                  "llmgw.io/pdu": f"p{i // per_pdu}"}  # fmt: skip
        gpus = [ev.Gpu(index=g, model="NVIDIA H100 80GB HBM3", memory_gb=80.0, power_w=700.0)
                for g in range(rng.choice([2, 4, 8]))]  # fmt: skip
        _publish(state, ev.NodeRegistered(at=T0, node=f"n{i:03d}", gpus=gpus, memory_gb=512.0, cpu_cores=64,
                                          labels=labels, agent=f"a/{i}"))
    budgets = {f"pdu/p{p}": rng.choice([2_800.0, 4_200.0, 7_000.0]) for p in range(32) if rng.random() < 0.7}
    budgets.update({f"rack/r{r}": rng.choice([8_400.0, 16_800.0]) for r in range(11) if rng.random() < 0.5})
    _publish(state, ev.FacilityApplied(at=T0 + 1, budgets=budgets))
    for m in range(rng.randint(2, 6)):
        profile = ev.ProfileSpec(name="any", gpus=rng.choice([1, 2]), nodes=rng.choice([1, 2, 2, 2]))
        spec = ev.ModelSpec(name=f"m{m}", profiles=[profile], min_replicas=rng.randint(2, 16))
        _publish(state, ev.ModelApplied(at=T0 + 2, model=spec))
    return state


def _cold_start(state: State) -> list:
    """Every pass decided and folded until nothing is left: the passes' actions."""
    out = []
    for i in range(8):
        actions = decide(state, T0 + 10 + i, 4096)
        if not actions:
            break
        out.append(actions)
        _publish(state, ev.Decided(at=T0 + 10 + i, basis=state.seq, actions=actions, leader="test"))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_two_node_replicas_under_binding_caps_are_never_voided(seed):
    """Fabrics across racks and PDUs whose caps bind: every placement the
    search makes (the shards of one replica checked against the caps
    together, facility_pass.Together) holds when folded."""
    state = _fabric_world(random.Random(seed))
    assert _cold_start(state)
    assert state.voided_count == 0


@pytest.mark.parametrize("seed", range(5))
def test_a_pass_leaves_no_cycles_for_the_collector(seed):
    """The control plane freezes what is alive after each pass (control/heap.py):
    a pass's working data caught in a reference cycle is frozen with it and
    stays until the hourly reclaim. A model's Levels and its heaps of cursors
    held each other so: some 7,000 objects a cold start
    (benchmarks/placement.py --facility), and one more each pass."""
    import gc

    rng = random.Random(seed)
    state, specs = _world(rng)
    for spec in specs:
        _publish(state, ev.ModelApplied(at=T0 + 3, model=spec))
    gc.collect()
    gc.disable()
    try:
        decide(state, T0 + 10)
        found = gc.collect()
    finally:
        gc.enable()
    assert found == 0, f"a pass left {found} objects in reference cycles"


def test_the_cells_orders_kept_from_pass_to_pass_follow_a_pass_that_never_searched_them():
    """A pass that takes from located nodes without a search by cell (a
    multi-node replica's, a stop's) still moves them in the orders kept
    for the next pass (facility_search's `_cell_orders`): the node index it moves
    them in is not filed again where the decision lands."""
    from .test_facility_properties import kept_cell_orders_are_fresh

    state = State()
    for i in range(8):
        labels = {"llmgw.io/fabric": "ib-0", "llmgw.io/rack": f"r{i // 4}", "llmgw.io/pdu": f"p{i // 2}"}
        gpus = [ev.Gpu(index=g, model="NVIDIA H100 80GB HBM3", memory_gb=80.0, power_w=700.0) for g in range(4)]
        _publish(state, ev.NodeRegistered(at=T0, node=f"n{i}", gpus=gpus, memory_gb=512.0, cpu_cores=64,
                                          labels=labels, agent=f"a/{i}"))
    from llmgw.core.folding.nodeindex import track

    track(state)
    one = ev.ProfileSpec(name="one", gpus=1)
    _publish(state, ev.ModelApplied(at=T0 + 1, model=ev.ModelSpec(name="single", profiles=[one], min_replicas=3)))
    assert _cold_start(state)  # searched by cell: the orders are kept from here
    assert kept_cell_orders_are_fresh(state)
    two = ev.ProfileSpec(name="two", gpus=2, nodes=2)
    _publish(state, ev.ModelApplied(at=T0 + 20, model=ev.ModelSpec(name="pair", profiles=[two], min_replicas=2)))
    passes = _cold_start(state)
    assert passes and all(isinstance(a, ev.PlaceReplica) and a.model == "pair" for a in passes[0])
    assert kept_cell_orders_are_fresh(state)
