"""Scenario tests of the fold and its decisions: events in, state and
decisions out, one rule each, named after the rule."""

import pytest

from llmgw.core.folding import commands as cmds
from llmgw.core.contract import events as ev
from llmgw.core.rules.decide import decide
from llmgw.core.folding.fold import copy_state
from llmgw.core.simulation.history import verify

from .scenario import Fleet, model


def test_a_model_gets_its_minimum_placed_and_spread_over_nodes():
    f = Fleet()
    f.register("a", gpus=4)
    f.register("b", gpus=4)
    f.apply(model("m", min_replicas=3, gpus=2))
    actions = f.decide()
    placed = [a for a in actions if isinstance(a, ev.PlaceReplica)]
    assert [(p.replica, p.shards[0].node, p.shards[0].gpus) for p in placed] == [
        ("m-1", "a", [0, 1]),
        ("m-2", "b", [0, 1]),
        ("m-3", "a", [2, 3]),
    ]
    assert f.decide() == []  # nothing left to do once its own decision is folded


def test_a_replica_becomes_ready_when_every_shard_reports_ready():
    f = Fleet()
    f.register("a")
    f.apply(model("m"))
    f.decide()
    assert f.states() == {"m-1": "placing"}
    f.report("m-1.0", "starting")
    f.report("m-1.0", "loading")
    assert f.states() == {"m-1": "loading"}
    f.report("m-1.0", "ready")
    assert f.states() == {"m-1": "ready"}


def test_gpu_memory_decides_which_profile_fits():
    f = Fleet()
    f.register("small", gpus=2, mem=24)
    spec = model(
        "m",
        profiles=[
            ev.ProfileSpec(name="big", gpus=1, gpu_memory_gb=80),
            ev.ProfileSpec(name="small", gpus=2, gpu_memory_gb=24),
        ],
    )
    f.apply(spec)
    (place,) = f.decide()
    assert place.profile == "small"


def test_a_model_that_fits_nowhere_waits_with_its_reason_said_once():
    f = Fleet()
    f.register("a", gpus=2)
    f.apply(model("big", gpus=4))
    (wait,) = f.decide()
    assert isinstance(wait, ev.ModelWaiting)
    assert "profile default needs a node with 4 free GPU(s)" in wait.reason
    assert f.state.models["big"].waiting == wait.reason
    assert f.decide() == []  # the same reason is not said again
    f.register("b", gpus=8)
    (place,) = f.decide()
    assert isinstance(place, ev.PlaceReplica) and place.shards[0].node == "b"
    assert f.state.models["big"].waiting == ""


def test_a_failed_replica_is_stopped_and_replaced_in_one_message():
    f = Fleet()
    f.register("a", gpus=2)
    f.apply(model("m", gpus=1))
    f.decide()
    f.make_ready()
    f.report("m-1.0", "failed", reason="CUDA error")
    actions = f.decide()
    assert [type(a) for a in actions] == [ev.StopReplica, ev.PlaceReplica]
    assert "CUDA error" in actions[0].reason
    assert actions[1].replica == "m-2"
    assert f.states() == {"m-2": "placing"}  # the failed one held nothing any more: gone


def test_a_lost_node_fails_its_shards_and_they_are_replaced_elsewhere():
    f = Fleet()
    f.register("a", gpus=1)
    f.register("b", gpus=1)
    f.apply(model("m"))
    f.decide()
    f.make_ready()
    node = f.state.replicas["m-1"].shards[0].node
    f.lose(node, "no heartbeat for 12s")
    assert f.state.replicas["m-1"].state == "failed"
    assert "no heartbeat" in f.state.replicas["m-1"].reason
    stop, place = f.decide()
    assert place.shards[0].node != node
    assert f.state.nodes[node].used == {}


def test_removing_a_model_stops_its_replicas_and_they_go_when_stopped():
    f = Fleet()
    f.register("a")
    f.apply(model("m", min_replicas=2))
    f.decide()
    f.make_ready()
    f.remove("m")
    actions = f.decide()
    assert {a.replica for a in actions} == {"m-1", "m-2"}
    assert all("removed" in a.reason for a in actions)
    assert f.states() == {"m-1": "stopping", "m-2": "stopping"}
    stops = [c for _, c in cmds.outstanding(f.state)]
    assert {type(c) for c in stops} == {cmds.StopShard}
    f.report("m-1.0", "stopped")
    f.report("m-2.0", "stopped")
    assert f.states() == {}
    assert f.state.nodes["a"].used == {}


def test_a_changed_profile_replaces_the_replicas_that_run_the_old_one():
    f = Fleet()
    f.register("a")
    f.apply(model("m", gpus=1))
    f.decide()
    f.make_ready()
    f.apply(model("m", gpus=2))
    stop, place = f.decide()
    assert stop.replica == "m-1" and "changed" in stop.reason
    assert place.replica == "m-2" and len(place.shards[0].gpus) == 2


def test_a_decision_that_no_longer_holds_is_voided_not_applied():
    # Two decisions taken on the same state, as a stale leader would: the
    # second one's GPUs are taken by the time it is folded.
    f = Fleet()
    f.register("a", gpus=1)
    f.apply(model("m"))
    stale = copy_state(f.state)
    f.decide()
    actions = decide(stale, f.tick())
    f.publish(ev.Decided(at=f.now, basis=stale.seq, actions=actions))
    assert list(f.state.replicas) == ["m-1"]
    assert f.state.voided_count == 1
    assert "exists already" in f.state.voided[0].reason


def test_a_placement_on_a_gpu_someone_holds_is_voided():
    f = Fleet()
    f.register("a", gpus=2)
    f.apply(model("m"))
    f.apply(model("n"))
    stale = copy_state(f.state)
    f.decide()  # m-1 on GPU 0, n-1 on GPU 1
    other = ev.PlaceReplica(
        replica="n-2",
        model="n",
        profile="default",
        fingerprint=f.state.models["n"].fingerprints["default"],
        shards=[ev.ShardPlacement(shard="n-2.0", node="a", rank=0, gpus=[0], port=20099)],
        reason="stale",
    )
    f.publish(ev.Decided(at=f.tick(), basis=stale.seq, actions=[other]))
    assert "n-2" not in f.state.replicas
    assert "GPU 0 on a is held by m-1.0" in f.state.voided[-1].reason


@pytest.mark.parametrize(
    "gpus, why",
    [([0, 1, 2], "takes GPUs [0, 1, 2]; profile default asks 1"), ([0, 0], "takes GPUs [0, 0]; profile default asks 1")],
)
def test_a_placement_that_takes_more_than_its_profile_asks_is_voided(gpus, why):
    # An owner's limits are counted by the profile: a decision naming three
    # GPUs for a one-GPU profile took an owner past its limit (a rogue or
    # buggy leader; tests/test_preemption_properties.py found it).
    f = Fleet()
    f.register("a", gpus=4)
    f.apply(model("m"))
    grab = ev.PlaceReplica(
        replica="m-1",
        model="m",
        profile="default",
        fingerprint=f.state.models["m"].fingerprints["default"],
        shards=[ev.ShardPlacement(shard="m-1.0", node="a", rank=0, gpus=gpus, port=20099)],
        reason="rogue",
    )
    f.publish(ev.Decided(at=f.tick(), basis=f.state.seq, actions=[grab]))
    assert "m-1" not in f.state.replicas and f.state.nodes["a"].used == {}
    assert why in f.state.voided[-1].reason


def test_a_late_report_about_an_older_generation_changes_nothing():
    f = Fleet()
    f.register("a")
    f.apply(model("m"))
    f.decide()
    f.make_ready()
    gen = f.state.replicas["m-1"].shards[0].generation
    f.report("m-1.0", "failed", generation=gen - 1)
    assert f.states() == {"m-1": "ready"}


def test_a_reregistering_agent_that_lost_an_engine_fails_its_shard():
    # Seen for real: the engine died while its agent lived; the agent restarted
    # and registered with nothing running, and the replica stayed "ready" on a
    # dead port. The registration is the whole truth about the node.
    f = Fleet()
    f.register("a", gpus=2)
    f.apply(model("m", min_replicas=2))
    f.decide()
    f.make_ready()
    running = [r for r in f.running_on("a") if r.replica == "m-1"]
    f.register("a", gpus=2, running=running)
    assert f.state.replicas["m-1"].state == "ready"
    assert f.state.replicas["m-2"].state == "failed"
    assert f.state.replicas["m-2"].reason.endswith("the agent reports it is not running")
    assert set(f.state.nodes["a"].used) == {0}


def test_a_stray_keeps_its_gpus_and_port_until_it_exits():
    f = Fleet()
    stray = ev.RunningShard(shard="old-1.0", replica="old-1", model="old", profile="p", generation=7, gpus=[0], port=20000)
    f.register("a", gpus=2, running=[stray])
    f.apply(model("m", min_replicas=2))
    actions = f.decide()
    assert isinstance(actions[0], ev.StopStray) and "no model old" in actions[0].reason
    places = [a for a in actions if isinstance(a, ev.PlaceReplica)]
    assert [p.shards[0].gpus for p in places] == [[1]]
    assert places[0].shards[0].port != 20000
    assert [c for _, c in cmds.outstanding(f.state) if isinstance(c, cmds.StopShard)][0].shard == "old-1.0"
    f.publish(ev.ShardStatus(at=f.tick(), node="a", replica="old-1", shard="old-1.0", generation=7, state="stopped"))
    assert f.state.nodes["a"].strays == {}
    (place,) = [a for a in f.decide() if isinstance(a, ev.PlaceReplica)]
    assert place.shards[0].gpus == [0]


def test_replicas_above_the_maximum_are_stopped_newest_and_unready_first():
    f = Fleet()
    f.register("a")
    f.apply(model("m", min_replicas=3))
    f.decide()
    f.make_ready()
    f.apply(model("m", min_replicas=1))
    f.apply(model("m", min_replicas=1, max_replicas=1))
    actions = f.decide()
    assert sorted(a.replica for a in actions) == ["m-2", "m-3"]


def test_multi_node_profiles_take_one_shard_per_node():
    f = Fleet()
    f.register("a", gpus=8, labels={"llmgw.io/fabric": "ib"})
    f.register("b", gpus=8, labels={"llmgw.io/fabric": "ib"})
    f.apply(model("big", profiles=[ev.ProfileSpec(name="tp8pp2", gpus=8, nodes=2)]))
    (place,) = f.decide()
    assert [(s.node, s.rank) for s in place.shards] == [("a", 0), ("b", 1)]
    start = [c for _, c in cmds.outstanding(f.state)]
    assert {c.nodes[0] for c in start} == {"a"}


def test_bad_input_is_quarantined_and_the_fold_goes_on():
    f = Fleet()
    f.register("a")
    f.publish(ev.NodeRegistered(at=f.tick(), node="b"), subject="llmgw.agent.a.node.registered")  # speaks for another node
    f.log.append((len(f.log) + 1, "llmgw.agent.a.x", b"not json"))
    from llmgw.core.folding.fold import apply

    apply(f.state, len(f.log), "llmgw.agent.a.x", b"not json")
    apply(f.state, len(f.log) + 1, "llmgw.ctl.x", b'{"type":"model.exploded","at":1}')
    apply(f.state, len(f.log) + 2, "llmgw.agent.a.node.registered", b'{"type":"model.removed","at":1,"name":"m"}')
    assert f.state.quarantine_count == 4
    assert [q.seq for q in f.state.quarantined] == [2, 3, 4, 5]
    assert "may not speak for node b" in f.state.quarantined[0].error
    assert "model.exploded" in f.state.quarantined[2].error
    assert "llmgw.ctl." in f.state.quarantined[3].error
    assert "b" not in f.state.nodes
    f.apply(model("m"))
    assert f.decide()  # still deciding


def test_an_invalid_model_spec_is_quarantined_with_its_reason():
    f = Fleet()
    f.apply(ev.ModelSpec(name="m", profiles=[]))
    assert f.state.models == {}
    assert "has no profile" in f.state.quarantined[0].error


def test_verify_finds_no_difference_in_an_honest_log_and_one_in_a_forged_decision():
    f = Fleet()
    f.register("a", gpus=2)
    f.apply(model("m", min_replicas=2))
    f.decide()
    f.make_ready()
    checked, diffs = verify(f.log)
    assert (checked, diffs) == (1, [])
    f.apply(model("n"))
    forged = ev.ModelWaiting(model="n", reason="forged")
    f.publish(ev.Decided(at=f.tick(), basis=f.state.seq, actions=[forged]))
    checked, diffs = verify(f.log)
    assert checked == 2 and len(diffs) == 1
    assert diffs[0].recorded == ["n waits"]


def test_a_shard_given_up_on_a_lost_node_is_a_stray_when_it_comes_back_and_exits_freely():
    # A two-node replica loses one node; the other half is stopped. The lost
    # node returns still running its half: a stray, whose exit must free its
    # GPUs although its replica id is still known.
    f = Fleet()
    f.register("a", gpus=4, labels={"llmgw.io/fabric": "ib"})
    f.register("b", gpus=4, labels={"llmgw.io/fabric": "ib"})
    f.apply(model("m", profiles=[ev.ProfileSpec(name="pp2", gpus=4, nodes=2)]))
    f.decide()
    f.make_ready()
    running = f.running_on("a")
    f.lose("a")
    f.decide()  # stops m-1: its half on b is asked to stop
    f.register("a", gpus=4, running=running, labels={"llmgw.io/fabric": "ib"})
    assert "given up here" in f.state.nodes["a"].strays["m-1.0"].reason
    f.decide()  # stops the stray
    gen = running[0].generation
    f.publish(ev.ShardStatus(at=f.tick(), node="a", replica="m-1", shard="m-1.0", generation=gen, state="stopped"))
    assert f.state.nodes["a"].strays == {} and f.state.nodes["a"].used == {}
    f.report("m-1.1", "stopped")
    assert "m-1" not in f.state.replicas
    (place,) = f.decide()
    assert {s.node for s in place.shards} == {"a", "b"}


def test_replica_ids_are_handed_out_in_order_and_never_twice():
    f = Fleet()
    f.register("a", gpus=2)
    f.apply(model("m"))
    stale = copy_state(f.state)
    f.decide()
    f.make_ready()
    f.report("m-1.0", "failed")
    f.decide()  # m-1 stopped and gone, m-2 placed
    f.report("m-2.0", "failed")  # it failed to start: the model backs off
    f.tick(10)
    f.decide()
    # A decision taken long ago names m-1 again: voided, though m-1 is gone.
    f.publish(ev.Decided(at=f.tick(), basis=stale.seq, actions=decide(stale, f.now)))
    assert "m-1" not in f.state.replicas
    assert "not the next one for m (m-4)" in f.state.voided[-1].reason


def test_a_copied_state_equals_its_original():
    f = Fleet()
    f.register("a", labels={"llmgw.io/rack": "r1", "llmgw.io/pdu": "p1"}, power_w=700)
    f.register("b", labels={"llmgw.io/rack": "r1", "llmgw.io/pdu": "p2"}, power_w=700)
    f.publish(ev.FacilityApplied(at=f.tick(), budgets={"rack/r1": 9000.0}))
    f.apply(model("m", min_replicas=2))
    f.decide()
    assert copy_state(f.state) == f.state
