"""A waiting reason counted by the index's classes (core/scheduling/refusals.py) is the
one counted node by node (explain's `profile_fit`, fit.refusals_of): the
same record, so the same words, on random fleets as a pass changes them.

The fleets have what each class of refusals.py counts apart: nodes not
ready and cordoned, simulated ones, pools, fabrics and nodes without one,
GPUs of two kinds on one node, GPU power limits alike and not, memory and
cores that run short, a port range of two ports, racks and PDUs with caps
that bind, a hold; profiles of one node and of two, with a declared draw
and without, CPU-only ones, keep_within; and the pass's own placements and
a stop (a replacement in place: a draw handed over) in between.
"""

from __future__ import annotations

import random

import pytest

from llmgw.core.contract import events as ev
from llmgw.core.scheduling.explain import profile_fit
from llmgw.core.scheduling.fit import refusals_of, render_refusals
from llmgw.core.folding.fold import apply
from llmgw.core.contract.policy import Policy
from llmgw.core.scheduling.placement import Inventory
from llmgw.core.scheduling.refusals import count_refusals
from llmgw.core.folding.state import State

from .test_facility_search import caps_and_a_hold

T0 = 1_760_000_000.0


def _publish(state: State, event: ev.Event) -> None:
    apply(state, state.seq + 1, ev.subject_for(event), ev.encode(event))


def _world(rng: random.Random) -> State:
    state = State()
    _publish(state, ev.PolicyApplied(at=T0 - 1, policy=Policy(admission="open")))
    racks = rng.randint(1, 4)
    for i in range(rng.randint(6, 40)):
        labels = {"llmgw.io/pool": rng.choice(["serve", "serve", "batch"])}
        if rng.random() < 0.8:
            labels["llmgw.io/fabric"] = f"f{rng.randrange(3)}"
        where = rng.random()
        rack = rng.randrange(racks)
        if where < 0.8:
            labels.update({"llmgw.io/rack": f"r{rack}", "llmgw.io/pdu": f"p{rack}-{rng.randrange(2)}"})
        elif where < 0.9:
            labels["llmgw.io/rack"] = f"r{rack}"
        n_gpus = rng.choice([0, 2, 4, 8, 8])
        limit = rng.choice([0.0, 400.0, 700.0, 700.0])
        mixed = rng.random() < 0.15
        gpus = [
            ev.Gpu(index=g, model="NVIDIA A100-SXM4-80GB" if mixed and g % 2 else "NVIDIA H100 80GB HBM3",
                   memory_gb=40.0 if mixed and g % 2 else 80.0,
                   power_w=limit if rng.random() < 0.85 else rng.choice([300.0, 700.0]))
            for g in range(n_gpus)
        ]
        ports = rng.random() < 0.1
        _publish(state, ev.NodeRegistered(
            at=T0, node=f"n{i:03d}", gpus=gpus, memory_gb=rng.choice([0.0, 256.0, 512.0]),
            cpu_cores=rng.choice([0, 32, 64]), labels=labels, agent=f"a/{i}",
            simulated=rng.random() < 0.1, port_first=20000 if ports else 0, port_last=20001 if ports else 0))
        if rng.random() < 0.08:
            _publish(state, ev.NodeLost(at=T0 + 0.5, node=f"n{i:03d}", reason="gone"))
    caps_and_a_hold(state, rng, racks, 2, ([1_000.0, 3_000.0, 9_000.0], [700.0, 1_500.0, 3_000.0]), 0.3, "pdu/p{}-0")
    return state


def _profile(rng: random.Random, i: int) -> ev.ProfileSpec:
    nodes = rng.choice([1, 1, 1, 2])
    gpus = rng.choice([0, 1, 1, 2, 4]) if nodes == 1 else rng.choice([1, 2])
    return ev.ProfileSpec(
        name=f"p{i}", gpus=gpus, nodes=nodes, engine="sim" if rng.random() < 0.3 else "vllm",
        gpu_model=rng.choice(["", "", "H100"]), gpu_memory_gb=rng.choice([0.0, 80.0]),
        memory_gb=rng.choice([0.0, 64.0, 300.0]), cpu_cores=rng.choice([0, 8, 40]),
        power_w=rng.choice([0.0, 0.0, 500.0]), pool=rng.choice(["", "", "serve"]),
        keep_within=rng.choice(["", "rack"]) if nodes > 1 else "",
    )


def _same(inv: Inventory, p: ev.ProfileSpec, seed: int) -> None:
    plain = refusals_of(profile_fit(inv, p))
    counted = count_refusals(inv, p)
    assert render_refusals(counted) == render_refusals(plain), f"seed {seed}, profile {p}"
    assert counted == plain, f"seed {seed}, profile {p}"


@pytest.mark.parametrize("seed", range(120))
def test_the_counts_by_class_are_the_counts_node_by_node(seed):
    rng = random.Random(seed)
    state = _world(rng)
    inv = Inventory(state)
    profiles = [_profile(rng, i) for i in range(5)]
    spreads: dict[str, dict[str, int]] = {p.name: {} for p in profiles}
    placed = []
    for step in range(rng.randint(5, 25)):
        p = rng.choice(profiles)
        shards = inv.place(p, f"{p.name}-{step}", spreads[p.name])
        if shards:
            placed.append(shards)
        if rng.random() < 0.3:
            for q in profiles:
                _same(inv, q, seed)
    for q in profiles:
        _same(inv, q, seed)


def test_a_stop_handed_over_counts_its_node_by_itself():
    """A replica stopped for its replacement in place hands its draw to its
    own node only (PassFacility.credit): its domain is counted node by node."""
    for seed in range(60):
        rng = random.Random(1000 + seed)
        state = _world(rng)
        spec = ev.ModelSpec(name="m", profiles=[ev.ProfileSpec(name="any", gpus=1, power_w=300.0)], min_replicas=3)
        _publish(state, ev.ModelApplied(at=T0 + 3, model=spec))
        from llmgw.core.rules.decide import decide

        actions = decide(state, T0 + 10)
        _publish(state, ev.Decided(at=T0 + 10, basis=state.seq, actions=actions, leader="t"))
        inv = Inventory(state)
        for rep in list(state.replicas.values())[:2]:
            inv.release(rep.shards, handover=True)
        profiles = [_profile(rng, i) for i in range(4)]  # (held: the pass's caches know a profile by its id)
        for p in profiles:
            _same(inv, p, seed)
