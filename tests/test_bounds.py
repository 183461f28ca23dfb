"""Bounds in the event contract (core/contract/bounds.py) and muted nodes
(core/folding/muting.py, control/rates.py): issue 35, findings 4 and 6.

An event outside the bounds is quarantined with the reason and the rest of
the log goes on; a muted node's messages are quarantined unread, its
replicas are replaced elsewhere, and an operator's unmute hears it again.
"""

from __future__ import annotations

import msgspec
import pytest

from llmgw.control.rates import NodeRates
from llmgw.core.contract import bounds
from llmgw.core.contract import events as ev
from llmgw.core.folding.fold import apply, decode_state, encode_state
from llmgw.core.simulation.history import verify
from llmgw.core.folding.state import State

from .scenario import Fleet, model


def _registration(**fields) -> bytes:
    raw = {"type": "node.registered", "node": "n1", "at": 1000.0, "gpus": [{"index": 0, "memory_gb": 80.0}]}
    raw.update(fields)
    return msgspec.json.encode(raw)


# --------------------------------------------------------------------------- every field bounded


def _unbounded(t: msgspec.inspect.Type, where: str, seen: set) -> list[str]:
    """The fields under `t` that have no bound: an int or float without both
    ends, a str or list or dict without a maximum length."""
    i = msgspec.inspect
    if isinstance(t, i.Metadata):  # a description of why the bound is what it is
        return _unbounded(t.type, where, seen)
    if isinstance(t, (i.IntType, i.FloatType)):
        return [] if t.ge is not None and t.le is not None else [where]
    if isinstance(t, i.StrType):
        return [] if t.max_length is not None else [where]
    if isinstance(t, (i.ListType, i.DictType)):
        out = [] if t.max_length is not None else [where]
        if isinstance(t, i.DictType):
            out += _unbounded(t.key_type, f"{where}{{key}}", seen)
            return out + _unbounded(t.value_type, f"{where}{{}}", seen)
        return out + _unbounded(t.item_type, f"{where}[]", seen)
    if isinstance(t, i.UnionType):
        return [p for member in t.types for p in _unbounded(member, where, seen)]
    if isinstance(t, i.StructType):
        if t.cls in seen:
            return []
        seen.add(t.cls)
        return [p for f in t.fields for p in _unbounded(f.type, f"{t.cls.__name__}.{f.name}", seen)]
    return []  # bool, None, a Literal: bounded by what they are


def test_every_number_string_list_and_map_of_the_contract_is_bounded():
    assert _unbounded(msgspec.inspect.type_info(ev.AnyEvent), "event", set()) == []


# --------------------------------------------------------------------------- out of bounds: quarantined


@pytest.mark.parametrize(
    "data, where",
    [
        (_registration(cpu_cores=10**30), "$.cpu_cores"),  # finding 4, as seen
        (_registration(node="n" * 10_000), "$.node"),
        (_registration(gpus=[{"index": -1}]), "$.gpus[0].index"),
        (_registration(memory_gb=-1.0), "$.memory_gb"),
        (_registration(port_first=70_000), "$.port_first"),
        (_registration(labels={"llmgw.io/rack": "r1\x1b[31m"}), "$.labels"),
        (_registration(ports_taken=list(range(bounds.MAX_SHARDS_PER_NODE + 1))), "$.ports_taken"),
        (msgspec.json.encode({"type": "node.power", "node": "n1", "at": 1.0, "watts": 1e999}), "$.watts"),  # inf
        (b'{"type":"node.power","node":"n1","at":1.0,"watts":NaN}', "malformed"),  # JSON has no NaN
        (msgspec.json.encode({"type": "node.power", "node": "n1", "at": 1.0, "watts": -5.0}), "$.watts"),
        (msgspec.json.encode({"type": "model.applied", "at": 1.0, "model": {"name": "m", "profiles": [
            {"name": "p", "gpus": -1}]}}), "$.model.profiles[0].gpus"),
        (msgspec.json.encode({"type": "node.registered", "node": "n1", "at": -1.0}), "$.at"),
    ],
    ids=["cpu_cores 10**30", "10 kB node name", "negative GPU index", "negative memory", "port 70000",
         "escape code in a label", "too many ports", "infinite watts", "NaN watts", "negative watts", "negative GPUs",
         "negative time"],
)
def test_an_event_out_of_bounds_is_quarantined_with_the_reason_and_the_log_goes_on(data, where):
    state = State()
    subject = "llmgw.agent.n1.node.registered" if b"node.registered" in data else (
        "llmgw.agent.n1.node.power" if b"node.power" in data else "llmgw.ctl.model.applied")
    apply(state, 1, subject, data)
    assert state.quarantine_count == 1 and where in state.quarantined[0].error
    assert "n1" not in state.nodes and not state.models
    apply(state, 2, "llmgw.agent.n1.node.registered", _registration(cpu_cores=64, memory_gb=2048.0))
    assert state.quarantine_count == 1 and state.nodes["n1"].cpu_cores == 64
    assert decode_state(encode_state(state)) == state


def test_every_recorded_log_folds_with_the_bounds_as_it_did_without():
    # The bounds only narrow what the log never held: each recorded log
    # quarantines what it did before them (fleet-day's one malformed
    # message), nothing more (tests/test_recorded_logs.py verifies them).
    from pathlib import Path

    from llmgw.replay import logfile
    from llmgw.replay.tool import fold_until

    logs = Path(__file__).resolve().parent.parent / "events" / "logs"
    quarantined = {p.name: [q.error for q in fold_until(logfile.read(p), None).quarantined] for p in logs.glob("*.jsonl")}
    assert quarantined == {"contention.jsonl": [],
                           "fleet-day.jsonl": ["JSON is malformed: object keys must be strings (byte 1)"]}


# --------------------------------------------------------------------------- muted nodes


def _two_nodes_one_replica() -> tuple[Fleet, str]:
    f = Fleet()
    f.register("a", gpus=1)
    f.apply(model("m", min_replicas=1))
    f.decide()
    f.make_ready()
    f.register("b", gpus=1)
    (rep,) = f.state.replicas.values()
    return f, rep.shards[0].node


def test_a_muted_node_is_not_heard_its_replicas_go_elsewhere_and_an_unmute_hears_it_again():
    f, first = _two_nodes_one_replica()
    other = "b" if first == "a" else "a"
    f.publish(ev.NodeMuted(at=f.tick(), node=first, rate=30_000.0, limit=100.0, window_s=10.0, events=3000))
    assert first in f.state.muted and f.state.nodes[first].state == "lost"
    # What its agent says from now on is quarantined, unread: even garbage.
    before = f.state.quarantine_count
    f.publish(ev.NodeRegistered(at=f.tick(), node=first, gpus=[ev.Gpu(index=0)], cpu_cores=8))
    f.publish(ev.NodePower(at=f.tick(), node=first, watts=1.0), subject=f"llmgw.agent.{first}.node.power")
    garbage = (len(f.log) + 1, f"llmgw.agent.{first}.node.power", b"not json at all")
    f.log.append(garbage)
    apply(f.state, *garbage)
    assert f.state.quarantine_count == before + 3
    assert all(q.error.startswith(f"muted: node {first} spoke at 30000 events/s") for q in f.state.quarantined[-3:])
    assert f.state.nodes[first].state == "lost" and f.state.nodes[first].cpu_cores == 0
    # Its replica is replaced on the other node; the other node is heard.
    f.decide()
    live = [r for r in f.state.replicas.values() if r.state not in ("failed", "stopping")]
    assert [r.shards[0].node for r in live] == [other]
    f.publish(ev.NodePower(at=f.tick(), node=other, watts=10.0))
    assert f.state.quarantine_count == before + 3
    # Unmuted by an operator, its registration folds again.
    f.publish(ev.NodeUnmuted(at=f.tick(), node=first, reason="agent fixed"))
    f.register(first, gpus=1)
    assert first not in f.state.muted and f.state.nodes[first].state == "ready"
    # The log replays to the same state, and its passes decide the same.
    replayed = State()
    for seq, subject, data in f.log:
        apply(replayed, seq, subject, data)
    assert replayed == f.state
    assert verify(f.log)[1] == []


def test_only_the_control_plane_mutes_and_only_an_operator_unmutes():
    f, first = _two_nodes_one_replica()
    muted = ev.NodeMuted(at=f.tick(), node="b", rate=1e6, limit=100.0)
    f.publish(muted, subject="llmgw.agent.a.node.muted")  # a node muting another
    f.publish(muted, subject="llmgw.ctl.node.muted")
    assert not f.state.muted and f.state.quarantine_count == 2
    f.publish(ev.NodeMuted(at=f.tick(), node="b", rate=1e6, limit=100.0))
    f.publish(ev.NodeUnmuted(at=f.tick(), node="b"), subject="llmgw.agent.b.node.unmuted")  # itself
    assert "b" in f.state.muted


# --------------------------------------------------------------------------- counting a node's rate


def test_a_burst_is_allowed_a_flood_is_not_and_the_window_slides():
    rates = NodeRates(rate=10.0, window_s=5, burst=20)  # 70 events in any 5 s
    assert not any(rates.count("a", 100.0) for _ in range(70))
    assert rates.count("a", 100.5)  # the 71st in the same second
    assert rates.seen("a") == (71, 71.0)
    assert not rates.count("b", 100.5)  # per node
    # Steadily at the rate, never past it.
    steady = NodeRates(rate=10.0, window_s=5, burst=20)
    assert not any(steady.count("a", 200.0 + i / 10) for i in range(10 * 60))
    # A window later, the old counts are gone.
    assert not rates.count("a", 106.0)
    assert rates.seen("a") == (1, 1.0)


# --------------------------------------------------------------------------- the control plane's own words


def test_a_decision_with_a_reason_past_the_bounds_is_cut_to_fit_not_quarantined():
    from llmgw.core.contract.bounds import TEXT_LEN, fit_action

    long = "node n refused: no GPU free; " * 2000  # 16,000 nodes' refusals, said at once
    actions = [fit_action(ev.ModelWaiting(model="m", reason=long)),
               fit_action(ev.PlaceReplica(replica="m-1", model="m", profile="p", fingerprint="", shards=[],
                                          reason="r", rejections=[long] * (bounds.MAX_REJECTIONS + 5)))]
    assert len(actions[0].reason) == TEXT_LEN and actions[0].reason.endswith("more characters)")
    assert len(actions[1].rejections) == bounds.MAX_REJECTIONS
    state = State()
    apply(state, 1, "llmgw.control.control.decided", ev.encode(ev.Decided(at=1.0, basis=0, actions=actions)))
    assert state.quarantine_count == 0


def test_a_node_past_its_rate_long_ago_is_not_past_it_now():
    rates = NodeRates(rate=10.0, window_s=5, burst=20)
    assert [rates.count("a", 100.0) for _ in range(71)][-1]
    assert rates.past("a", 100.9) and not rates.past("a", 106.0) and not rates.past("b", 100.0)
