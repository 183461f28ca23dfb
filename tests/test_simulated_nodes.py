"""A simulated node takes no profile of a real engine unless the catalog lets
it (issue 34): the tour's mixed fleet restarted a llama.cpp embedding model
onto `gpu-1`, a simulated node, and its /v1/embeddings answered one vector of
length 2 for two inputs. The rule holds in the search (placement.py), in the
explanation (explain.py, the waiting reason) and in the fold's check of a
decision (decisions.py), which must agree."""

from __future__ import annotations

from llmgw.core.contract import events as ev
from llmgw.core.scheduling.explain import explain
from llmgw.core.scheduling.fit import SIMULATED, runs_real_engine
from llmgw.core.folding.nodeindex import index_of
from llmgw.core.scheduling.fit import render_explanation

from .scenario import Fleet, model

LLAMA = ev.ProfileSpec(name="cpu", engine="llama.cpp", gpus=0)
SIM = ev.ProfileSpec(name="cpu", engine="sim", gpus=0)
SIMULATE = ev.ProfileSpec(name="cpu", engine="llama.cpp", gpus=0, simulate=True)


def placed_on(f: Fleet, name: str) -> list[str]:
    return sorted(s.node for r in f.state.replicas.values() if r.model == name for s in r.shards)


def test_which_profiles_run_a_real_engine():
    assert runs_real_engine(LLAMA) and runs_real_engine(ev.ProfileSpec(name="p", engine="vllm"))
    assert not runs_real_engine(SIM) and not runs_real_engine(SIMULATE)


def test_a_real_engines_profile_goes_on_no_simulated_node_and_its_model_says_why():
    f = Fleet()
    f.register("gpu-1", gpus=8, simulated=True)
    f.apply(model("embed", profiles=[LLAMA]))
    actions = f.decide()
    assert not any(isinstance(a, ev.PlaceReplica) for a in actions)
    m = f.state.models["embed"]
    assert m.waiting_kind == "no_room"
    assert "1x engine: needs a node that runs llama.cpp, has a simulated one" in m.waiting
    e = explain(f.state, "embed")
    assert not e.chosen and e.profiles[0].nodes[0].reasons[0].rule == SIMULATED
    assert any("engine: needs a node that runs llama.cpp" in line for line in render_explanation(e))


def test_the_catalog_may_let_it_run_simulated_and_the_sim_engine_runs_anywhere():
    f = Fleet()
    f.register("gpu-1", gpus=8, simulated=True)
    f.apply(model("embed", profiles=[SIMULATE]))
    f.apply(model("chat", profiles=[ev.ProfileSpec(name="one", gpus=1)]))  # engine "sim", the default
    f.decide()
    assert placed_on(f, "embed") == ["gpu-1"] and placed_on(f, "chat") == ["gpu-1"]


def test_in_a_mixed_fleet_a_real_engine_goes_to_the_real_node_even_restarted():
    f = Fleet()
    f.register("vm", gpus=0, cpu_cores=2, memory_gb=23.5)
    f.register("gpu-1", gpus=8, simulated=True)  # more room, and first in best fit: still not there
    f.apply(model("embed", min_replicas=1, profiles=[ev.ProfileSpec(name="cpu", engine="llama.cpp", gpus=0, cpu_cores=1)]))
    f.decide()
    assert placed_on(f, "embed") == ["vm"]
    f.make_ready()
    # Restarted (the tour's `ctl restart`): its replacement goes beside it on the real node, never to gpu-1.
    f.restart("embed-1")
    for _ in range(4):
        f.decide()
        f.make_ready()
    assert set(placed_on(f, "embed")) == {"vm"}
    # The real node full: the model waits, it does not spill onto the simulated one.
    f.apply(model("embed", min_replicas=3, profiles=[ev.ProfileSpec(name="cpu", engine="llama.cpp", gpus=0, cpu_cores=1)]))
    for _ in range(3):
        f.decide()
    assert set(placed_on(f, "embed")) == {"vm"}
    assert f.state.models["embed"].waiting_kind == "no_room"


def test_a_multi_node_profile_of_a_real_engine_takes_no_simulated_fabric():
    f = Fleet()
    for n in ("a", "b"):
        f.register(n, gpus=8, simulated=True, labels={"llmgw.io/fabric": "ib-0"})
    real = ev.ProfileSpec(name="tp", engine="vllm", gpus=8, nodes=2)
    f.apply(model("big", profiles=[real]))
    f.decide()
    assert placed_on(f, "big") == []
    f.apply(model("big", profiles=[ev.ProfileSpec(name="tp", engine="vllm", gpus=8, nodes=2, simulate=True)]))
    f.decide()
    assert placed_on(f, "big") == ["a", "b"]


def test_the_fold_voids_a_placement_of_a_real_engine_on_a_simulated_node():
    f = Fleet()
    f.register("gpu-1", gpus=8, simulated=True)
    f.apply(model("embed", profiles=[LLAMA]))
    fp = f.state.models["embed"].fingerprints["cpu"]
    rogue = ev.PlaceReplica(
        replica="embed-1", model="embed", profile="cpu", fingerprint=fp, reason="rogue",
        shards=[ev.ShardPlacement(shard="embed-1.0", node="gpu-1", rank=0, gpus=[], port=20000)],
    )  # fmt: skip
    f.publish(ev.Decided(at=f.tick(), basis=f.state.seq, actions=[rogue]))
    assert "embed-1" not in f.state.replicas
    assert f.state.voided[-1].reason == "node gpu-1 is simulated: profile cpu runs llama.cpp (simulate: true lets it)"


def test_a_node_registered_again_as_real_is_filed_again():
    f = Fleet()
    f.register("n", gpus=1, simulated=True)
    f.apply(model("embed", profiles=[ev.ProfileSpec(name="one", engine="llama.cpp", gpus=1)]))
    f.decide()
    assert placed_on(f, "embed") == []
    f.register("n", gpus=1)  # the same name, now a real agent
    assert index_of(f.state).check(f.state) == []
    f.decide()
    assert placed_on(f, "embed") == ["n"]
