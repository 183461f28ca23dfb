"""Property tests of preemption and quotas: random full fleets, catalogs of
every class, owners with guarantees and limits, random event sequences
(tests/quota_strategies.py's `QuotaWorld`, a `World` of
tests/fleet_strategies.py), folded as the shell folds them.

Each property is checked on every decision taken on the live state (a
"fresh" one: the control plane's), on the state it was taken on:

- a victim is one the rules allow (a lower class; the same class above its
  minimum for a model below its own; borrowed, for an owner within its
  guarantee), and never one the other way round: the victim's model could
  not, on that same state, have taken the preemptor's replicas. Over a calm
  run (nothing changes the rules) two models never take turns;
- a critical model is never left below its minimum by a preemption;
- nothing is preempted unless the preemptor then fits: with the victims'
  room released, on the state the decision was taken on (and what the pass
  placed before it), a profile of the preemptor that its owner's limits
  allow fits;
- no placement takes an owner, or an ancestor, past its limit;
- usage per owner stays derived (counted again from the shards, it is the
  same), and no decision on the live state is voided.

LLMGW_PREEMPT_EXAMPLES=1000 LLMGW_PROPERTY_STEPS=80 search deeper (minutes).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.core.contract import events as ev
from llmgw.core.folding.fold import copy_state, evolve
from llmgw.core.scheduling.placement import Inventory
from llmgw.core.rules.preempt import CLASSES, MAX_VICTIMS, MIN_LIFETIME_S, VictimIndex
from llmgw.core.rules.quota import ancestors, borrowed, governing, need, over_limit, replica_amount, report, within_guarantee
from llmgw.core.folding.state import State

from .quota_strategies import QuotaWorld
from .test_properties import assert_held_memory_cores_and_tallies_are_derived, assert_voided_not_applied, replay

STEPS = int(os.environ.get("LLMGW_PROPERTY_STEPS", "40"))
SETTINGS = settings(
    max_examples=int(os.environ.get("LLMGW_PREEMPT_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

pytestmark = pytest.mark.timeout(900)


# --------------------------------------------------------------------------- reading a decision


def preemptions(step) -> list[tuple[int, ev.Preempt]]:
    """(index, action) of each Preempt in a fresh decision; [] for any other step."""
    if not (isinstance(step.event, ev.Decided) and step.fresh):
        return []
    return [(i, a) for i, a in enumerate(step.event.actions) if isinstance(a, ev.Preempt)]


def counted(state: State, model: str) -> list[str]:
    """A model's replicas that count: neither stopping nor failed."""
    return [r.id for r in state.replicas.values() if r.model == model and r.state not in ("stopping", "failed")]


def serving(state: State, model: str) -> int:
    """What decide counts as a model's replicas: those that count, less those being restarted beside themselves."""
    return sum(
        1 for r in state.replicas.values()
        if r.model == model and r.state not in ("stopping", "failed") and r.restart not in ("replacing", "in place")
    )


def left_after(before: State, decided: ev.Decided, model: str) -> int:
    """How many of a model's replicas still count once the decision is applied
    (every replica it stops, victim or not, is gone), less the model's own
    scale-down in the same pass: an on-demand model gone idle scales to zero
    whatever its minimum, and a preemption of one of its replicas just
    before did not leave it there (found by this property once it drew such
    a model: m-2 taken, then m-1 stopped by m's own scale-down to 0)."""
    own = f"{model} scales down to "
    stopped = {a.replica for a in decided.actions if isinstance(a, ev.StopReplica) and not a.reason.startswith(own)}
    return sum(1 for rid in counted(before, model) if rid not in stopped)


def quotas(state: State) -> bool:
    return any(o.guarantee.gpus or o.guarantee.cpu_cores or o.guarantee.memory_gb for o in state.owners.values())


def largest(spec: ev.ModelSpec) -> ev.Resources:
    """The most any one replica of the model takes, whichever its profile."""
    needs = [need(p) for p in spec.profiles]
    return ev.Resources(gpus=max(n.gpus for n in needs), cpu_cores=max(n.cpu_cores for n in needs),
                        memory_gb=max(n.memory_gb for n in needs))


def why_not_allowed(before: State, decided: ev.Decided, taker: str, rid: str, lent: set[str]) -> str:
    """Why the rules do not let `taker` stop replica `rid` on `before`
    (said here independently of preempt.py's tiers), or "" when they do."""
    rep = before.replicas.get(rid)
    if rep is None:
        return "it is not in the state"
    a, b = before.models[taker].spec, before.models[rep.model].spec
    ra, rb = CLASSES[a.priority], CLASSES[b.priority]
    other_owner = quotas(before) and rep.owner != a.owner
    if other_owner and rid not in lent and governing(before, rep.owner):
        return f"{rid} is within its owner {rep.owner}'s guarantee, and {taker} is {a.owner or 'nobody'}'s"
    keeps_min = left_after(before, decided, b.name) >= b.min_replicas
    if rb < ra:
        return ""  # a lower class gives way
    if rb == ra and serving(before, taker) < a.min_replicas and keeps_min:
        return ""  # the same class, above its minimum, for a model below its own
    if other_owner and rid in lent and within_guarantee(before, a.owner, largest(a)):
        if rb != CLASSES["critical"] or keeps_min:
            return ""  # borrowed past its owner's guarantee, taken back
    return (
        f"{taker} ({a.priority}, {serving(before, taker)} of min {a.min_replicas}, owner {a.owner!r}) may not take "
        f"{rid} of {b.name} ({b.priority}, min {b.min_replicas}, {left_after(before, decided, b.name)} left, "
        f"owner {rep.owner!r}, {'borrowed' if rid in lent else 'not borrowed'})"
    )


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(st.data())
def test_victims_are_allowed_by_the_rules_and_never_the_other_way_round(data):
    world = QuotaWorld(data, stale=False, malformed=False)
    for step in world.run(STEPS):
        found = preemptions(step)
        if not found:
            continue
        before = step.state_before()
        decided: ev.Decided = step.event  # type: ignore[assignment]
        lent = borrowed(before) if quotas(before) else set()
        index = VictimIndex(before, decided.at)
        for _, p in found:
            assert 1 <= len(p.victims) <= MAX_VICTIMS
            for v in p.victims:
                rep = before.replicas[v.replica]
                assert rep.model == v.model != p.model
                assert rep.state not in ("stopping", "failed") and not rep.preempted_for
                assert rep.restart not in ("replacing", "in place"), f"{v.replica} is being restarted"
                assert len(rep.shards) == 1 and rep.want_shards <= 1, f"{v.replica} is a multi-node replica"
                assert not rep.ready_at or decided.at - rep.ready_at >= MIN_LIFETIME_S, f"{v.replica} just started"
                why = why_not_allowed(before, decided, p.model, v.replica, lent)
                assert not why, f"tier {v.tier}: {why}"
                # The other way round, on the same state: the victim's model
                # could take none of the preemptor's replicas, by the rules
                # or by preempt.py's own list of what it may take.
                for theirs in counted(before, p.model):
                    assert why_not_allowed(before, decided, v.model, theirs, lent), (
                        f"{p.model} takes {v.replica} of {v.model}, which could take {theirs} back"
                    )
                back = [c.rep.id for _, c in index.ordered(before.models[v.model]) if c.model == p.model]
                assert not back, f"{p.model} takes {v.replica} of {v.model}, which could take {back} back"


@settings(SETTINGS, max_examples=2 * SETTINGS.max_examples)
@given(st.data())
def test_two_models_never_take_turns_stopping_each_other(data):
    # Calm worlds of two models, the fleet obeying every decision at once:
    # nothing changes the rules while they run (no catalog, owner or load
    # change, no failure, no node lost), so preemptions back and forth
    # (A from B, B from A, A from B again) would be the two taking turns.
    world = QuotaWorld(data, stale=False, malformed=False, calm=True, models_at_most=2)
    took: list[tuple[str, str]] = []
    for step in world.run_rounds(STEPS // 2):
        for _, p in preemptions(step):
            for v in p.victims:
                took.append((p.model, v.model))
    for i, (a, b) in enumerate(took):
        back = [j for j in range(i + 1, len(took)) if took[j] == (b, a)]
        again = [k for k in range(back[0] + 1, len(took)) if took[k] == (a, b)] if back else []
        assert not again, f"{a} and {b} take turns: {took}"


@SETTINGS
@given(st.data())
def test_a_critical_models_minimum_is_never_preempted(data):
    world = QuotaWorld(data, stale=False, malformed=False)
    for step in world.run(STEPS):
        found = preemptions(step)
        if not found:
            continue
        before = step.state_before()
        for _, p in found:
            for v in p.victims:
                spec = before.models[v.model].spec
                if spec.priority == "critical":
                    left = left_after(before, step.event, v.model)
                    assert left >= spec.min_replicas, (
                        f"{v.replica} of {v.model} (critical, min {spec.min_replicas}) preempted for {p.model}: "
                        f"{left} left"
                    )


def fits_with_victims_gone(before: State, decided: ev.Decided, i: int, p: ev.Preempt) -> str:
    """On the state the decision was taken on, with what the pass decided
    before the Preempt applied and the victims gone: "" when one of the
    preemptor's profiles allowed by its owner's limits fits, else why not."""
    state = copy_state(before)
    at = decided.at
    if i:
        evolve(state, ev.Decided(at=at, basis=before.seq, actions=decided.actions[:i]))
    evolve(state, ev.Decided(at=at, basis=before.seq, actions=[ev.StopReplica(replica=v.replica, reason="t")
                                                               for v in p.victims]))
    for v in p.victims:
        rep = state.replicas.get(v.replica)
        for sh in list(rep.shards) if rep is not None else []:
            if sh.state == "stopping":
                evolve(state, ev.ShardStatus(at=at, node=sh.node, replica=rep.id, shard=sh.id,
                                             generation=sh.generation, state="stopped"))
    assert state.voided_count == before.voided_count, state.voided[-1:]
    spec = state.models[p.model].spec
    allowed = [q for q in spec.profiles if not (state.owners and spec.owner and over_limit(state, spec.owner, need(q)))]
    inv = Inventory(state)
    if any(inv.fits(q, {}) for q in allowed):
        return ""
    return f"{p.model}: {len(allowed)} of its {len(spec.profiles)} profile(s) within its limits, none fits"


@SETTINGS
@given(st.data())
def test_nothing_is_preempted_unless_the_preemptor_then_fits(data):
    world = QuotaWorld(data, stale=False, malformed=False)
    for step in world.run(STEPS):
        found = preemptions(step)
        if not found:
            continue
        before = step.state_before()
        for i, p in found:
            why = fits_with_victims_gone(before, step.event, i, p)
            assert not why, f"{[v.replica for v in p.victims]} preempted, yet {why}"


def replaced_share(before: State, decided: ev.Decided, owner: str) -> ev.Resources:
    """What replicas of an owner (or its teams) that the decision replaces in
    place hold: their replacements take it over, limits included, while
    they drain (see decisions._place)."""
    out = ev.Resources()
    for a in decided.actions:
        if isinstance(a, ev.PlaceReplica) and a.replaces and a.replaces in before.replicas:
            old = before.replicas[a.replaces]
            if owner in ancestors(old.owner):
                amount = replica_amount(old)
                out = ev.Resources(gpus=out.gpus + amount.gpus, cpu_cores=out.cpu_cores + amount.cpu_cores,
                                   memory_gb=out.memory_gb + amount.memory_gb)
    return out


@SETTINGS
@given(st.data())
def test_no_placement_takes_an_owner_past_its_limit(data):
    world = QuotaWorld(data, malformed=False, rogue=True)
    for step in world.run(STEPS):
        if not isinstance(step.event, ev.Decided):
            continue
        before, after = step.state_before(), world.live
        for name, o in after.owners.items():
            was, now = before.usage.get(name, ev.Resources()), after.usage.get(name, ev.Resources())
            credit = replaced_share(before, step.event, name)
            for what, limit, b, a, c in (
                ("GPUs", o.limit.gpus, was.gpus, now.gpus, credit.gpus),
                ("CPU cores", o.limit.cpu_cores, was.cpu_cores, now.cpu_cores, credit.cpu_cores),
                ("GB", o.limit.memory_gb, was.memory_gb, now.memory_gb, credit.memory_gb),
            ):
                if limit is not None:
                    assert a <= max(limit, b) + c + 1e-9, (
                        f"owner {name} holds {a} {what} after a decision, {b} before; its limit is {limit}"
                    )


@SETTINGS
@given(st.data())
def test_usage_stays_derived_and_no_fresh_decision_is_voided(data):
    world = QuotaWorld(data, rogue=True)
    for step in world.run(STEPS):
        assert_held_memory_cores_and_tallies_are_derived(world.live)
        if isinstance(step.event, ev.Decided):
            assert_voided_not_applied(step, world.live)
        rows = report(world.live)
        for r in rows:
            assert r.usage == world.live.usage.get(r.owner, ev.Resources())
            assert r.borrowed.gpus <= r.usage.gpus and r.borrowed.cpu_cores <= r.usage.cpu_cores
    assert {r.owner for r in rows} == set(world.live.owners) | set(world.live.usage)
    assert replay(world.log) == world.live
