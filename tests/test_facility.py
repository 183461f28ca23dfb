"""Scenario tests of the facility's rules (issue 14): locations, holds,
drains, power caps, spread by rack and PDU, keep_within; one test per rule,
in the pure core (tests/scenario.py), decisions published and folded back."""

from __future__ import annotations

from llmgw.core.contract import events as ev
from llmgw.core.folding import facility_facts
from llmgw.core.scheduling import facility
from llmgw.core.folding.decisions import describe_action
from llmgw.core.simulation.history import verify
from llmgw.core.scheduling.explain import explain
from llmgw.core.scheduling.fit import render_explanation

from .scenario import Fleet, model


def loc(rack: str = "", pdu: str = "", **more: str) -> dict[str, str]:
    out = {f"llmgw.io/{k}": v for k, v in more.items()}
    if rack:
        out["llmgw.io/rack"] = rack
    if pdu:
        out["llmgw.io/pdu"] = pdu
    return out


def placed(actions) -> list[ev.PlaceReplica]:
    return [a for a in actions if isinstance(a, ev.PlaceReplica)]


def nodes_of(f: Fleet, model_name: str) -> list[str]:
    return sorted(s.node for r in f.state.replicas.values() if r.model == model_name and r.state != "stopping"
                  for s in r.shards)


def hold(f: Fleet, domain: str, drain: bool = False, reason: str = "maintenance") -> None:
    f.publish(ev.DomainHeld(at=f.tick(), domain=domain, drain=drain, reason=reason))


def assert_verifies(f: Fleet) -> None:
    checked, differences = verify(f.log)
    assert checked and differences == []


# --------------------------------------------------------------------------- locations


def test_operator_labels_win_over_the_agents_until_removed():
    f = Fleet()
    f.register("a", labels=loc(rack="r1", pdu="p1"))
    assert facility_facts.location(f.state.nodes["a"]) == {"rack": "r1", "pdu": "p1"}
    f.publish(ev.NodeLabeled(at=f.tick(), node="a", set={"rack": "r4-12"}))
    assert facility_facts.location(f.state.nodes["a"]) == {"rack": "r4-12", "pdu": "p1"}
    f.register("a", labels=loc(rack="r1", pdu="p1"))  # re-registration: the operator's still win
    assert facility_facts.location(f.state.nodes["a"])["rack"] == "r4-12"
    f.publish(ev.NodeLabeled(at=f.tick(), node="a", remove=["rack"]))
    assert facility_facts.location(f.state.nodes["a"])["rack"] == "r1"


def test_a_label_that_is_not_a_location_is_refused():
    f = Fleet()
    f.register("a")
    f.publish(ev.NodeLabeled(at=f.tick(), node="a", set={"llmgw.io/fabric": "x"}))
    assert f.state.quarantine_count == 1 and "only location labels" in f.state.quarantined[-1].error
    f.publish(ev.NodeLabeled(at=f.tick(), node="a", set={"llmgw.io/pool": "x"}))  # the pool is the operator's too
    assert f.state.quarantine_count == 1 and f.state.nodes["a"].labels["llmgw.io/pool"] == "x"


# --------------------------------------------------------------------------- spread


def test_spread_goes_to_the_rack_then_the_pdu_then_the_node():
    f = Fleet()
    # Two racks; rack r1 has two PDUs. Best fit alone would fill a1 first.
    f.register("a1", labels=loc("r1", "p1"))
    f.register("a2", labels=loc("r1", "p1"))
    f.register("a3", labels=loc("r1", "p2"))
    f.register("b1", labels=loc("r2", "p3"))
    f.apply(model("m", min_replicas=3))
    f.decide()
    where = nodes_of(f, "m")
    # One per rack first (a1, b1), then the other PDU of r1 (a3), not a2.
    assert where == ["a1", "a3", "b1"]


# --------------------------------------------------------------------------- holds


def test_nothing_new_is_placed_in_a_held_domain():
    f = Fleet()
    f.register("a", labels=loc("r1"))
    f.register("b", labels=loc("r2"))
    hold(f, "rack/r1")
    f.apply(model("m", min_replicas=2, gpus=8))
    f.decide()
    assert nodes_of(f, "m") == ["b"]
    waiting = f.state.models["m"].waiting
    assert "rack/r1 is held: maintenance" in waiting
    lines = render_explanation(explain(f.state, "m"))
    assert any("a: rack/r1 is held: maintenance" in line for line in lines)
    f.publish(ev.DomainReleased(at=f.tick(), domain="rack/r1"))
    f.decide()
    assert nodes_of(f, "m") == ["a", "b"]
    assert_verifies(f)


def test_a_placed_replica_keeps_the_rejections_its_placement_saw():
    f = Fleet()
    f.register("a", labels=loc("r1"))
    f.register("b", labels=loc("r2"))
    hold(f, "rack/r1")
    f.apply(model("m"))
    f.decide()
    (rep,) = f.state.replicas.values()
    assert rep.shards[0].node == "b"
    assert rep.rejections == ["rack/r1 is held: maintenance"]


def test_a_decision_in_a_domain_held_since_is_voided():
    f = Fleet()
    f.register("a", labels=loc("r1"))
    f.apply(model("m"))
    actions = __import__("llmgw.core.rules.decide", fromlist=["decide"]).decide(f.state, f.tick())
    hold(f, "rack/r1")
    f.publish(ev.Decided(at=f.tick(), basis=f.state.seq, actions=actions))
    assert not f.state.replicas
    assert f.state.voided[-1].reason == "rack/r1 is held: maintenance"


def test_drain_replaces_beside_first_then_stops_never_below_desired():
    f = Fleet()
    f.register("a", gpus=2, labels=loc("r1"))
    f.register("b", gpus=2, labels=loc("r2"))
    f.apply(model("m", min_replicas=2, gpus=2))
    f.decide()
    f.make_ready()
    assert nodes_of(f, "m") == ["a", "b"]
    f.register("c", gpus=2, labels=loc("r3"))
    hold(f, "rack/r1", drain=True)
    actions = f.decide()
    said = [describe_action(a) for a in actions]
    assert said == ["restart m-1", "place m-3 (m/default) on c:[0, 1]"]
    assert actions[0].reason == "rack/r1 is held for draining: maintenance"
    assert len(f.ready("m")) == 2  # nothing stopped before its replacement serves
    f.make_ready()
    actions = f.decide()
    assert [describe_action(a) for a in actions] == ["stop m-1 after a drain of up to 30s"]
    f.stopped("m-1")
    assert f.decide() == []
    assert nodes_of(f, "m") == ["b", "c"]
    assert_verifies(f)


def test_drain_with_nowhere_to_go_stays_and_says_why():
    f = Fleet()
    f.register("a", gpus=2, labels=loc("r1"))
    f.register("b", gpus=2, labels=loc("r2"))
    f.apply(model("m", min_replicas=2, gpus=2))
    f.decide()
    f.make_ready()
    hold(f, "rack/r1", drain=True)
    actions = f.decide()
    refused = [a for a in actions if isinstance(a, ev.RefuseRestart)]
    assert refused and refused[0].replica == "m-1"
    assert "rack/r1 is held for draining" in refused[0].reason and "fits nowhere else" in refused[0].reason
    assert len(f.ready("m")) == 2
    assert f.decide() == []  # said once, not every pass
    f.register("c", gpus=2, labels=loc("r3"))  # room appears: it moves
    actions = f.decide()
    assert [describe_action(a) for a in actions] == ["restart m-1", "place m-3 (m/default) on c:[0, 1]"]
    assert_verifies(f)


# --------------------------------------------------------------------------- power


def test_a_shard_that_would_take_a_domain_past_its_cap_is_refused_there():
    f = Fleet()
    f.register("a", gpus=8, labels=loc("r1", "pdu-a"), power_w=700)
    f.register("b", gpus=8, labels=loc("r2", "pdu-b"), power_w=700)
    f.publish(ev.FacilityApplied(at=f.tick(), budgets={"pdu/pdu-a": 12000.0}))
    # Declared draw: 4 GPUs at 3 kW a shard; pdu-a has room for 4 of them.
    f.apply(model("m", min_replicas=10, profiles=[ev.ProfileSpec(name="p", gpus=1, power_w=3000)]))
    f.decide()
    on_a = [n for n in nodes_of(f, "m") if n == "a"]
    assert len(on_a) == 4 and len(nodes_of(f, "m")) == 10
    fits = explain(f.state, "m")
    reasons = [facility.render(r.rule, r.need, r.have) for pf in fits.profiles for nf in pf.nodes
               if nf.node == "a" for r in nf.reasons]
    assert reasons == ["pdu/pdu-a would draw 15 kW of 12 kW"]
    assert_verifies(f)


def test_derived_draw_counts_the_gpus_power_limits_until_measured():
    f = Fleet()
    f.register("a", gpus=8, labels=loc("r1", "pdu-a"), power_w=700)
    f.publish(ev.FacilityApplied(at=f.tick(), budgets={"pdu/pdu-a": 2100.0}))
    f.apply(model("m", min_replicas=4))
    f.decide()
    assert len(nodes_of(f, "m")) == 3  # 3 x 700 W
    assert "pdu/pdu-a would draw 2.8 kW of 2.1 kW" in f.state.models["m"].waiting
    f.make_ready()
    # Measured: the three engines draw 300 W each, the node 900 W in all.
    f.publish(ev.NodePower(at=f.tick(), node="a", watts=900.0, gpus={0: 300.0, 1: 300.0, 2: 300.0}))
    assert facility_facts.node_draw(f.state.nodes["a"]) == 900.0
    f.decide()
    assert len(nodes_of(f, "m")) == 4
    (row,) = [r for r in facility_facts.domain_rows(f.state) if r.domain == "pdu/pdu-a"]
    assert row.draw_w == 900.0 + 700.0 and row.cap_w == 2100.0 and row.gpus_used == 4
    assert_verifies(f)


def test_an_adopted_shard_counts_its_draw():
    f = Fleet()
    f.register("a", gpus=8, labels=loc("r1", "pdu-a"), power_w=700)
    f.publish(ev.FacilityApplied(at=f.tick(), budgets={"pdu/pdu-a": 1000.0}))
    f.apply(model("m", min_replicas=1))
    f.apply(model("n", min_replicas=1))
    running = [ev.RunningShard(shard="m-1.0", replica="m-1", model="m", profile="default", generation=1, gpus=[0],
                               port=20000, state="ready")]
    f.register("a", gpus=8, labels=loc("r1", "pdu-a"), power_w=700, running=running)
    assert f.state.replicas["m-1"].shards[0].power_w == 700.0
    f.decide()
    assert nodes_of(f, "n") == []  # 700 + 700 > 1000
    # m-1 (adopted, its fingerprint unknown) is restarted in place in the
    # same pass: until it exits it counts beside its replacement, as the
    # fold counts them, so n would make three shards' draw.
    assert "pdu/pdu-a would draw 2.1 kW of 1 kW" in f.state.models["n"].waiting
    assert_verifies(f)


def test_preemption_makes_room_only_where_the_power_is():
    f = Fleet()
    f.register("a", gpus=1, labels=loc("r1", "pdu-a"), power_w=700)
    f.register("b", gpus=1, labels=loc("r2", "pdu-b"), power_w=700)
    f.publish(ev.FacilityApplied(at=f.tick(), budgets={"pdu/pdu-b": 500.0}))
    f.apply(model("low", min_replicas=1, priority="opportunistic"))
    f.decide()
    f.make_ready()
    assert nodes_of(f, "low") == ["a"]
    f.tick(1000)
    f.apply(model("hi", min_replicas=1, priority="critical"))
    actions = f.decide()
    # b is free but its PDU has no power for a 700 W shard: the victim is on a.
    pre = [a for a in actions if isinstance(a, ev.Preempt)]
    assert pre and [v.replica for v in pre[0].victims] == ["low-1"]
    assert_verifies(f)


def test_the_shards_of_a_multi_node_replica_fit_the_caps_together_and_the_fabric_is_searched_on():
    f = Fleet()
    ib = {"llmgw.io/fabric": "ib"}
    # a1 and a2 are the best fit (fewest free GPUs), but pdu-a has room for
    # one more 1.4 kW shard only; b1, in another PDU of the same fabric, has room.
    f.register("a1", gpus=2, labels={**ib, **loc("r1", "pdu-a")}, power_w=700)
    f.register("a2", gpus=2, labels={**ib, **loc("r1", "pdu-a")}, power_w=700)
    f.register("b1", gpus=8, labels={**ib, **loc("r2", "pdu-b")}, power_w=700)
    f.register("c1", gpus=2, labels={"llmgw.io/fabric": "other", **loc("r3", "pdu-c")}, power_w=700)
    f.register("c2", gpus=2, labels={"llmgw.io/fabric": "other", **loc("r3", "pdu-c")}, power_w=700)
    f.publish(ev.FacilityApplied(at=f.tick(), budgets={"pdu/pdu-a": 2000.0}))
    f.apply(model("m", profiles=[ev.ProfileSpec(name="p", gpus=2, nodes=2)]))
    f.decide()
    # Not a1 and a2 together (2.8 kW of 2 kW), nor the fabric given up for
    # "other": a1, then b1 beside it.
    (rep,) = f.state.replicas.values()
    assert [s.node for s in rep.shards] == ["a1", "b1"]
    assert_verifies(f)


# --------------------------------------------------------------------------- keep_within


def test_keep_within_puts_every_shard_of_a_multi_node_replica_in_one_domain():
    f = Fleet()
    ib = {"llmgw.io/fabric": "ib"}
    f.register("a1", gpus=2, labels={**ib, **loc("r1")})
    f.register("b1", gpus=2, labels={**ib, **loc("r2")})
    f.register("b2", gpus=2, labels={**ib, **loc("r2")})
    f.apply(model("m", profiles=[ev.ProfileSpec(name="p", gpus=2, nodes=2, keep_within="rack")]))
    f.decide()
    assert nodes_of(f, "m") == ["b1", "b2"]
    f.apply(model("n", profiles=[ev.ProfileSpec(name="p", gpus=1, nodes=2, keep_within="rack")]))
    f.decide()
    assert nodes_of(f, "n") == []
    assert "keep within: needs 2 nodes that fit in one rack, has 1 in rack/r1" in f.state.models["n"].waiting
    assert_verifies(f)
