"""Scenario tests of preemption and quotas: one rule each, named after the rule.

Events in, decisions out, through the real fold (tests/scenario.py): a
victim is only ever what `decide` chose and the fold applied. The rules are
preempt.py's (a port of the seed's preempt.go) and quota.py's:

- tiers: 0 an idle on-demand replica of a lower class, 1 a replica borrowed
  past its owner's guarantee taken back by an owner within its own, 2 a lower
  class above its minimum, 3 the same class above its minimum for a model
  below its own, 4 a lower class's minimum (never a critical one);
- within a tier the longest idle first, then the smallest, then by id;
- at most three victims, tried on the pass's inventory and pruned to those
  needed; none when no allowed set makes room;
- not victims: a replica ready for less than MIN_LIFETIME_S, a multi-node
  one, one preempted, restarting or stopping already, one within another
  owner's guarantee;
- the victims' models are held until the preemptor has what it asked for or
  the hold ends; the preemptor waits for its victims before taking more;
- owners: limits refuse placements (nested owners count for their
  ancestors), guarantees make what is past them borrowed, and taken back.
"""

from __future__ import annotations

import msgspec

from llmgw.core.contract import events as ev
from llmgw.core.rules.decide import decide
from llmgw.core.contract.limits import LIMITS
from llmgw.core.folding.fold import copy_state
from llmgw.core.rules.preempt import EVICTION_GRACE_S, HOLD_S, MAX_VICTIMS, MIN_LIFETIME_S, TIERS
from llmgw.core.rules.quota import QuotaRow, borrowed, report

from .scenario import Fleet, model

FABRIC = {"llmgw.io/fabric": "ib-0"}
_ENVELOPE_BYTES = LIMITS.pass_envelope_bytes


# --------------------------------------------------------------------------- helpers


def preempts(actions) -> list[ev.Preempt]:
    return [a for a in actions if isinstance(a, ev.Preempt)]


def victims(actions) -> list[tuple[str, int]]:
    """(replica, tier) of every victim the actions name, in order."""
    return [(v.replica, v.tier) for p in preempts(actions) for v in p.victims]


def stops(actions) -> list[str]:
    return [a.replica for a in actions if isinstance(a, ev.StopReplica)]


def placed(actions) -> list[str]:
    return [a.replica for a in actions if isinstance(a, ev.PlaceReplica)]


def waiting(f: Fleet, name: str) -> str:
    return f.state.models[name].waiting


def up(f: Fleet) -> None:
    """Passes until nothing more is placed, every placed shard made ready."""
    for _ in range(10):
        actions = f.decide()
        f.make_ready()
        if not placed(actions):
            return


def age(f: Fleet, seconds: float = MIN_LIFETIME_S + 1) -> None:
    """Let time pass: replicas made ready now become fair victims."""
    f.tick(seconds)


def owner(f: Fleet, name: str, gpus: int = 0, limit: int | None = None, **limits) -> None:
    f.publish(
        ev.OwnerApplied(
            at=f.tick(), name=name, guarantee=ev.Resources(gpus=gpus), limit=ev.Limit(gpus=limit, **limits)
        )
    )


def running(replica: str, model_name: str, gpus: list[int], port: int, profile: str = "default", rank: int = 0):
    return ev.RunningShard(
        shard=f"{replica}.{rank}", replica=replica, model=model_name, profile=profile, generation=1, rank=rank,
        gpus=gpus, port=port, state="ready",
    )


# --------------------------------------------------------------------------- the basic exchange


def test_a_higher_class_that_fits_nowhere_stops_a_lower_one_and_says_why():
    f = Fleet()
    f.register("a", gpus=2)
    f.apply(model("batch", min_replicas=2, priority="opportunistic"))
    up(f)
    age(f)
    f.apply(model("prod", priority="critical"))
    actions = f.decide()
    (p,) = preempts(actions)
    assert p.model == "prod"
    assert [(v.replica, v.model, v.priority, v.tier, v.why, v.gpus) for v in p.victims] == [
        ("batch-1", "batch", "opportunistic", 4, TIERS[4], 1)
    ]
    assert "prod (critical) has 0 of 1 replicas and fits nowhere" in p.reason
    assert p.inventory == "a: 0 of 2 GPUs free"  # what the node had free when it was decided
    assert p.hold_until == f.now + HOLD_S
    # The Preempt, then the victim's stop (drained) in the same message.
    (stop,) = [a for a in actions if isinstance(a, ev.StopReplica)]
    assert actions.index(p) < actions.index(stop)
    assert stop.replica == "batch-1" and stop.drain_s == 30.0
    assert stop.reason == f"preempted for prod (tier 4: {TIERS[4]})"
    assert f.state.replicas["batch-1"].preempted_for == "prod"
    assert f.state.replicas["batch-1"].state == "stopping"
    assert f.state.models["prod"].preempting == ["batch-1"]
    assert waiting(f, "prod") == "preempting batch-1 to make room"
    # Its victim gone, the preemptor takes the room.
    f.stopped("batch-1")
    actions = f.decide()
    assert placed(actions) == ["prod-1"]
    assert [s.gpus for s in f.state.replicas["prod-1"].shards] == [[0]]


def test_a_lower_or_equal_class_never_preempts_a_model_at_its_minimum():
    f = Fleet()
    f.register("a", gpus=1)
    f.apply(model("prod", priority="critical"))
    up(f)
    age(f)
    f.apply(model("batch", priority="opportunistic"))
    f.apply(model("web", priority="standard"))
    f.apply(model("other", priority="critical"))
    actions = f.decide()
    assert victims(actions) == [] and stops(actions) == []
    for name in ("batch", "web", "other"):
        assert waiting(f, name).startswith("no room")


# --------------------------------------------------------------------------- tiers


def _idle_fleet(f: Fleet) -> tuple[float, float]:
    """One node of two GPUs: `batch` (opportunistic, its minimum) last used
    at t0, `chat` (opportunistic, on demand) last used 10 s later."""
    f.register("a", gpus=2)
    f.apply(model("batch", priority="opportunistic"))
    f.apply(model("chat", priority="opportunistic", on_demand=True, idle_s=600.0))
    f.load("chat", queued=1)  # wakes it
    up(f)
    age(f)
    f.load("batch", in_flight=1)
    t0 = f.now
    f.load("batch", in_flight=0)
    f.load("chat", in_flight=1)
    t1 = f.now
    f.load("chat", in_flight=0)
    assert f.states() == {"batch-1": "ready", "chat-1": "ready"}
    return t0, t1


def test_tier0_an_idle_on_demand_replica_of_a_lower_class_goes_first():
    f = Fleet()
    t0, t1 = _idle_fleet(f)
    f.now = t1 + EVICTION_GRACE_S + 10  # idle past the eviction grace, not yet past its idle_s (600 s)
    f.apply(model("prod", priority="critical"))
    actions = f.decide()
    # batch was idle longer, but chat is on demand and idle past the grace: tier 0.
    assert victims(actions) == [("chat-1", 0)]
    (v,) = preempts(actions)[0].victims
    assert v.why == TIERS[0] and v.idle_s == f.now - t1


def test_tier0_not_before_the_eviction_grace_then_longest_idle_first():
    f = Fleet()
    t0, t1 = _idle_fleet(f)
    f.now = t1 + EVICTION_GRACE_S - 60  # chat idle, but not past the grace: both are minimums (tier 4)
    f.apply(model("prod", priority="critical"))
    actions = f.decide()
    assert victims(actions) == [("batch-1", 4)]  # the longest idle of the tier
    assert preempts(actions)[0].victims[0].idle_s == f.now - t0


def test_tier2_a_lower_class_above_its_minimum_goes_before_any_minimum():
    f = Fleet()
    f.register("a", gpus=2)
    f.register("b", gpus=1)
    f.apply(model("batch", priority="opportunistic", max_replicas=2, target_load=1, scale_down_delay_s=3600))
    f.load("batch", in_flight=2)
    f.apply(model("old", priority="opportunistic"))
    up(f)
    assert sorted(f.states()) == ["batch-1", "batch-2", "old-1"]
    age(f)
    f.load("old", in_flight=1)  # "old" is idle longer than batch, whose idle time nobody reported
    f.load("old", in_flight=0)
    f.apply(model("prod", priority="critical"))
    actions = f.decide()
    # batch-2 is above batch's minimum (the newer of the two): tier 2 before old-1 and batch-1 (tier 4).
    assert victims(actions) == [("batch-2", 2)]


def test_tier3_the_same_class_above_its_minimum_for_a_model_below_its_own():
    f = Fleet()
    f.register("a", gpus=3)
    f.apply(model("web", max_replicas=2, target_load=1, scale_down_delay_s=3600))
    f.load("web", in_flight=2)
    up(f)
    f.apply(model("api", min_replicas=2))
    up(f)
    assert sorted(f.states()) == ["api-1", "web-1", "web-2"]
    age(f)
    actions = f.decide()
    assert victims(actions) == [("web-2", 3)]
    assert preempts(actions)[0].victims[0].why == TIERS[3]


def test_tier3_not_for_a_model_at_its_minimum_that_wants_more_under_load():
    f = Fleet()
    f.register("a", gpus=3)
    f.apply(model("web", max_replicas=2, target_load=1, scale_down_delay_s=3600))
    f.load("web", in_flight=2)
    up(f)
    f.apply(model("api", max_replicas=3, target_load=1, scale_down_delay_s=3600))
    f.load("api", in_flight=3)
    up(f)
    age(f)
    assert sorted(f.states()) == ["api-1", "web-1", "web-2"]
    actions = f.decide()
    # api has its minimum (1) and wants 3: growth under load is not taken from its own class.
    assert victims(actions) == [] and stops(actions) == []
    assert waiting(f, "api").startswith("no room")


def test_tier4_a_lower_class_minimum_when_nothing_else_makes_room():
    f = Fleet()
    f.register("a", gpus=1)
    f.apply(model("web"))
    up(f)
    age(f)
    f.apply(model("prod", priority="critical"))
    assert victims(f.decide()) == [("web-1", 4)]


def test_a_critical_minimum_is_never_taken_only_what_is_above_it():
    f = Fleet()
    f.register("a", gpus=3)
    f.apply(model("core", priority="critical", max_replicas=2, target_load=1, scale_down_delay_s=3600))
    f.load("core", in_flight=2)
    up(f)
    f.apply(model("pay", priority="critical", min_replicas=3))
    up(f)
    age(f)
    assert sorted(f.states()) == ["core-1", "core-2", "pay-1"]
    actions = f.decide()
    assert victims(actions) == [("core-2", 3)]  # above core's minimum
    f.stopped("core-2")
    up(f)
    age(f)
    # pay has 2 of 3 and is still below its minimum; core is at its minimum: nothing more.
    actions = f.decide()
    assert victims(actions) == [] and stops(actions) == []
    assert sorted(f.states()) == ["core-1", "pay-1", "pay-2"]
    assert waiting(f, "pay").startswith("no room")


# --------------------------------------------------------------------------- order within a tier


def test_smallest_first_when_idle_times_are_unknown_after_everything_restarted():
    # A fresh log: the catalog applied, then agents register with what runs
    # (adopted). No gateway ever reported a load, so every idle time is
    # unknown (0): of two victims that would each make room, the smaller
    # one goes, whatever the order of ids or of the registrations.
    f = Fleet()
    f.apply(model("a-big", gpus=2, priority="opportunistic"))
    f.apply(model("z-small", gpus=1, priority="opportunistic"))
    f.register("n1", gpus=4, running=[running("a-big-1", "a-big", [0, 1], 20000),
                                      running("z-small-1", "z-small", [2], 20001)])
    assert f.states() == {"a-big-1": "ready", "z-small-1": "ready"}
    age(f)
    f.apply(model("prod", gpus=2, priority="critical"))
    actions = f.decide()
    assert victims(actions) == [("z-small-1", 4)]
    assert [(v.idle_s, v.gpus) for v in preempts(actions)[0].victims] == [(0.0, 1)]


def test_of_equal_gpus_the_one_with_less_host_memory_then_the_lower_id_goes():
    f = Fleet()
    f.register("n1", gpus=3, memory_gb=512.0)
    big = [ev.ProfileSpec(name="default", gpus=1, memory_gb=64.0)]
    small = [ev.ProfileSpec(name="default", gpus=1, memory_gb=16.0)]
    f.apply(model("a-big", priority="opportunistic", profiles=big))
    f.apply(model("m-small", priority="opportunistic", profiles=small))
    f.apply(model("z-small", priority="opportunistic", profiles=small))
    up(f)
    age(f)
    f.apply(model("prod", priority="critical"))
    assert victims(f.decide()) == [("m-small-1", 4)]


# --------------------------------------------------------------------------- how many, and which are needed


def test_pruning_keeps_an_idle_replica_on_the_wrong_node():
    # The idle on-demand replica is tried first (tier 0), but prod needs two
    # GPUs on one node and stopping it frees one next to a replica that may
    # not be taken. The replica on node b makes room alone: the idle one is kept.
    f = Fleet()
    f.register("a", gpus=2)
    f.register("b", gpus=2)
    f.apply(model("chat", priority="opportunistic", on_demand=True))
    f.load("chat", queued=1)
    f.apply(model("core", priority="critical"))
    up(f)
    f.apply(model("train", gpus=2, priority="opportunistic"))
    up(f)
    where = {r.id: r.shards[0].node for r in f.state.replicas.values()}
    assert where == {"chat-1": "a", "core-1": "a", "train-1": "b"}
    age(f, EVICTION_GRACE_S + 10)
    f.apply(model("prod", gpus=2, priority="critical"))
    actions = f.decide()
    assert victims(actions) == [("train-1", 4)]
    assert stops(actions) == ["train-1"]
    assert f.state.replicas["chat-1"].state == "ready"


def test_at_most_three_victims_and_none_when_three_would_not_make_room():
    f = Fleet()
    f.register("a", gpus=4)
    f.apply(model("batch", min_replicas=4, priority="opportunistic"))
    up(f)
    age(f)
    f.apply(model("big", gpus=4, priority="critical"))
    actions = f.decide()
    assert MAX_VICTIMS == 3
    assert victims(actions) == [] and stops(actions) == []  # four would be needed
    assert waiting(f, "big").startswith("no room")
    f.apply(model("big", gpus=3, priority="critical"))
    actions = f.decide()
    assert victims(actions) == [("batch-1", 4), ("batch-2", 4), ("batch-3", 4)]


def test_nothing_is_stopped_when_the_victims_would_not_make_room():
    f = Fleet()
    f.register("a100", gpus=1, gpu_model="NVIDIA A100-SXM4-80GB")
    f.register("h100", gpus=1, gpu_model="NVIDIA H100 80GB HBM3")
    f.apply(model("batch", min_replicas=1, priority="opportunistic",
                  profiles=[ev.ProfileSpec(name="default", gpus=1, gpu_model="A100")]))
    f.apply(model("core", priority="critical", profiles=[ev.ProfileSpec(name="default", gpus=1, gpu_model="H100")]))
    up(f)
    age(f)
    f.apply(model("prod", priority="critical", profiles=[ev.ProfileSpec(name="default", gpus=1, gpu_model="H100")]))
    actions = f.decide()
    # batch may give way, but its A100 is of no use to prod; core may not.
    assert victims(actions) == [] and stops(actions) == []


# --------------------------------------------------------------------------- who is not a victim


def test_a_replica_ready_for_less_than_its_minimum_lifetime_is_not_a_victim():
    f = Fleet()
    f.register("a", gpus=1)
    f.apply(model("batch", priority="opportunistic"))
    up(f)
    age(f, MIN_LIFETIME_S / 2)
    f.apply(model("prod", priority="critical"))
    assert victims(f.decide()) == []
    assert waiting(f, "prod").startswith("no room")
    age(f, MIN_LIFETIME_S / 2)
    assert victims(f.decide()) == [("batch-1", 4)]


def test_a_multi_node_replica_is_not_a_victim():
    f = Fleet()
    f.register("a", gpus=1, labels=FABRIC)
    f.register("b", gpus=1, labels=FABRIC)
    f.apply(model("batch", priority="opportunistic", profiles=[ev.ProfileSpec(name="default", gpus=1, nodes=2)]))
    up(f)
    assert [s.node for s in f.state.replicas["batch-1"].shards] == ["a", "b"]
    age(f)
    f.apply(model("prod", priority="critical"))
    assert victims(f.decide()) == []


def test_half_of_a_multi_node_replica_being_adopted_is_not_a_victim():
    # After a restart of everything, one agent of a two-node replica has
    # registered and the other not yet: one shard, but not a one-node replica.
    f = Fleet()
    f.apply(model("batch", priority="opportunistic", profiles=[ev.ProfileSpec(name="default", gpus=1, nodes=2)]))
    f.register("a", gpus=1, labels=FABRIC, running=[running("batch-1", "batch", [0], 20000)])
    f.register("b", gpus=1, labels=FABRIC)
    rep = f.state.replicas["batch-1"]
    assert len(rep.shards) == 1 and rep.want_shards == 2
    age(f, 60)  # within the 120 s its other shard has to be reported
    f.apply(model("prod", priority="critical", min_replicas=2))
    actions = f.decide()
    assert victims(actions) == []


def test_a_replica_being_restarted_is_not_a_victim():
    f = Fleet()
    f.register("g", gpus=1)
    f.register("h", gpus=1, gpu_model="H100")
    f.apply(model("batch", min_replicas=2, priority="opportunistic"))
    up(f)
    assert {r.id: r.shards[0].node for r in f.state.replicas.values()} == {"batch-1": "g", "batch-2": "h"}
    f.register("x", gpus=1)
    age(f)
    f.restart("batch-2")  # replaced beside itself, on x; it serves until its replacement does
    assert placed(f.decide()) == ["batch-3"]
    assert f.state.replicas["batch-2"].restart == "replacing"
    f.apply(model("prod", priority="critical", profiles=[ev.ProfileSpec(name="default", gpus=1, gpu_model="H100")]))
    actions = f.decide()
    assert victims(actions) == [] and stops(actions) == []  # batch-2 alone would make room
    assert waiting(f, "prod").startswith("no room")


def test_a_replica_placed_in_place_of_one_still_draining_is_not_a_victim():
    # Found by the properties: stopping it gives what it took over back to
    # the one draining (replicas.hand_back), so it makes no room until that one
    # exits, and the preemptor fitted nowhere after all.
    f = Fleet()
    f.register("a", gpus=1)
    f.apply(model("batch", priority="opportunistic", drain_grace_s=300.0))
    up(f)
    f.restart("batch-1", in_place=True)
    assert placed(f.decide()) == ["batch-2"]
    assert f.state.replicas["batch-2"].shards[0].after == ["batch-1.0"]
    f.apply(model("prod", priority="critical"))
    actions = f.decide()
    assert victims(actions) == [] and waiting(f, "prod").startswith("no room")
    f.stopped("batch-1")
    assert victims(f.decide()) == [("batch-2", 4)]  # now it holds the room, and has not started


def test_a_victim_is_taken_once_neither_by_two_preemptors_nor_again_while_it_stops():
    f = Fleet()
    f.register("h", gpus=2, gpu_model="H100")
    f.apply(model("batch", min_replicas=2, priority="opportunistic"))
    up(f)
    age(f)
    f.apply(model("batch", min_replicas=1, priority="opportunistic"))
    h100 = [ev.ProfileSpec(name="default", gpus=1, gpu_model="H100")]
    f.apply(model("one", priority="critical", profiles=h100))
    f.apply(model("two", priority="critical", profiles=h100))
    actions = f.decide()
    # batch scales down to 1 (batch-2 stops, decided first by name): one
    # takes batch-1, and two gets neither (batch-2 is stopping, batch-1 taken).
    assert stops(actions)[0] == "batch-2"
    assert [(p.model, [v.replica for v in p.victims]) for p in preempts(actions)] == [("one", ["batch-1"])]
    assert f.state.voided_count == 0
    actions = f.decide()
    # Next pass: both stopping, batch-1 preempted already: nothing more to take.
    assert victims(actions) == [] and stops(actions) == []
    assert waiting(f, "two").startswith("no room")


def test_a_replica_within_its_owners_guarantee_is_taken_by_no_other_owner():
    f = Fleet()
    f.register("a", gpus=1)
    owner(f, "lab", gpus=1)
    f.apply(model("train", owner="lab", priority="opportunistic"))
    up(f)
    age(f)
    f.apply(model("prod", owner="shop", priority="critical"))
    actions = f.decide()
    assert victims(actions) == [] and waiting(f, "prod").startswith("no room")
    # A model of the same owner may take it: the guarantee is the owner's, not the model's.
    f.apply(model("eval", owner="lab", priority="critical"))
    assert victims(f.decide()) == [("train-1", 4)]


def test_a_teams_replica_within_its_organisations_guarantee_is_kept_from_other_owners():
    f = Fleet()
    f.register("a", gpus=1)
    owner(f, "lab", gpus=2)  # the organisation has the guarantee; its team none
    f.apply(model("train", owner="lab/vision", priority="opportunistic"))
    up(f)
    age(f)
    f.apply(model("prod", owner="shop", priority="critical"))
    assert victims(f.decide()) == []
    # Owners are compared as they are written, as in preempt.go: a sibling
    # team is another owner, even under the same guarantee.
    f.apply(model("eval", owner="lab/nlp", priority="critical"))
    assert victims(f.decide()) == []
    f.apply(model("vision-eval", owner="lab/vision", priority="critical"))
    assert victims(f.decide()) == [("train-1", 4)]


# --------------------------------------------------------------------------- holds and waiting


def _batch_gave_room_to_serve(f: Fleet) -> None:
    """`batch` (name first, so decided first in a pass) gave batch-1 to `serve`."""
    f.register("a", gpus=2)
    f.apply(model("batch", min_replicas=2, priority="opportunistic"))
    up(f)
    age(f)
    f.apply(model("serve", priority="critical"))
    actions = f.decide()
    assert victims(actions) == [("batch-1", 4)]
    assert f.state.models["batch"].held_for == "serve"
    assert f.state.models["batch"].held_until == f.now + HOLD_S


def test_the_preemptor_waits_for_its_victims_before_taking_more():
    f = Fleet()
    _batch_gave_room_to_serve(f)
    for _ in range(3):
        actions = f.decide()
        assert victims(actions) == [] and stops(actions) == []
        assert waiting(f, "serve") == "waiting for batch-1, preempted for it, to stop"
        age(f, 10)
    f.stopped("batch-1")
    assert placed(f.decide()) == ["serve-1"]


def test_the_model_that_gave_room_is_held_and_does_not_take_it_back():
    f = Fleet()
    _batch_gave_room_to_serve(f)
    f.decide()
    f.stopped("batch-1")
    actions = f.decide()
    # batch, short of its minimum and decided first, does not take the GPU it gave.
    assert placed(actions) == ["serve-1"]
    assert waiting(f, "batch").startswith("held: it gave room to serve (preempted for it), which is still short")


def test_a_held_model_places_nowhere_and_its_reason_is_said_once():
    f = Fleet()
    _batch_gave_room_to_serve(f)
    f.decide()
    f.stopped("batch-1")
    f.register("b", gpus=1)  # room elsewhere
    f.apply(model("serve", priority="critical", min_replicas=3))  # serve wants more than there is
    actions = f.decide()
    assert placed(actions) == ["serve-1", "serve-2"]  # batch, held, took neither GPU
    assert waiting(f, "batch").startswith("held:")
    # While held, each pass says nothing new (a reason with a countdown was a
    # new decision every pass).
    age(f, 5)
    actions = f.decide()
    assert not any(isinstance(a, ev.ModelWaiting) and a.model == "batch" for a in actions)


def test_a_hold_ends_early_once_the_preemptor_has_what_it_asked_for():
    f = Fleet()
    _batch_gave_room_to_serve(f)
    f.decide()
    f.stopped("batch-1")
    assert placed(f.decide()) == ["serve-1"]
    assert f.now < f.state.models["batch"].held_until
    f.register("b", gpus=1)
    assert placed(f.decide()) == ["batch-3"]  # serve has its one replica: batch is held no more


def test_a_hold_ends_when_it_expires_even_if_the_preemptor_is_still_short():
    f = Fleet()
    f.register("a", gpus=1, gpu_model="H100")
    f.register("b", gpus=1, gpu_model="A100")
    f.apply(model("batch", min_replicas=2, priority="opportunistic"))
    up(f)
    age(f)
    h100 = [ev.ProfileSpec(name="default", gpus=1, gpu_model="H100")]
    f.apply(model("serve", priority="critical", min_replicas=2, profiles=h100))
    assert victims(f.decide()) == [("batch-1", 4)]
    f.stopped("batch-1")
    actions = f.decide()
    # serve has one of the two it asks for; batch-2's A100 is of no use to it.
    assert placed(actions) == ["serve-1"] and victims(actions) == []
    assert waiting(f, "batch").startswith("held:")
    f.now = f.state.models["batch"].held_until
    f.decide()
    assert waiting(f, "batch").startswith("no room")


def test_a_hold_lasts_while_the_victims_drain_even_past_its_end():
    # Found: a drain longer than the hold let the model that gave the room
    # take it back the moment it was free, and be preempted again.
    f = Fleet()
    f.register("a", gpus=2)
    f.apply(model("batch", min_replicas=2, priority="opportunistic", drain_grace_s=600.0))
    up(f)
    age(f)
    f.apply(model("serve", priority="critical"))
    assert victims(f.decide()) == [("batch-1", 4)]
    f.now = f.state.models["batch"].held_until + 300  # batch-1 still drains
    f.decide()
    assert waiting(f, "batch").startswith("held:")
    f.stopped("batch-1")
    actions = f.decide()
    assert placed(actions) == ["serve-1"]  # not batch-3, though batch is decided first by name


def test_the_model_the_room_was_freed_for_is_decided_first():
    # The hold over and the victims gone, "batch" (first by name) still
    # does not take the room freed for "serve".
    f = Fleet()
    f.register("a", gpus=2)
    f.apply(model("batch", min_replicas=2, priority="opportunistic"))
    up(f)
    age(f)
    f.apply(model("serve", priority="critical"))
    assert victims(f.decide()) == [("batch-1", 4)]
    f.stopped("batch-1")
    f.now = f.state.models["batch"].held_until + 1
    actions = f.decide()
    assert placed(actions) == ["serve-1"]
    assert victims(actions) == []


# --------------------------------------------------------------------------- owners: borrowing, reclaim, limits


def _lab_borrows_while_shop_is_idle(f: Fleet) -> None:
    """Four GPUs; lab and shop are guaranteed two each. shop runs nothing,
    so lab grows to four: two of them past its guarantee, borrowed."""
    f.register("a", gpus=4)
    owner(f, "lab", gpus=2)
    owner(f, "shop", gpus=2)
    f.apply(model("train", owner="lab", priority="standard", max_replicas=4, target_load=1,
                  scale_down_delay_s=3600))
    f.load("train", in_flight=4)
    up(f)
    age(f)
    assert sorted(f.states()) == ["train-1", "train-2", "train-3", "train-4"]


def test_an_owner_borrows_past_its_guarantee_while_another_is_idle_and_report_says_so():
    f = Fleet()
    _lab_borrows_while_shop_is_idle(f)
    assert borrowed(f.state) == {"train-3", "train-4"}  # the newest past the guarantee
    rows = {r.owner: r for r in report(f.state)}
    assert rows["lab"] == QuotaRow(owner="lab", guarantee=ev.Resources(gpus=2), limit=ev.Limit(),
                                   usage=ev.Resources(gpus=4), borrowed=ev.Resources(gpus=2))
    assert rows["shop"] == QuotaRow(owner="shop", guarantee=ev.Resources(gpus=2), limit=ev.Limit(),
                                    usage=ev.Resources(), borrowed=ev.Resources())


def test_tier1_the_borrowed_replica_is_taken_back_whatever_the_classes():
    f = Fleet()
    _lab_borrows_while_shop_is_idle(f)
    # shop's model is of a lower class than lab's, and still takes back what lab borrowed.
    f.apply(model("shop-api", owner="shop", min_replicas=2, priority="opportunistic"))
    actions = f.decide()
    assert victims(actions) == [("train-3", 1)]
    assert preempts(actions)[0].victims[0].why == TIERS[1]
    f.stopped("train-3")
    actions = f.decide()
    # One placed in the room given back, and the next borrowed one taken back for the second.
    assert placed(actions) == ["shop-api-1"] and victims(actions) == [("train-4", 1)]
    f.make_ready()
    f.stopped("train-4")
    assert placed(f.decide()) == ["shop-api-2"]
    f.make_ready()
    # Both owners within their guarantees now: nothing borrowed, nothing more to take back.
    assert borrowed(f.state) == set()
    rows = {r.owner: (r.usage.gpus, r.borrowed.gpus) for r in report(f.state)}
    assert rows == {"lab": (2, 0), "shop": (2, 0)}


def test_an_owner_past_its_own_guarantee_takes_nothing_back():
    f = Fleet()
    _lab_borrows_while_shop_is_idle(f)
    f.apply(model("shop-api", owner="shop", min_replicas=3, priority="opportunistic"))
    for r in ("train-3", "train-4"):
        f.decide()
        f.stopped(r)
        f.decide()
        f.make_ready()
        age(f)
    assert sorted(f.states()) == ["shop-api-1", "shop-api-2", "train-1", "train-2"]
    actions = f.decide()
    # A third replica would take shop past its guarantee; lab's two are within its own.
    assert victims(actions) == [] and stops(actions) == []
    assert waiting(f, "shop-api").startswith("no room")


def test_an_owners_placements_earlier_in_the_pass_count_against_its_guarantee():
    f = Fleet()
    f.register("a", gpus=4)
    owner(f, "lab", gpus=1)
    owner(f, "shop", gpus=2)
    f.apply(model("train", owner="lab", max_replicas=4, target_load=1, scale_down_delay_s=3600))
    f.load("train", in_flight=4)
    up(f)
    age(f)
    f.register("b", gpus=1)
    f.apply(model("shop-api", owner="shop", min_replicas=3, priority="opportunistic"))
    actions = f.decide()
    assert placed(actions) == ["shop-api-1"] and victims(actions) == [("train-2", 1)]
    f.make_ready()
    f.stopped("train-2")
    actions = f.decide()
    # shop-api-2 takes shop to its guarantee in this very pass: a third
    # would be past it, so nothing more is taken back.
    assert placed(actions) == ["shop-api-2"] and victims(actions) == []


def test_a_placement_past_an_owners_limit_is_refused_with_the_reason():
    f = Fleet()
    f.register("a", gpus=8)
    owner(f, "lab", limit=2)
    f.apply(model("train", owner="lab", min_replicas=3))
    actions = f.decide()
    assert placed(actions) == ["train-1", "train-2"]
    assert waiting(f, "train") == "over limit: owner lab holds 2 GPUs; 1 more would pass its limit of 2"
    assert f.state.usage["lab"] == ev.Resources(gpus=2)
    # Not a lack of room: nothing is preempted for it either.
    f.apply(model("batch", priority="opportunistic", min_replicas=6))
    up(f)
    age(f)
    actions = f.decide()
    assert victims(actions) == [] and placed(actions) == []


def test_nested_owners_count_for_their_ancestors_limits():
    f = Fleet()
    f.register("a", gpus=8, cpu_cores=64)
    owner(f, "org", limit=3)
    owner(f, "org/a", cpu_cores=8)  # a team's own limit, on cores
    prof = [ev.ProfileSpec(name="default", gpus=1, cpu_cores=4)]
    f.apply(model("a-chat", owner="org/a", min_replicas=3, profiles=prof))
    f.apply(model("b-chat", owner="org/b", min_replicas=2, profiles=prof))
    up(f)
    assert sorted(f.states()) == ["a-chat-1", "a-chat-2", "b-chat-1"]
    assert waiting(f, "a-chat") == "over limit: owner org/a holds 8 CPU cores; 4 more would pass its limit of 8"
    assert waiting(f, "b-chat") == "over limit: owner org holds 3 GPUs; 1 more would pass its limit of 3"
    assert f.state.usage == {
        "org": ev.Resources(gpus=3, cpu_cores=12),
        "org/a": ev.Resources(gpus=2, cpu_cores=8),
        "org/b": ev.Resources(gpus=1, cpu_cores=4),
    }
    rows = {r.owner: r for r in report(f.state)}
    assert sorted(rows) == ["org", "org/a", "org/b"]  # org/b has no entry of its own, only usage
    assert rows["org"].limit == ev.Limit(gpus=3) and rows["org/b"].limit == ev.Limit()
    # A stopped replica gives its share back, up the tree.
    f.remove("a-chat")
    f.decide()
    f.stopped("a-chat-1")
    assert f.state.usage["org"] == ev.Resources(gpus=2, cpu_cores=8)
    assert placed(f.decide()) == ["b-chat-2"]


def test_the_first_profile_within_the_limit_is_placed():
    f = Fleet()
    f.register("a", gpus=8)
    owner(f, "lab", limit=2)
    f.apply(model("train", owner="lab",
                  profiles=[ev.ProfileSpec(name="big", gpus=4), ev.ProfileSpec(name="small", gpus=2)]))
    actions = f.decide()
    assert [(a.replica, a.profile) for a in actions if isinstance(a, ev.PlaceReplica)] == [("train-1", "small")]


def test_the_fold_voids_a_placement_decided_before_a_limit_was_lowered():
    f = Fleet()
    f.register("a", gpus=8)
    f.apply(model("train", owner="lab", min_replicas=2))
    old = copy_state(f.state)
    owner(f, "lab", limit=1)
    late = decide(old, f.tick())
    assert placed(late) == ["train-1", "train-2"]
    f.publish(ev.Decided(at=f.now, basis=old.seq, actions=late))
    assert sorted(f.states()) == ["train-1"]
    assert f.state.voided[-1].reason == "over limit: owner lab holds 1 GPUs; 1 more would pass its limit of 1"


def test_preemption_makes_no_room_for_a_profile_past_the_owners_limit():
    f = Fleet()
    f.register("a", gpus=2)
    owner(f, "shop", limit=1)
    f.apply(model("batch", min_replicas=2, priority="opportunistic"))
    up(f)
    age(f)
    # "big" would fit with both batch replicas gone but may not be placed
    # (2 GPUs, limit 1); "small" is allowed but needs an H100 there is not.
    f.apply(model("prod", owner="shop", priority="critical",
                  profiles=[ev.ProfileSpec(name="big", gpus=2),
                            ev.ProfileSpec(name="small", gpus=1, gpu_model="H100")]))
    actions = f.decide()
    assert victims(actions) == [] and stops(actions) == []


def test_report_lists_declared_owners_and_those_replicas_run_for():
    f = Fleet()
    f.register("a", gpus=4, memory_gb=512.0)
    owner(f, "lab", gpus=1, limit=3, memory_gb=100.0)
    prof = [ev.ProfileSpec(name="default", gpus=1, memory_gb=32.0)]
    f.apply(model("train", owner="lab/vision", min_replicas=2, profiles=prof))
    f.apply(model("tool", owner="solo", profiles=prof))
    up(f)
    rows = report(f.state)
    assert [r.owner for r in rows] == ["lab", "lab/vision", "solo"]
    lab, vision, solo = rows
    assert lab == QuotaRow(owner="lab", guarantee=ev.Resources(gpus=1), limit=ev.Limit(gpus=3, memory_gb=100.0),
                           usage=ev.Resources(gpus=2, memory_gb=64.0), borrowed=ev.Resources(gpus=1, memory_gb=32.0))
    assert vision.usage == ev.Resources(gpus=2, memory_gb=64.0)
    assert vision.borrowed == ev.Resources(gpus=1, memory_gb=32.0)
    # An owner with no guarantee anywhere up its tree holds only borrowed capacity.
    assert solo == QuotaRow(owner="solo", guarantee=ev.Resources(), limit=ev.Limit(),
                            usage=ev.Resources(gpus=1, memory_gb=32.0), borrowed=ev.Resources(gpus=1, memory_gb=32.0))


# --------------------------------------------------------------------------- regressions (bugs found here)


def test_a_preempt_and_its_stops_land_in_one_message_or_not_at_all():
    # Found: with the pass's message full right after the Preempt, its stops
    # were left for a next pass that never came (the victims were marked
    # preempted, so never stopped, and the preemptor waited for them for ever).
    f = Fleet()
    f.register("a", gpus=1)
    f.apply(model("batch", priority="opportunistic"))
    up(f)
    age(f)
    f.apply(model("prod", priority="critical"))
    full = decide(f.state, f.tick())
    preempt_size = len(msgspec.json.encode(preempts(full)[0])) + 1
    for budget in (preempt_size + 10, preempt_size + 150):
        actions = decide(f.state, f.now, budget=_ENVELOPE_BYTES + budget)
        assert len(preempts(actions)) == len(stops(actions)) == 1
    f.apply(model("aaa", profiles=[ev.ProfileSpec(name="default", gpus=0)]))  # placed first, by name
    first = decide(f.state, f.tick())
    place_size = len(msgspec.json.encode(first[0])) + 1
    actions = decide(f.state, f.now, budget=_ENVELOPE_BYTES + place_size + preempt_size + 10)
    assert placed(actions) == ["aaa-1"] and preempts(actions) == [] and stops(actions) == []


def test_a_restart_takes_no_room_from_others_it_goes_beside_or_in_place():
    # Found: a restart whose replacement fit nowhere beside it preempted a
    # lower-class replica, and was then restarted in place anyway.
    f = Fleet()
    f.register("a", gpus=1)
    f.register("b", gpus=1)
    f.apply(model("prod", priority="critical"))
    f.apply(model("batch", priority="opportunistic"))
    up(f)
    age(f)
    f.restart("prod-1")
    actions = f.decide()
    assert victims(actions) == []
    assert f.state.replicas["batch-1"].state == "ready"
    assert [(a.replica, a.replaces) for a in actions if isinstance(a, ev.PlaceReplica)] == [("prod-2", "prod-1")]


def test_a_restart_in_place_at_an_owners_limit_is_not_voided():
    # Found: decide counted the replaced replica's share as the
    # replacement's, the fold did not, and voided the replacement after
    # applying its predecessor's stop.
    f = Fleet()
    f.register("a", gpus=1)
    owner(f, "lab", limit=1)
    f.apply(model("train", owner="lab"))
    up(f)
    f.restart("train-1", in_place=True)
    actions = f.decide()
    assert [(a.replica, a.replaces) for a in actions if isinstance(a, ev.PlaceReplica)] == [("train-2", "train-1")]
    assert f.state.voided_count == 0 and "train-2" in f.state.replicas
    assert f.state.usage["lab"] == ev.Resources(gpus=1)


def _core_grew_then_pay_lost_a_node(f: Fleet, preemptor: str) -> None:
    """`core` (critical, min 1) grew to 2 under load, which has now gone
    quiet (it will scale down to 1 in this pass); `preemptor` (critical,
    min 2) just lost a replica with its node and fits nowhere."""
    f.register("a", gpus=1)
    f.register("b", gpus=2)
    f.register("c", gpus=1)
    f.apply(model(preemptor, min_replicas=2, priority="critical"))
    up(f)
    f.apply(model("core", priority="critical", max_replicas=2, target_load=1, scale_down_delay_s=100))
    f.load("core", in_flight=2)
    up(f)
    assert {r.id: r.shards[0].node for r in f.state.replicas.values() if r.model == "core"} == {
        "core-1": "b", "core-2": "b"}
    age(f, 300)
    f.load("core", in_flight=0)
    age(f, 200)
    f.lose("a" if f.state.replicas[f"{preemptor}-1"].shards[0].node == "a" else "c")


def test_a_preempted_replica_is_not_counted_by_its_models_scale_down_in_the_same_pass():
    # Found: "apex" (decided first) took core-2, above core's minimum; core's
    # own scale-down, later in the pass, still counted it and stopped
    # core-1 too: a critical model left with none.
    f = Fleet()
    _core_grew_then_pay_lost_a_node(f, "apex")
    actions = f.decide()
    assert victims(actions) == [("core-2", 3)]
    assert "core-1" not in stops(actions)
    assert f.state.replicas["core-1"].state == "ready"


def test_a_replica_scaled_down_earlier_in_the_pass_is_not_a_victim_and_the_minimum_holds():
    # The other order: core scales down first (core-2 stopped), then "zeta"
    # looks for victims: core-2 is no victim (its Preempt would be voided)
    # and core-1 is core's minimum.
    f = Fleet()
    _core_grew_then_pay_lost_a_node(f, "zeta")
    actions = f.decide()
    assert stops(actions)[-1:] == ["core-2"] or "core-2" in stops(actions)
    assert victims(actions) == []
    assert f.state.voided_count == 0
    assert f.state.replicas["core-1"].state == "ready"


def test_a_failed_replica_does_not_count_for_the_preemptors_minimum():
    # Found: the tally counts failed replicas as live, so a model whose
    # replica failed in this very pass was not below its minimum for a pass.
    f = Fleet()
    _core_grew_then_pay_lost_a_node(f, "apex")
    actions = f.decide()
    assert any(a.replica.startswith("apex") for a in actions if isinstance(a, ev.StopReplica))  # the failed one
    assert victims(actions) == [("core-2", 3)]  # in the same pass


def test_two_owners_do_not_take_turns_when_a_later_profile_is_larger():
    # Found: b's owner (guaranteed 1 GPU) took a replica back counting its
    # first profile (1 GPU, but no H100 here), was placed with its second
    # (2 GPUs), was past its guarantee again, so borrowed, so taken by a's
    # higher class, and took it back again: the two stopped each other in
    # turns for as long as anyone watched.
    f = Fleet()
    f.register("n", gpus=2, gpu_model="A100")
    owner(f, "q", gpus=1)
    owner(f, "p", limit=8)
    small, big = ev.ProfileSpec(name="small", gpus=1, gpu_model="H100"), ev.ProfileSpec(name="big", gpus=2)
    f.apply(model("b", owner="q", priority="opportunistic", profiles=[small, big]))
    up(f)
    age(f)
    f.apply(model("a", owner="p", priority="standard", gpus=2))
    took = []
    for _ in range(20):
        for p in preempts(f.decide()):
            took += [(p.model, v.model) for v in p.victims]
        for r in list(f.state.replicas.values()):
            if r.state == "stopping":
                f.stopped(r.id)
        f.make_ready()
        age(f, 50)
    assert took == [("a", "b")]
    assert f.states() == {"a-1": "ready"}


def test_what_a_replica_restarted_in_place_keeps_until_it_exits_is_not_placed_on():
    # Found by the properties (a fresh decision voided): a 2-GPU replica
    # restarted in place on a 1-GPU profile hands one GPU to its replacement
    # and keeps the other until it exits; the pass counted that one free and
    # placed another model on it.
    f = Fleet()
    f.register("a", gpus=2)
    f.apply(model("big", gpus=2))
    up(f)
    f.apply(model("big", gpus=1))
    f.apply(model("zed", gpus=1))
    actions = f.decide()
    assert [(a.replica, a.replaces) for a in actions if isinstance(a, ev.PlaceReplica)] == [("big-2", "big-1")]
    assert f.state.voided_count == 0
    assert waiting(f, "zed").startswith("no room")
    f.stopped("big-1")
    assert placed(f.decide()) == ["zed-1"]
