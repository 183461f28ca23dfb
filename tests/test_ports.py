"""Engine ports another program holds on a node (issue 11, part 3): events in,
decisions out. The agent says which ports of its range other programs hold;
they are skipped, used again once free, and a model whose shards met them is
never parked for it."""

from __future__ import annotations

from llmgw.core.contract import events as ev
from llmgw.core.rules.decide import decide
from llmgw.core.folding.decisions import describe_action
from llmgw.core.simulation.history import verify
from llmgw.core.scheduling.explain import explain
from llmgw.core.contract.limits import LIMITS
from llmgw.core.scheduling.fit import render_explanation
from llmgw.core.rules.scaling import PARK_AFTER

from .scenario import Fleet, model

PORT_BASE = LIMITS.engine_port_first  # the default range's first port
TAKEN = f"port {PORT_BASE} on 127.0.0.1 is taken by another process"


def cpu_model(name: str = "m", **kw) -> ev.ModelSpec:
    return model(name, profiles=[ev.ProfileSpec(name="cpu", gpus=0, cpu_cores=1)], **kw)


def register(f: Fleet, node: str = "a", *, taken: list[int] = (), first: int = 0, last: int = 0, cores: int = 8):
    f.publish(
        ev.NodeRegistered(
            at=f.tick(), node=node, cpu_cores=cores, port_first=first, port_last=last, ports_taken=list(taken)
        )
    )


def ports_taken(f: Fleet, node: str, *ports: int) -> None:
    f.publish(ev.NodePorts(at=f.tick(), node=node, taken=list(ports)))


def places(actions) -> list[tuple[str, str, int]]:
    return [(a.replica, s.node, s.port) for a in actions if isinstance(a, ev.PlaceReplica) for s in a.shards]


def said(actions) -> list[str]:
    return [describe_action(a) for a in actions]


def refuse_taken(f: Fleet, shard: str) -> None:
    """What the agent does with a start on a port another program holds:
    the port in a NodePorts, then the shard's failure."""
    sh = next(s for s in f.state.replicas[shard.rpartition(".")[0]].shards if s.id == shard)
    node = f.state.nodes[sh.node]
    ports_taken(f, sh.node, *sorted({*node.taken, sh.port}))
    f.report(shard, "failed", reason=f"port {sh.port} on 127.0.0.1 is taken by another process")


def test_a_port_another_program_holds_is_skipped_used_again_once_free_and_the_model_never_parks():
    f = Fleet()
    register(f)
    f.apply(cpu_model())
    assert places(f.decide()) == [("m-1", "a", PORT_BASE)]  # nothing said yet of 20000
    # Something listens on it: the agent says so, then fails the shard.
    refuse_taken(f, "m-1.0")
    m = f.state.models["m"]
    assert f.state.nodes["a"].taken == [PORT_BASE] and PORT_BASE not in f.state.nodes["a"].ports
    assert m.start_failures == 0 and not m.parked  # the node's fact, not the model's: no back-off either
    actions = f.decide()
    assert said(actions) == ["stop m-1", "place m-2 (m/cpu) on a:[]"]
    assert places(actions) == [("m-2", "a", PORT_BASE + 1)]
    # More of the range taken, one after the other, far past the parking count.
    for i in range(2, PARK_AFTER + 4):
        refuse_taken(f, f"m-{i}.0")
        actions = f.decide()
        assert places(actions) == [(f"m-{i + 1}", "a", PORT_BASE + i)], said(actions)
        assert not any(isinstance(a, ev.ParkModel) for a in actions)
    assert f.state.models["m"].start_failures == 0 and not f.state.models["m"].parked
    f.make_ready()
    assert f.ready("m") == [f"m-{PARK_AFTER + 4}"]
    # The other programs exit; the agent says the ports are free: used again.
    ports_taken(f, "a")
    assert f.state.nodes["a"].taken == []
    f.publish(ev.ModelApplied(at=f.tick(), model=cpu_model(min_replicas=2)))
    assert places(f.decide()) == [(f"m-{PARK_AFTER + 5}", "a", PORT_BASE)]
    assert verify(f.log)[1] == []  # every pass decided again the same from the log


def test_ports_said_taken_at_registration_are_never_handed_out():
    f = Fleet()
    register(f, taken=[PORT_BASE, PORT_BASE + 1, PORT_BASE + 3])
    f.apply(cpu_model(min_replicas=3))
    assert [p for _, _, p in places(f.decide())] == [PORT_BASE + 2, PORT_BASE + 4, PORT_BASE + 5]
    # A registration says them all again: what it does not list is free.
    register(f, taken=[PORT_BASE + 1], cores=8)
    assert f.state.nodes["a"].taken == [PORT_BASE + 1]


def test_a_decision_naming_a_port_said_taken_since_is_voided():
    f = Fleet()
    register(f)
    f.apply(cpu_model())
    actions = decide(f.state, f.tick())  # taken on the state before the agent spoke
    ports_taken(f, "a", PORT_BASE)
    f.publish(ev.Decided(at=f.tick(), basis=f.state.seq, actions=actions))
    assert "m-1" not in f.state.replicas
    assert f.state.voided[-1].reason == f"port {PORT_BASE} on a is held by another program"
    assert places(f.decide()) == [("m-1", "a", PORT_BASE + 1)]


def test_the_agent_sets_the_port_range_and_a_full_range_is_explained():
    f = Fleet()
    register(f, first=31000, last=31002, taken=[31001, 40000])  # 40000: not in its range, not kept
    assert f.state.nodes["a"].taken == [31001]
    f.apply(cpu_model(min_replicas=3))
    actions = f.decide()
    assert [p for _, _, p in places(actions)] == [31000, 31002]
    assert said(actions)[-1] == "m waits"
    waiting = f.state.models["m"].waiting
    assert "ports: needs a free one in 31000-31002, has none (1 held by other programs)" in waiting, waiting
    assert any("ports: needs a free one in 31000-31002" in line for line in render_explanation(explain(f.state, "m")))


def test_a_registration_with_a_range_that_is_not_one_is_quarantined():
    f = Fleet()
    register(f, first=30000, last=29999)
    assert "a" not in f.state.nodes
    assert f.state.quarantined[-1].error == (
        "node a: port range 30000-29999: first and last must be ports (1-65535), first not after last"
    )


def test_other_start_failures_still_count_and_park():
    # Only a port another program holds is the node's fact: an engine that
    # does not start for any other reason is the model's.
    f = Fleet()
    register(f)
    f.apply(cpu_model())
    f.decide()
    f.report("m-1.0", "failed", reason="no such file: /models/x.gguf")
    assert f.state.models["m"].start_failures == 1


def test_ports_of_a_node_never_registered_are_nothing_to_keep():
    f = Fleet()
    ports_taken(f, "ghost", PORT_BASE)
    assert "ghost" not in f.state.nodes and f.state.quarantine_count == 0
