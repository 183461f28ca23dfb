"""Node admission (core/rules/admission.py, issue 35 finding 5): each rule tried
as the attacker did, in the pure core. (Over real processes:
tests/test_admission_e2e.py.)"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.core.rules import admission
from llmgw.core.contract import events as ev
from llmgw.core.contract.catalog import profile_named
from llmgw.core.folding.decisions import describe_action
from llmgw.core.simulation.history import verify
from llmgw.core.contract.policy import Policy

from .fleet_strategies import World
from .scenario import Fleet, model

POOL = "llmgw.io/pool"
SECURE = model("secure", profiles=[ev.ProfileSpec(name="p", gpus=1, pool="secure")])


def said(actions: list[ev.Action]) -> list[str]:
    return [describe_action(a) for a in actions]


def policy(f: Fleet, **kw) -> None:
    f.publish(ev.PolicyApplied(at=f.tick(), policy=Policy(**kw)))


# --------------------------------------------------------------------------- rule 1: the pool is the operator's


def test_a_node_that_claims_a_pool_gets_no_model_of_that_pool_until_an_operator_sets_it():
    f = Fleet()
    f.register("attacker", gpus=8, gpu_model="H100", labels={POOL: "secure", "llmgw.io/rack": "r1"})
    f.apply(SECURE)
    (wait,) = f.decide()
    assert isinstance(wait, ev.ModelWaiting) and "pool: needs secure, has no llmgw.io/pool label" in wait.reason
    node = f.state.nodes["attacker"]
    assert POOL not in node.labels and node.labels["llmgw.io/rack"] == "r1"  # a location still counts
    assert admission.unadmitted(node) == {POOL: "secure"}  # `ctl describe node` shows the claim
    f.admit("attacker", pool="secure")  # the operator's word: `ctl label`, `ctl node admit`
    assert admission.unadmitted(f.state.nodes["attacker"]) == {}
    assert said(f.decide()) == ["place secure-1 (secure/p) on attacker:[0]"]


def test_the_operator_s_pool_wins_over_the_node_s_own_and_removing_it_leaves_none():
    f = Fleet()
    f.register("a", gpus=2, labels={POOL: "batch"})
    f.admit("a", pool="secure")
    assert f.state.nodes["a"].labels[POOL] == "secure" and admission.unadmitted(f.state.nodes["a"]) == {POOL: "batch"}
    f.register("a", gpus=2, labels={POOL: "batch"})  # a registration again keeps the operator's
    assert f.state.nodes["a"].labels[POOL] == "secure"
    f.publish(ev.NodeLabeled(at=f.tick(), node="a", remove=["pool"]))
    assert POOL not in f.state.nodes["a"].labels


def test_policy_open_counts_the_node_s_own_word_and_operator_takes_it_back():
    f = Fleet()
    f.register("a", gpus=2, labels={POOL: "secure"})
    f.apply(SECURE)
    policy(f, admission="open")
    assert f.state.nodes["a"].labels[POOL] == "secure"
    assert said(f.decide()) == ["place secure-1 (secure/p) on a:[0]"]
    policy(f, admission="operator")
    assert POOL not in f.state.nodes["a"].labels  # placed no more there (what runs stays)
    f.register("b", gpus=2, labels={POOL: "secure"})
    f.apply(model("secure", min_replicas=2, profiles=SECURE.profiles))
    assert [a for a in f.decide() if isinstance(a, ev.PlaceReplica)] == []


def test_manual_admission_places_on_a_node_only_once_admitted_and_while_it_claims_no_more():
    f = Fleet()
    policy(f, admission="manual")
    f.register("a", gpus=2, gpu_model="A100", labels={POOL: "secure"})
    f.apply(model("m"))
    (wait,) = f.decide()
    assert isinstance(wait, ev.ModelWaiting) and "waits for admission (`llmgw ctl node admit a`" in wait.reason
    f.publish(ev.NodeAdmitted(at=f.tick(), node="a", gpus=2, gpu_models=["A100"], pool="secure"))
    node = f.state.nodes["a"]
    assert node.cordon == "" and node.labels[POOL] == "secure" and node.operator_labels[POOL] == "secure"
    assert said(f.decide()) == ["place m-1 (m/default) on a:[0]"]
    f.make_ready()
    # It claims more than it was admitted with: cordoned again; what runs stays.
    f.register("a", gpus=8, gpu_model="H100", running=f.running_on("a"), labels={POOL: "secure"})
    node = f.state.nodes["a"]
    assert node.cordon.startswith("claims 8 GPU(s) (H100), admitted with 2 (A100)")
    assert f.state.replicas["m-1"].state == "ready"
    f.apply(model("m", min_replicas=2))
    assert [a for a in f.decide() if isinstance(a, ev.PlaceReplica)] == []
    # A stale placement decided before the cordon is voided by the fold.
    rogue = ev.PlaceReplica(replica="m-2", model="m", profile="default", fingerprint=f.state.models["m"].fingerprints["default"],
                            shards=[ev.ShardPlacement(shard="m-2.0", node="a", rank=0, gpus=[5], port=20005)], reason="stale")
    f.publish(ev.Decided(at=f.tick(), basis=f.state.seq, actions=[rogue]))
    assert "m-2" not in f.state.replicas and "claims 8 GPU(s)" in f.state.voided[-1].reason
    f.publish(ev.NodeAdmitted(at=f.tick(), node="a", gpus=8, gpu_models=["H100"]))
    assert said(f.decide()) == ["place m-2 (m/default) on a:[1]"]
    policy(f, admission="operator")  # back: nothing cordoned
    f.register("b", gpus=1)
    assert f.state.nodes["b"].cordon == ""


def test_manual_admission_a_node_not_admitted_adopts_nothing():
    f = Fleet()
    policy(f, admission="manual")
    f.apply(model("m"))
    engine = ev.RunningShard(shard="m-9.0", replica="m-9", model="m", profile="default", generation=3, gpus=[0],
                             port=20000, state="ready", endpoint="http://x:20000")
    f.register("x", gpus=1, running=[engine])
    assert "m-9" not in f.state.replicas and "waits for admission" in f.state.nodes["x"].strays["m-9.0"].reason


# --------------------------------------------------------------------------- rule 2: only what the log placed there


def _placed_on_b_then_claimed_by_a() -> Fleet:
    f = Fleet()
    f.register("b", gpus=1)
    f.apply(model("m"))
    assert said(f.decide()) == ["place m-1 (m/default) on b:[0]"]
    f.register("a", gpus=1)
    claimed = ev.RunningShard(shard="m-1.0", replica="m-1", model="m", profile="default",
                              generation=f.state.replicas["m-1"].shards[0].generation, gpus=[0], port=20000,
                              state="ready", endpoint="http://attacker:20000")
    f.register("a", gpus=1, running=[claimed])
    return f


def test_a_node_that_registers_a_replica_placed_on_another_node_does_not_take_it_over():
    f = _placed_on_b_then_claimed_by_a()
    rep = f.state.replicas["m-1"]
    assert [(s.node, s.state, s.endpoint) for s in rep.shards] == [("b", "placing", "")]  # the genuine one stays
    assert f.state.nodes["a"].strays["m-1.0"].reason == "replica m-1 was placed on b: node a may claim only shards placed on it"
    assert said(f.decide()) == ["stop stray m-1.0 on a"]  # what it runs under that id is stopped


def test_a_shard_status_from_another_node_changes_nothing():
    f = _placed_on_b_then_claimed_by_a()
    f.register("c", gpus=1)
    generation = f.state.replicas["m-1"].shards[0].generation
    for node in ("a", "c"):  # a: about the stray it runs under that id (ignored); c: quarantined
        f.publish(ev.ShardStatus(at=f.tick(), node=node, replica="m-1", shard="m-1.0", generation=generation,
                                 state="ready", endpoint=f"http://{node}:20000"))
    assert f.state.quarantine_count == 1 and "runs on b, not on c" in f.state.quarantined[-1].error
    assert [(s.node, s.state, s.endpoint) for s in f.state.replicas["m-1"].shards] == [("b", "placing", "")]


def test_an_engine_the_log_never_placed_is_adopted_only_onto_a_node_of_its_profile_s_pool():
    f = Fleet()
    f.apply(SECURE)
    invented = ev.RunningShard(shard="secure-7.0", replica="secure-7", model="secure", profile="p", generation=3,
                               gpus=[0], port=20000, state="ready", endpoint="http://attacker:20000")
    f.register("attacker", gpus=1, labels={POOL: "secure"}, running=[invented])
    assert "secure-7" not in f.state.replicas
    assert "runs only in pool secure, and node attacker is in no pool" in f.state.nodes["attacker"].strays["secure-7.0"].reason
    f.admit("trusted", pool="secure")
    f.register("trusted", gpus=1, running=[invented])  # a node of the pool: a fleet outliving its log
    assert [s.node for s in f.state.replicas["secure-7"].shards] == ["trusted"]


def test_a_rank_of_a_replica_being_rebuilt_is_claimed_once():
    f = Fleet()
    f.apply(model("m", profiles=[ev.ProfileSpec(name="p", gpus=1, nodes=2)]))
    half = ev.RunningShard(shard="m-4.0", replica="m-4", model="m", profile="p", generation=3, rank=0, gpus=[0],
                           port=20000, state="ready")
    f.register("a", gpus=1, labels={"llmgw.io/fabric": "ib"}, running=[half])
    assert f.state.replicas["m-4"].want_shards == 2
    f.register("x", gpus=1, labels={"llmgw.io/fabric": "ib"}, running=[half])  # rank 0 again
    assert "rank 0 of m-4 was reported by a already" in f.state.nodes["x"].strays["m-4.0"].reason
    assert [s.node for s in f.state.replicas["m-4"].shards] == ["a"]


# --------------------------------------------------------------------------- rule 3: a start deadline


def test_a_placement_not_ready_by_its_start_deadline_is_a_start_failure_and_goes_elsewhere():
    f = Fleet()
    policy(f, start_timeout_s=60)
    f.register("idle", gpus=1)  # never starts what it is given
    f.apply(model("m"))
    assert said(f.decide()) == ["place m-1 (m/default) on idle:[0]"]
    f.register("good", gpus=8)
    f.tick(55)
    assert f.decide() == []  # not yet
    f.tick(10)
    actions = f.decide()
    assert said(actions) == ["stop m-1", "m waits"]
    assert actions[0].failed_to_start and actions[0].reason.startswith(
        "not ready within 60s (start_timeout_s) of its placement: placing on idle")
    assert "not ready by its start deadline" in actions[1].reason
    m = f.state.models["m"]
    assert m.start_failures == 1 and m.last_failure.startswith("m-1: not ready within 60s")
    assert f.state.replicas["m-1"].state == "stopping" and m.late_nodes == ["idle"]
    actions = f.decide()
    assert "backing off: 1 replica(s) in a row failed to start" in actions[0].reason  # as after any start failure
    f.tick(5)
    f.stopped("m-1")  # its agent says it stopped it: its one GPU is free again
    # Elsewhere, though best fit would pick the node with one GPU free: the
    # node where it did not start counts for the model's spread.
    assert said(f.decide()) == ["place m-2 (m/default) on good:[0]"]
    f.make_ready()
    assert f.state.models["m"].start_failures == 0 and "m-2" not in f.state.unstarted
    assert f.state.models["m"].late_nodes == []  # started: no node to avoid any more
    checked, differences = verify(f.log)
    assert checked and differences == []  # replay decides the same: the deadline is measured with `now`


def test_a_slow_start_ready_by_its_deadline_is_not_touched_and_repeated_timeouts_park_the_model():
    f = Fleet()
    policy(f, start_timeout_s=30, park_after=2)
    f.register("a", gpus=4)
    f.apply(model("m"))
    f.decide()
    f.report("m-1.0", "starting")
    f.tick(25)
    f.report("m-1.0", "ready")
    f.tick(100)
    assert f.decide() == [] and f.state.unstarted == {}
    f.report("m-1.0", "failed", reason="CUDA error")  # ready once: not a start failure
    assert said(f.decide()) == ["stop m-1", "place m-2 (m/default) on a:[0]"]
    for k in (2, 3):
        f.tick(400)
        actions = f.decide()
        assert said(actions)[0] == f"stop m-{k}" and actions[0].failed_to_start
        f.tick(400)
        actions = f.decide()
        if k == 2:
            assert said(actions) == ["place m-3 (m/default) on a:[1]"]
    assert said(actions) == ["park m", "m waits"]


# --------------------------------------------------------------------------- a property


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_a_pool_restricted_profile_is_placed_only_on_nodes_whose_pool_the_operator_set(data):
    """Worlds where agents claim pools and operators set and remove them,
    admit nodes, and policies switch between operator, open and manual:
    every placement of a profile with a pool lands on nodes whose counted
    pool is that one, and that pool is the operator's (or, under `open`,
    the node's claim); under `manual`, only on admitted nodes that claim no
    more than they were admitted with."""
    world = World(data)
    for step in world.run():
        if not isinstance(step.event, ev.Decided) or not step.fresh:
            continue
        before = step.state_before()
        for a in step.event.actions:
            if not isinstance(a, ev.PlaceReplica):
                continue
            if before.policy.admission == "manual":
                for s in a.shards:
                    adm, node = before.admitted.get(s.node), before.nodes[s.node]
                    assert adm is not None and len(node.gpus) <= adm.gpus, f"{s.node} not admitted for what it claims"
                    assert {g.model for g in node.gpus} <= set(adm.gpu_models)
            prof = profile_named(before.models[a.model].spec, a.profile)
            if not prof.pool:
                continue
            for s in a.shards:
                node = before.nodes[s.node]
                assert node.labels.get(POOL) == prof.pool and not node.cordon
                own = node.claims.get(POOL) if before.policy.admission == "open" else None
                assert prof.pool in (node.operator_labels.get(POOL), own)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_every_replica_past_its_start_deadline_is_stopped_by_the_next_pass(data):
    """Worlds whose policies set short start deadlines (fleet_strategies'
    policy step): a fresh pass stops every replica placed and not ready by
    its deadline, whatever else it decides, and nothing before it."""
    world = World(data)
    for step in world.run():
        if not isinstance(step.event, ev.Decided) or not step.fresh:
            continue
        before, now = step.state_before(), step.event.at
        stopped = {a.replica: a for a in step.event.actions if isinstance(a, ev.StopReplica)}
        timeout = before.policy.start_timeout_s
        for rid in before.unstarted:
            rep = before.replicas[rid]  # (the fold keeps none that has gone)
            late = not rep.ready_at and not rep.want_shards and rep.state not in ("ready", "stopping", "failed")
            if late and now - rep.placed_at > timeout:
                assert rid in stopped, f"{rid} placed at {rep.placed_at}, not ready at {now}: not stopped"
        for rid, a in stopped.items():
            if a.failed_to_start:
                assert now - before.replicas[rid].placed_at > timeout


def test_the_catalog_s_policy_sets_admission_and_the_start_deadline_and_ctl_shows_them(tmp_path):
    from llmgw.ctl import views
    from llmgw.ctl.catalog_file import load_catalog
    from llmgw.core.contract.policy import DEFAULT, FIELDS
    from llmgw.yamlfile import YamlFileError

    path = tmp_path / "catalog.yaml"
    path.write_text("policy:\n  admission: open\n  start_timeout_s: 90\n")
    policy = load_catalog(path).policy
    assert policy.admission == "open" and policy.start_timeout_s == 90
    assert DEFAULT.admission == "operator" and DEFAULT.start_timeout_s == 1800
    for bad in ("admission: trusting", "start_timeout_s: 0"):
        path.write_text(f"policy:\n  {bad}\n")
        try:
            load_catalog(path)
            raise AssertionError(f"{bad} accepted")
        except (YamlFileError, ValueError):
            pass
    rows = [{"field": f, "value": getattr(policy, f), "default": getattr(DEFAULT, f), "seq": 7} for f in FIELDS]
    text = views.render("policy", rows, "table", width=200)
    assert "admission" in text and "open" in text and "operator" in text and "start_timeout_s" in text
