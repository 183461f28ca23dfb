"""The Map view's data and a node's "Running now" (llmgw/console/fleetmap.py),
and what an action's banner says followed it (llmgw/console/followup.py):
from folded logs, without a browser or a bus."""

from __future__ import annotations

from llmgw.console import fleetmap, followup
from llmgw.core.contract import events as ev
from llmgw.core.rules.decide import decide
from llmgw.core.folding.fold import apply
from llmgw.core.folding.state import State


def log_of(*events: ev.Event) -> list[tuple[int, str, bytes]]:
    return [(i, ev.subject_for(e), ev.encode(e)) for i, e in enumerate(events, 1)]


def folded(records) -> State:
    state = State()
    for r in records:
        apply(state, *r)
    return state


def gpu_node(name: str, rack: str, gpus: int = 2) -> ev.NodeRegistered:
    return ev.NodeRegistered(
        at=1.0, node=name, gpus=[ev.Gpu(index=i, model="H100", memory_gb=80) for i in range(gpus)], cpu_cores=16,
        memory_gb=64, labels={"llmgw.io/site": "par1", "llmgw.io/rack": rack},
    )


VM = ev.NodeRegistered(at=1.0, node="vm", gpus=[], cpu_cores=8, memory_gb=32)  # CPU-only, no location
CHAT = ev.ModelSpec(name="chat", profiles=[ev.ProfileSpec(name="one", gpus=1)])
TINY = ev.ModelSpec(name="tiny", profiles=[ev.ProfileSpec(name="cpu", gpus=0, cpu_cores=2, memory_gb=4)])


def placed(model: str, replica: str, node: str, gpus: list[int], port: int, profile: str = "one") -> ev.PlaceReplica:
    return ev.PlaceReplica(model=model, replica=replica, profile=profile, fingerprint="f", reason="wanted",
                           shards=[ev.ShardPlacement(shard=f"{replica}.0", node=node, rank=0, gpus=gpus, port=port)])


def fleet_log():
    """Two GPU nodes and a CPU-only one; chat (1 GPU) and tiny (CPU only) placed by the core's own
    decide, tiny ready on the port its engine said; rack r2 held."""
    records = log_of(gpu_node("n1", "r1"), gpu_node("n2", "r2"), VM,
                     ev.ModelApplied(at=2.0, model=CHAT), ev.ModelApplied(at=2.0, model=TINY))
    state = folded(records)
    actions = decide(state, 3.0)
    assert sorted(a.replica for a in actions) == ["chat-1", "tiny-1"]
    more = [ev.Decided(at=3.0, basis=state.seq, actions=actions),
            ev.ShardStatus(at=4.0, node="vm", replica="tiny-1", shard="tiny-1.0", generation=len(records) + 1,
                           state="ready", endpoint="http://127.0.0.1:41234"),
            ev.DomainHeld(at=5.0, domain="rack/r2", drain=True, reason="maintenance")]
    return records + [(len(records) + i, ev.subject_for(e), ev.encode(e)) for i, e in enumerate(more, 1)]


def test_the_map_has_every_node_gpu_and_cpu_only_with_the_models_on_them():
    m = fleetmap.fleet_map(folded(fleet_log()))
    assert m["models"] == ["chat", "tiny"] and m["kinds"] == ["site", "room", "row", "rack", "pdu"]
    rows = {r[0]: r for r in m["nodes"]}
    assert list(rows) == ["n1", "n2", "vm"]
    chat_on = next(n for n in ("n1", "n2") if 0 in rows[n][3])
    name, place, state, gpus, cpu_used, cpu_cores, mem_used, mem_gb, cpu_models = rows[chat_on]
    assert m["places"][place] == ["par1", "", "", "r1" if chat_on == "n1" else "r2", ""] and m["states"][state] == "ready"
    assert sorted(gpus) == [-1, 0] and cpu_models == [] and cpu_cores == 16 and mem_gb == 64
    # The CPU-only node: no GPU, tiny's cores and memory, tiny among its models, no location.
    name, place, state, gpus, cpu_used, cpu_cores, mem_used, mem_gb, cpu_models = rows["vm"]
    assert gpus == [] and cpu_used == 2 and cpu_cores == 8 and mem_used == 4 and cpu_models == [1]
    assert m["places"][place] == ["", "", "", "", ""]
    assert rows[{"n1": "n2", "n2": "n1"}[chat_on]][3] == [-1, -1]
    assert m["held"] == {"rack/r2": [True, "maintenance"]}


def test_a_nodes_running_now_lists_its_replicas_on_gpus_and_on_cpus():
    state = folded(fleet_log())
    [tiny] = fleetmap.running_on(state, "vm")
    assert tiny["replica"] == "tiny-1" and tiny["model"] == "tiny" and tiny["state"] == "ready"
    assert tiny["gpus"] == [] and tiny["cpu_cores"] == 2 and tiny["memory_gb"] == 4
    assert tiny["port"] == 41234  # where its engine said it listens (its endpoint), not only the port placed
    chat_on = state.replicas["chat-1"].shards[0].node
    [chat] = fleetmap.running_on(state, chat_on)
    assert len(chat["gpus"]) == 1 and chat["port"] == state.replicas["chat-1"].shards[0].port and chat["state"] == "placing"
    assert fleetmap.running_on(state, {"n1": "n2", "n2": "n1"}[chat_on]) == []


def test_a_label_change_needs_no_decision_and_the_banner_says_so_at_once():
    records = fleet_log()
    # chat ready too: everything wanted runs, and nothing is left to decide after a label.
    chat = folded(records).replicas["chat-1"].shards[0]
    for e in (ev.ShardStatus(at=6.0, node=chat.node, replica="chat-1", shard=chat.id, generation=chat.generation,
                             state="ready", endpoint="http://127.0.0.1:41235"),
              ev.NodeLabeled(at=10.0, node="n2", set={"rack": "r9"}, remove=[])):
        records.append((len(records) + 1, ev.subject_for(e), ev.encode(e)))
    state = folded(records)
    seq = len(records)
    got = followup.followed(records, state, seq, 10.0, 10.5, settle_s=10.0)
    assert got.status == followup.NOTHING and "no decision needs to follow" in got.said
    # Not folded yet: pending.
    assert followup.followed(records[:-1], folded(records[:-1]), seq, 10.0, 10.5, 10.0).status == followup.PENDING


def test_an_action_a_decision_is_due_after_waits_for_it_then_says_it_or_that_none_came():
    records = log_of(gpu_node("n1", "r1"), ev.ModelApplied(at=2.0, model=CHAT))  # chat wants a replica
    state = folded(records)
    got = followup.followed(records, state, 2, 2.0, 3.0, settle_s=10.0)
    assert got.status == followup.PENDING  # a placement is due
    late = followup.followed(records, state, 2, 2.0, 20.0, settle_s=10.0)
    assert late.status == followup.LATE and "within 10 s" in late.said and late.actions[0].startswith("place chat-1")
    # A decision taken before the event (its basis) did not follow it; one on a basis that has it did.
    before = ev.Decided(at=2.5, basis=1, actions=[ev.ModelWaiting(model="chat", reason="no room")])
    after = ev.Decided(at=3.0, basis=2, actions=[placed("chat", "chat-1", "n1", [0], 20000)])
    records += [(3, ev.subject_for(before), ev.encode(before)), (4, ev.subject_for(after), ev.encode(after))]
    got = followup.followed(records, folded(records), 2, 2.0, 3.5, settle_s=10.0)
    assert got.status == followup.FOLLOWED and got.seq == 4 and got.actions[0].startswith("place chat-1 (chat/one) on n1")
