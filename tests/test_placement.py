"""Scenario tests of placement: one rule each, named after the rule.

Events in, decisions and explanations out, through the real fold: a
placement is only ever what `decide` said and the fold kept."""

import msgspec

from llmgw.core.contract import events as ev
from llmgw.core.rules.decide import decide
from llmgw.core.folding.fold import copy_state
from llmgw.core.scheduling.explain import explain
from llmgw.core.scheduling.fit import CPU, FABRIC, GPU_MEMORY, GPU_MODEL, GPUS, MEMORY, POOL, PORTS, READY, Reason, gpu_model_matches, render, render_explanation
from llmgw.core.contract.limits import LIMITS

from .scenario import Fleet, model

FABRIC_LABEL = "llmgw.io/fabric"
POOL_LABEL = "llmgw.io/pool"
PORT_BASE = LIMITS.engine_port_first  # the default range's first port


def profile(name: str = "p", **kw) -> ev.ProfileSpec:
    return ev.ProfileSpec(name=name, **kw)


def placed(actions) -> list[ev.PlaceReplica]:
    return [a for a in actions if isinstance(a, ev.PlaceReplica)]


def where(actions) -> list[tuple[str, ...]]:
    """Each placement as the nodes of its shards, by rank."""
    return [tuple(s.node for s in a.shards) for a in placed(actions)]


def reasons_of(f: Fleet, model_name: str, profile_name: str) -> dict[str, list[str]]:
    """Node -> the rules it breaks for one profile, from explain."""
    e = explain(f.state, model_name)
    (pf,) = [p for p in e.profiles if p.profile == profile_name]
    return {nf.node: [r.rule for r in nf.reasons] for nf in pf.nodes}


# --------------------------------------------------------------------------- GPUs


def test_gpu_model_is_matched_by_whole_words_of_the_name_the_agent_reports():
    assert gpu_model_matches("H100", "NVIDIA H100 80GB HBM3")
    assert gpu_model_matches("h100 nvl", "NVIDIA H100 NVL")
    assert not gpu_model_matches("H100", "NVIDIA GH100")
    assert not gpu_model_matches("H100 NVL", "NVIDIA H100 80GB HBM3")
    assert gpu_model_matches("", "anything")
    f = Fleet()
    f.register("a100", gpus=8, gpu_model="NVIDIA A100-SXM4-80GB")
    f.register("h100", gpus=8, gpu_model="NVIDIA H100 80GB HBM3")
    f.apply(model("m", min_replicas=2, profiles=[profile(gpus=2, gpu_model="H100")]))
    assert where(f.decide()) == [("h100",), ("h100",)]
    assert reasons_of(f, "m", "p")["a100"] == [GPU_MODEL]


def test_gpu_memory_each_gpu_must_have_rules_out_smaller_gpus():
    f = Fleet()
    f.register("small", gpus=8, mem=40)
    f.register("big", gpus=8, mem=80)
    f.apply(model("m", profiles=[profile(gpus=1, gpu_memory_gb=80)]))
    assert where(f.decide()) == [("big",)]
    (r,) = explain(f.state, "m").profiles[0].nodes[1].reasons  # "small"
    assert r == Reason(rule=GPU_MEMORY, need="1 with 80 GB each", have="40 GB at most")


def test_gpu_memory_on_a_node_with_mixed_gpus_takes_only_those_that_suit():
    f = Fleet()
    gpus = [ev.Gpu(index=0, memory_gb=24), ev.Gpu(index=1, memory_gb=80), ev.Gpu(index=2, memory_gb=24),
            ev.Gpu(index=3, memory_gb=80)]
    f.publish(ev.NodeRegistered(at=f.tick(), node="mixed", gpus=gpus))
    f.apply(model("m", profiles=[profile(gpus=2, gpu_memory_gb=80)]))
    (place,) = placed(f.decide())
    assert place.shards[0].gpus == [1, 3]
    f.apply(model("n", profiles=[profile(gpus=1, gpu_memory_gb=80)]))
    (wait,) = f.decide()
    assert isinstance(wait, ev.ModelWaiting)
    assert "GPUs: needs 1 free, has 0 free" in wait.reason


def test_gpus_a_node_has_free_must_be_enough_for_one_shard():
    f = Fleet()
    f.register("a", gpus=4)
    f.apply(model("m", profiles=[profile(gpus=3)]))
    f.decide()
    f.apply(model("n", profiles=[profile(gpus=2)]))
    (wait,) = f.decide()
    assert "GPUs: needs 2 free, has 1 free (first: a)" in wait.reason
    f.apply(model("big", profiles=[profile(gpus=8)]))
    assert reasons_of(f, "big", "p") == {"a": [GPUS]}
    assert render(explain(f.state, "big").profiles[0].nodes[0].reasons[0]) == "GPUs: needs 8, has 4 in all"


def test_best_fit_keeps_whole_nodes_free_for_big_profiles():
    # First fit in name order would put the small replicas on "a" and "b"
    # alike; best fit fills the node already in use and keeps one whole.
    f = Fleet()
    f.register("a", gpus=8)
    f.register("b", gpus=8)
    f.apply(model("half", profiles=[profile(gpus=4)]))
    f.decide()
    f.apply(model("small", min_replicas=1, profiles=[profile(gpus=2)]))
    assert where(f.decide()) == [("a",)]
    f.apply(model("whole", profiles=[profile(gpus=8)]))
    assert where(f.decide()) == [("b",)]


# --------------------------------------------------------------------------- host memory and CPU


def test_host_memory_is_held_per_shard_and_freed_when_it_exits():
    f = Fleet()
    f.register("a", gpus=8, memory_gb=100)
    f.apply(model("m", min_replicas=3, profiles=[profile(gpus=1, memory_gb=40)]))
    actions = f.decide()
    assert len(placed(actions)) == 2  # a third would need 120 GB of 100
    assert f.state.nodes["a"].memory_used == 80
    assert "host memory: needs 40 GB, has 20 GB free of 100" in actions[-1].reason
    f.make_ready()
    f.report("m-1.0", "failed", reason="OOM")
    assert f.state.nodes["a"].memory_used == 40
    stop, place = f.decide()
    assert place.replica == "m-3"
    assert f.state.nodes["a"].memory_used == 80


def test_host_memory_overcommitted_by_a_stale_decision_is_voided():
    f = Fleet()
    f.register("a", gpus=8, memory_gb=100)
    f.apply(model("n", profiles=[profile(gpus=1, memory_gb=60)]))
    stale = copy_state(f.state)  # what a deposed leader decides on: 100 GB free
    f.apply(model("m", profiles=[profile(gpus=1, memory_gb=60)]))
    f.decide()  # m-1 takes 60 GB; n waits
    late = decide(stale, f.tick())
    assert where(late) == [("a",)]
    f.publish(ev.Decided(at=f.now, basis=stale.seq, actions=late))
    assert "n-1" not in f.state.replicas
    assert f.state.voided[-1].reason == "host memory on a: 60 GB more would make 120 of 100 GB"
    assert f.state.nodes["a"].memory_used == 60


def test_cpu_cores_are_held_per_shard_and_an_overcommit_is_voided():
    f = Fleet()
    f.register("a", gpus=8, cpu_cores=16)
    f.apply(model("m", min_replicas=3, profiles=[profile(gpus=1, cpu_cores=6)]))
    actions = f.decide()
    assert len(placed(actions)) == 2 and f.state.nodes["a"].cpu_used == 12
    assert "CPU: needs 6 cores, has 4 free of 16" in actions[-1].reason
    forged = ev.PlaceReplica(
        replica="m-3", model="m", profile="p", fingerprint=f.state.models["m"].fingerprints["p"],
        shards=[ev.ShardPlacement(shard="m-3.0", node="a", rank=0, gpus=[5], port=20099)], reason="forged",
    )
    f.publish(ev.Decided(at=f.tick(), basis=f.state.seq, actions=[forged]))
    assert f.state.voided[-1].reason == "CPU on a: 6 cores more would make 18 of 16"
    f.report("m-1.0", "stopped")
    assert f.state.nodes["a"].cpu_used == 6


def test_a_node_that_does_not_say_its_memory_or_cores_is_not_limited_by_them():
    f = Fleet()
    f.register("a", gpus=8)  # memory_gb=0, cpu_cores=0: not said
    f.apply(model("m", min_replicas=4, profiles=[profile(gpus=1, memory_gb=512, cpu_cores=64)]))
    assert len(placed(f.decide())) == 4
    assert (f.state.nodes["a"].memory_used, f.state.nodes["a"].cpu_used) == (2048, 256)


def test_host_memory_and_cores_held_are_held_again_when_an_agent_reregisters():
    f = Fleet()
    f.register("a", gpus=8, memory_gb=100, cpu_cores=16)
    f.apply(model("m", min_replicas=2, profiles=[profile(gpus=1, memory_gb=30, cpu_cores=4)]))
    f.decide()
    f.make_ready()
    running = [r for r in f.running_on("a") if r.replica == "m-1"]
    f.register("a", gpus=8, memory_gb=100, cpu_cores=16, running=running)
    node = f.state.nodes["a"]
    assert (node.memory_used, node.cpu_used) == (30, 4)  # m-2 was not reported: failed, holds nothing
    f.lose("a")
    assert (f.state.nodes["a"].memory_used, f.state.nodes["a"].cpu_used) == (0, 0)


# --------------------------------------------------------------------------- labels


def test_pool_a_profile_asks_for_takes_only_nodes_with_that_label():
    f = Fleet()
    f.register("a", gpus=8)
    f.register("b", gpus=8, labels={POOL_LABEL: "batch"})
    f.register("c", gpus=8, labels={POOL_LABEL: "serve"})
    f.admit("b", pool="batch")  # the pool counts as an operator set it (admission.py)
    f.admit("c", pool="serve")
    f.apply(model("m", min_replicas=2, profiles=[profile(gpus=1, pool="serve")]))
    assert where(f.decide()) == [("c",), ("c",)]
    r = reasons_of(f, "m", "p")
    assert r == {"a": [POOL], "b": [POOL], "c": []}
    assert [render(x) for x in explain(f.state, "m").profiles[0].nodes[0].reasons] == [
        "pool: needs serve, has no llmgw.io/pool label"
    ]
    f.apply(model("any", profiles=[profile(gpus=8)]))  # no pool asked: any node
    assert where(f.decide()) == [("a",)]


def test_fabric_keeps_the_shards_of_a_multi_node_replica_on_one_fabric():
    f = Fleet()
    f.register("a", gpus=8, labels={FABRIC_LABEL: "ib-1"})
    f.register("b", gpus=8, labels={FABRIC_LABEL: "ib-2"})
    f.register("c", gpus=8, labels={FABRIC_LABEL: "ib-2"})
    f.apply(model("big", profiles=[profile(gpus=8, nodes=2)]))
    (place,) = placed(f.decide())
    assert [(s.node, s.rank) for s in place.shards] == [("b", 0), ("c", 1)]
    f.apply(model("more", profiles=[profile(gpus=4, nodes=2)]))
    (wait,) = f.decide()
    assert "fabric: needs 2 nodes that fit in one fabric, has 1 in ib-1" in wait.reason


def test_fabric_nodes_without_the_label_form_no_fabric_with_any_other():
    f = Fleet()
    f.register("a", gpus=8)
    f.register("b", gpus=8)
    f.apply(model("big", profiles=[profile(gpus=4, nodes=2)]))
    (wait,) = f.decide()
    assert "2x fabric: needs a llmgw.io/fabric label (2 nodes per replica), has none" in wait.reason
    assert reasons_of(f, "big", "p") == {"a": [FABRIC], "b": [FABRIC]}
    f.apply(model("single", profiles=[profile(gpus=4)]))  # a single-node profile needs no fabric
    assert where(f.decide()) == [("a",)]


# --------------------------------------------------------------------------- spread


def test_spread_puts_the_replicas_of_a_model_on_distinct_nodes_where_they_can():
    f = Fleet()
    for n in "abc":
        f.register(n, gpus=8)
    f.apply(model("m", min_replicas=3))
    assert where(f.decide()) == [("a",), ("b",), ("c",)]  # not best fit: spread comes first
    f.apply(model("m", min_replicas=5))
    assert where(f.decide()) == [("a",), ("b",)]  # none left without one: those with fewest, best fit among them
    f.apply(model("m", min_replicas=7))
    assert where(f.decide()) == [("c",), ("a",)]
    nf = explain(f.state, "m").profiles[0].nodes[0]
    assert nf.fits and nf.runs == 3  # m-1, m-4, m-7


def test_spread_of_multi_node_replicas_prefers_nodes_without_the_model():
    f = Fleet()
    for n in "abcd":
        f.register(n, gpus=8, labels={FABRIC_LABEL: "ib"})
    f.apply(model("m", min_replicas=2, profiles=[profile(gpus=2, nodes=2)]))
    assert where(f.decide()) == [("a", "b"), ("c", "d")]


# --------------------------------------------------------------------------- ports


def test_ports_are_allocated_per_node_lowest_first():
    f = Fleet()
    f.register("a", gpus=8, labels={FABRIC_LABEL: "ib"})
    f.register("b", gpus=8, labels={FABRIC_LABEL: "ib"})
    f.apply(model("m", min_replicas=2, profiles=[profile(gpus=1)]))
    f.apply(model("pp", profiles=[profile(gpus=1, nodes=2)]))
    actions = f.decide()
    ports = [(s.node, s.port) for a in placed(actions) for s in a.shards]
    assert ports == [("a", 20000), ("b", 20000), ("a", 20001), ("b", 20001)]


def test_ports_are_never_reused_while_a_shard_or_a_stray_holds_them():
    f = Fleet()
    stray = ev.RunningShard(shard="old-1.0", replica="old-1", model="old", profile="p", generation=3, gpus=[7],
                            port=PORT_BASE)
    f.register("a", gpus=8, running=[stray])
    f.apply(model("m", min_replicas=2))
    actions = f.decide()
    assert [s.port for a in placed(actions) for s in a.shards] == [PORT_BASE + 1, PORT_BASE + 2]
    f.make_ready()
    # m-1 stopping: its port stays taken until it has exited; the stray's until it has.
    f.apply(model("m", min_replicas=1, max_replicas=1))
    (stop,) = f.decide()
    assert stop.replica == "m-2" and f.state.replicas["m-2"].state == "stopping"
    f.apply(model("n"))
    (place,) = placed(f.decide())
    assert place.shards[0].port == PORT_BASE + 3
    f.report("m-2.0", "stopped")
    f.apply(model("o"))
    (place,) = placed(f.decide())
    assert place.shards[0].port == PORT_BASE + 2  # free again once its holder exited


def test_ports_all_taken_refuse_the_node():
    f = Fleet()
    taken = [ev.RunningShard(shard=f"s-{p}.0", replica=f"s-{p}", model="s", profile="p", generation=1, port=p)
             for p in range(PORT_BASE, 30000)]
    f.register("a", gpus=8, running=taken)
    f.apply(model("m"))
    assert reasons_of(f, "m", "default") == {"a": [PORTS]}


# --------------------------------------------------------------------------- profiles


def test_the_first_profile_that_fits_wins():
    f = Fleet()
    f.register("a", gpus=8, gpu_model="NVIDIA A100-SXM4-80GB")
    f.apply(model("m", min_replicas=2, profiles=[profile("h100", gpus=1, gpu_model="H100"), profile("a100", gpus=2),
                                                profile("any", gpus=1)]))
    assert [a.profile for a in placed(f.decide())] == ["a100", "a100"]
    e = explain(f.state, "m")
    assert (e.chosen, e.where) == ("a100", ("a",))
    assert [p.fits for p in e.profiles] == [False, True, True]


# --------------------------------------------------------------------------- explain


def test_explain_gives_each_node_its_reasons_for_each_profile():
    f = Fleet()
    f.register("a", gpus=2, gpu_model="L4", memory_gb=64, cpu_cores=8, labels={POOL_LABEL: "batch"})
    f.admit("a", pool="batch")
    f.register("b", gpus=8, mem=40)
    f.register("c", gpus=8)
    f.lose("c")
    f.apply(model("m", profiles=[
        profile("tp4", gpus=4, gpu_model="H100", memory_gb=128, cpu_cores=16, pool="serve"),
        profile("tp2", gpus=2, gpu_memory_gb=80, nodes=2),
    ]))
    e = explain(f.state, "m")
    assert e.chosen == "" and e.where == ()
    tp4, tp2 = e.profiles
    assert {nf.node: [r.rule for r in nf.reasons] for nf in tp4.nodes} == {
        "a": [POOL, GPU_MODEL, MEMORY, CPU],
        "b": [POOL, GPU_MODEL],
        "c": [READY],
    }
    assert {nf.node: [r.rule for r in nf.reasons] for nf in tp2.nodes} == {
        "a": [FABRIC],
        "b": [FABRIC, GPU_MEMORY],
        "c": [READY],
    }
    assert [render(r) for r in tp4.nodes[0].reasons] == [
        "pool: needs serve, has batch",
        "GPU model: needs H100, has L4",
        "host memory: needs 128 GB, has 64 GB free of 64",
        "CPU: needs 16 cores, has 8 free of 8",
    ]
    assert render(tp4.nodes[2].reasons[0]) == "not ready: lost: no heartbeat"
    lines = render_explanation(e)
    assert lines[0] == "model m: no profile fits anywhere"
    assert "  a: pool: needs serve, has batch; GPU model: needs H100, has L4;" in "\n".join(lines)
    # Plain data: it travels as msgspec, for the CLI to show.
    assert msgspec.json.decode(msgspec.json.encode(e), type=type(e)) == e


def test_explain_of_a_model_not_in_the_catalog_says_so():
    e = explain(Fleet().state, "ghost")
    assert e.problem == "no model ghost in the catalog"
    assert render_explanation(e) == ["no model ghost in the catalog"]


def test_the_waiting_reason_is_a_summary_of_what_explain_says():
    f = Fleet()
    f.register("a", gpus=2, labels={POOL_LABEL: "batch"})
    f.register("b", gpus=2, labels={POOL_LABEL: "serve"})
    f.register("c", gpus=8, labels={POOL_LABEL: "batch"})
    for node, pool in (("a", "batch"), ("b", "serve"), ("c", "batch")):
        f.admit(node, pool=pool)
    f.apply(model("m", profiles=[profile(gpus=4, pool="serve")]))
    (wait,) = f.decide()
    e = explain(f.state, "m")
    assert wait.reason == (
        f"no room: profile p needs {e.profiles[0].needs}; "
        "2x pool: needs serve, has batch (first: a), 2x GPUs: needs 4, has 2 in all (first: a)"
    )


def test_no_ready_node_is_the_waiting_reason_when_there_is_none():
    f = Fleet()
    f.register("a")
    f.lose("a")
    f.apply(model("m"))
    (wait,) = f.decide()
    assert wait.reason == "no node is ready"


# --------------------------------------------------------------------------- the pass


class Unreadable(dict):
    """Replicas that fail the test when a pass reads them."""

    def values(self):
        raise AssertionError("the pass read every replica")

    def items(self):
        raise AssertionError("the pass read every replica")

    def __iter__(self):
        raise AssertionError("the pass read every replica")


def test_a_steady_pass_reads_no_replica():
    f = Fleet()
    for n in "abcd":
        f.register(n, gpus=8)
    f.apply(model("m", min_replicas=6))
    f.apply(model("n", min_replicas=2, profiles=[profile(gpus=4)]))
    f.decide()
    f.make_ready()
    state = copy_state(f.state)
    state.replicas = Unreadable(state.replicas)
    assert decide(state, f.tick()) == []
    # One failure: the tallies point at the model, and the pass reads the replicas.
    f.report("m-1.0", "failed")
    assert f.state.tallies["m"].failed == 1
    assert [type(a) for a in f.decide()] == [ev.StopReplica, ev.PlaceReplica]


def test_tallies_count_live_failed_and_unwanted_replicas_per_model():
    f = Fleet()
    f.register("a", gpus=8)
    f.apply(model("m", min_replicas=3))
    f.decide()
    f.make_ready()
    t = f.state.tallies["m"]
    assert (t.live, t.failed, t.unwanted) == (3, 0, 0)
    f.report("m-1.0", "failed")
    assert (t.live, t.failed, t.unwanted) == (3, 1, 0)
    f.apply(model("m", min_replicas=3, gpus=2))  # a changed profile: every one of them unwanted
    assert (t.live, t.failed, t.unwanted) == (3, 1, 3)
    f.remove("m")
    assert (t.live, t.failed, t.unwanted) == (3, 1, 3)
    f.decide()  # all three stopped
    assert (t.live, t.failed, t.unwanted) == (0, 0, 0)


def test_a_pass_is_bounded_by_the_size_of_its_message_and_the_next_goes_on():
    f = Fleet()
    for i in range(4):
        f.register(f"n{i}", gpus=8)
    f.apply(model("m", min_replicas=20))
    one = len(msgspec.json.encode(decide(f.state, f.tick())[0]))
    first = decide(f.state, f.tick(), budget=256 + 5 * (one + 1))
    assert len(first) == 5
    f.publish(ev.Decided(at=f.now, basis=f.state.seq, actions=first))
    assert len(f.state.replicas) == 5 and f.state.voided_count == 0
    f.decide()
    assert len(f.state.replicas) == 20
    assert decide(f.state, f.tick(), budget=1) == []  # nothing left; and one action always fits


def test_a_negative_host_memory_or_cpu_in_a_profile_is_refused():
    f = Fleet()
    f.apply(model("m", profiles=[profile(memory_gb=-1)]))
    f.apply(model("n", profiles=[profile(cpu_cores=-2)]))
    assert f.state.models == {}
    # Refused by the contract's bounds at decode now (core/contract/bounds.py), before the fold's own rule.
    assert len(f.state.quarantined) == 2 and all(">= 0" in q.error for q in f.state.quarantined)
