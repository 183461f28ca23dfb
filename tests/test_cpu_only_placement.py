"""A CPU-only profile (no GPU, cores asked) runs on cores: it needs a node
that says it has them. A node that reports no cores (a simulated one, an agent
file without them) limits a GPU profile's cores by nothing, as before."""

from __future__ import annotations

from llmgw.core.contract import events as ev
from llmgw.core.scheduling.explain import explain
from llmgw.core.scheduling.fit import CPU, render_explanation

from .scenario import Fleet, model


def test_a_cpu_only_profile_needs_a_node_that_reports_cores():
    f = Fleet()
    f.register("sim", gpus=4)  # cpu_cores 0: not said
    f.register("cpu", gpus=0, cpu_cores=8)
    f.apply(model("m", min_replicas=2, profiles=[ev.ProfileSpec(name="cores", gpus=0, cpu_cores=4)]))
    placed = [a for a in f.decide() if isinstance(a, ev.PlaceReplica)]
    assert [s.node for a in placed for s in a.shards] == ["cpu", "cpu"]
    e = explain(f.state, "m")
    (pf,) = e.profiles
    said = {nf.node: nf.reasons for nf in pf.nodes}
    assert [r.rule for r in said["sim"]] == [CPU] and said["sim"][0].have == "none reported"
    assert any("sim: " in line and "none reported" in line for line in render_explanation(e))


def test_a_gpu_profiles_cores_are_not_limited_on_a_node_that_reports_none():
    f = Fleet()
    f.register("sim", gpus=4)
    f.apply(model("g", min_replicas=1, profiles=[ev.ProfileSpec(name="gpu", gpus=1, cpu_cores=4)]))
    assert [a for a in f.decide() if isinstance(a, ev.PlaceReplica)]


def test_the_fold_refuses_a_cpu_only_profile_on_a_node_that_reports_no_cores():
    """The fold checks a placement with placement's own checks (fit.py):
    a decision that puts a CPU-only profile on a node without cores (a
    stale leader's, a rogue one) is voided, as placement would never have
    made it. It runs on cores; a node that says none (a simulated one, an
    agent file without them) has none to give it, and an engine started
    there competes with whatever else runs for cores nobody counted. The
    fold once accepted it while placement refused it: two answers to one
    question."""
    f = Fleet()
    f.register("sim", gpus=4)  # cpu_cores 0: not said
    f.apply(model("m", min_replicas=1, profiles=[ev.ProfileSpec(name="cores", gpus=0, cpu_cores=4)]))
    fingerprint = f.state.models["m"].fingerprints["cores"]
    rogue = ev.PlaceReplica(replica="m-1", model="m", profile="cores", fingerprint=fingerprint, reason="rogue",
                            shards=[ev.ShardPlacement(shard="m-1.0", node="sim", rank=0, gpus=[], port=20000)])
    f.publish(ev.Decided(at=f.tick(), basis=f.state.seq, actions=[rogue], leader="rogue"))
    assert "m-1" not in f.state.replicas
    assert f.state.voided[-1].reason == "CPU on sim: profile cores runs on cores, and the node reports none"
    # A GPU profile asking cores is not limited there, by the fold as by placement.
    f.apply(model("g", min_replicas=1, profiles=[ev.ProfileSpec(name="gpu", gpus=1, cpu_cores=4)]))
    placed = [a for a in f.decide() if isinstance(a, ev.PlaceReplica) and a.model == "g"]
    f.publish(ev.Decided(at=f.tick(), basis=f.state.seq, actions=placed, leader="test"))
    assert "g-1" in f.state.replicas
