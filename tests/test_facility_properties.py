"""Properties of the facility's rules (issue 14) over generated fleets with
locations (agents' labels and operators'), GPU power limits, declared
draw, caps, holds and drains, and measured draw (tests/fleet_strategies.py,
World(facility=True)): every dimension core/scheduling/facility.py reads.

- no placement takes a capped domain past its cap (as the fold counts it,
  crediting what a replica replaced in place hands over);
- nothing new is placed in a held domain;
- every multi-node replica placed keeps within its profile's domain;
- a drain never stops a replica while that leaves its model below its
  desired count (its replacement serves first);
- decide's own count agrees with the fold's: a fresh decision is never
  voided for a hold or a cap;
- replay gives the live state, and verify decides every pass again the same;
- what placement keeps from pass to pass beside the live state (the node
  index, the cells' orders) is what a pass makes afresh on a copy.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.core.contract import events as ev
from llmgw.core.folding import facility_facts
from llmgw.core.contract.catalog import profile_named
from llmgw.core.rules.decide import decide
from llmgw.core.folding.fold import apply, copy_state
from llmgw.core.simulation.history import verify
from llmgw.core.folding.nodeindex import index_of, track
from llmgw.core.scheduling.placement import Inventory
from llmgw.core.rules.scaling import desired
from llmgw.core.folding.state import State

from .fleet_strategies import Step, World

STEPS = int(os.environ.get("LLMGW_PROPERTY_STEPS", "40"))
SETTINGS = settings(
    max_examples=int(os.environ.get("LLMGW_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
pytestmark = pytest.mark.timeout(900)


def replay(records) -> State:
    state = State()
    for seq, subject, data in records:
        apply(state, seq, subject, data)
    return state


def applied_placements(step: Step, after: State) -> list[ev.PlaceReplica]:
    """The placements of a Decided step that the fold applied (not voided)."""
    if not isinstance(step.event, ev.Decided):
        return []
    before = step.state_before()
    return [
        a for a in step.event.actions
        if isinstance(a, ev.PlaceReplica) and a.replica in after.replicas and a.replica not in before.replicas
    ]


def assert_facility_rules_kept(step: Step, after: State) -> None:
    placed = applied_placements(step, after)
    if not placed:
        return
    before = step.state_before()
    nodes = after.nodes
    touched: set[str] = set()
    added: dict[str, float] = {}  # domain -> what the new shards draw in it
    for a in placed:
        rep = after.replicas[a.replica]
        for s in rep.shards:
            ds = facility_facts.domains_of(nodes[s.node])
            held = [d for d in ds if d in before.holds]
            assert not held, f"{a.replica} placed on {s.node} in held {held}"
            if s.power_w:  # a shard that draws nothing takes no domain past its cap (it may be there already)
                for d in ds:
                    if d in after.budgets:
                        touched.add(d)
                        added[d] = added.get(d, 0.0) + s.power_w
        spec = after.models[rep.model].spec
        profile = profile_named(spec, rep.profile)
        if profile is not None and profile.keep_within and len(rep.shards) > 1:
            within = {facility_facts.location(nodes[s.node]).get(profile.keep_within, "") for s in rep.shards}
            assert len(within) == 1 and "" not in within, f"{a.replica} spans {within} ({profile.keep_within})"
    if not touched:
        return
    # What the replicas replaced in place still count for, handed over to their replacements.
    credit = dict.fromkeys(touched, 0.0)
    for a in placed:
        old = after.replicas.get(a.replaces) if a.replaces else None
        if old is None:
            continue
        took = {s.node for s in a.shards}
        for sh in old.shards:
            if sh.node in took and sh.state not in ("failed", "stopped"):
                for d in facility_facts.domains_of(nodes[sh.node]):
                    if d in credit:
                        credit[d] += facility_facts.counted(nodes[sh.node], sh)
    draws = facility_facts.domain_draws(after, touched)
    for d in touched:
        if added[d] <= credit[d]:
            continue  # in place of what draws as much: nothing more than before (the domain may be past its cap already)
        assert draws[d] - credit[d] <= after.budgets[d] + 1e-6, (
            f"{d} counted at {draws[d]:g} W (less {credit[d]:g} handed over) past its cap of {after.budgets[d]:g} W")


def assert_domain_draws_are_derived(state: State) -> None:
    """What the fold keeps of each domain's draw (state.domain_draw) is what
    summing its nodes afresh gives, for every domain some node is in."""
    fresh = facility_facts.domain_draws(state, state.domain_nodes)
    assert state.domain_draw.keys() <= fresh.keys(), f"draws kept for domains no node is in: {state.domain_draw}"
    for d, w in fresh.items():
        assert abs(state.domain_draw.get(d, 0.0) - w) < 1e-6, f"{d} kept at {state.domain_draw.get(d)} W, counted {w} W"


def assert_fresh_decisions_not_voided_for_the_facility(step: Step, after: State) -> None:
    if not (step.fresh and isinstance(step.event, ev.Decided)):
        return
    before = step.state_before()
    new = after.voided[len(before.voided):] if after.voided_count - before.voided_count <= len(after.voided) else []
    for v in new:
        assert "is held:" not in v.reason and " would draw " not in v.reason, v


def assert_drains_keep_models_serving(step: Step, after: State) -> None:
    """A replica restarted out of a drained domain is stopped only once its
    model has its desired count ready without it."""
    if not (step.fresh and isinstance(step.event, ev.Decided)):
        return
    before = step.state_before()
    for a in step.event.actions:
        if not isinstance(a, ev.StopReplica) or a.reason != "restarted: its replacement serves":
            continue
        rep = before.replicas.get(a.replica)
        if rep is None or not rep.restart_reason.endswith(tuple(
                f"is held for draining: {h.reason or 'no reason given'}" for h in before.holds.values())):
            continue
        model = before.models[rep.model]
        ready = sum(1 for r in before.replicas.values()
                    if r.model == rep.model and r.id != rep.id and r.state == "ready" and r.restart not in
                    ("replacing", "in place"))
        assert ready >= desired(model, step.event.at), f"{a.replica} stopped with {ready} ready of its model"


@SETTINGS
@given(st.data())
def test_placements_keep_holds_caps_and_keep_within(data):
    world = World(data, facility=True, stale=False, malformed=False)
    for step in world.run(STEPS):
        assert_facility_rules_kept(step, world.live)
        assert_fresh_decisions_not_voided_for_the_facility(step, world.live)
        assert_domain_draws_are_derived(world.live)


@SETTINGS
@given(st.data())
def test_stale_and_rogue_decisions_never_break_holds_or_caps(data):
    # Decisions taken on an older state (a hold or a cap came since) and
    # made-up ones: the fold voids what no longer holds.
    world = World(data, facility=True, rogue=True)
    for step in world.run(STEPS):
        assert_facility_rules_kept(step, world.live)
        assert_domain_draws_are_derived(world.live)


@SETTINGS
@given(st.data())
def test_a_drain_never_takes_a_model_below_desired(data):
    world = World(data, facility=True, stale=False, malformed=False, warm=True, plain=True, min_steps=20,
                  forgetful=False)
    for step in world.run(STEPS + 20):
        assert_drains_keep_models_serving(step, world.live)
        assert_facility_rules_kept(step, world.live)


@SETTINGS
@given(st.data())
def test_replay_gives_the_live_state_and_verify_decides_the_same(data):
    world = World(data, facility=True, stale=False)
    passes = 0
    for step in world.run(STEPS):
        passes += isinstance(step.event, ev.Decided)
    assert replay(world.log) == world.live
    checked, differences = verify(world.log)
    assert (checked, differences) == (passes, [])


def kept_cell_orders_are_fresh(state: State) -> bool:
    """The cells' orders kept from pass to pass (facility_search's
    `_cell_orders`), brought up to date as a
    pass's first search does, are those a copy's pass makes whole."""
    inv = Inventory(state)
    if not inv._fac.active or not inv._fac.cells().nodes:
        return True
    kept = [list(order) for order in inv._cell_orders()]
    return kept == Inventory(copy_state(state))._cell_orders()


@SETTINGS
@given(st.data())
def test_what_placement_keeps_from_pass_to_pass_is_what_a_copy_makes_afresh(data):
    # Nodes placed on, stopped, lost, registered again, relabelled, and
    # decisions that do not land (stale, made up): the index and the orders
    # follow the fold, and a pass on the live state decides as on a copy.
    world = World(data, facility=True, rogue=True)
    track(world.live).sync(world.live)
    for _ in world.run(STEPS):
        assert index_of(world.live).check(world.live) == []
        assert kept_cell_orders_are_fresh(world.live)
        now = world.now + data.draw(st.integers(0, 100))
        assert decide(world.live, now) == decide(copy_state(world.live), now)
