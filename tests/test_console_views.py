"""The console's data, without a browser or a bus: the facility adapter's
fallback (labels and holds folded from the operators' events), the domain
rows, the decision at a point of the log with its facts, and the token check."""

from __future__ import annotations

from llmgw.core.folding import facility_facts as fac
from llmgw.console import fleetmap, views
from llmgw.console.server import Console, HttpError
from llmgw.core.contract import events as ev
from llmgw.core.folding.fold import apply
from llmgw.core.folding.state import State


def log_of(*events: ev.Event) -> list[tuple[int, str, bytes]]:
    return [(i, ev.subject_for(e), ev.encode(e)) for i, e in enumerate(events, 1)]


def node(name: str, rack: str, gpus: int = 2) -> ev.NodeRegistered:
    return ev.NodeRegistered(
        at=1.0, node=name, gpus=[ev.Gpu(index=i, model="H100", memory_gb=80) for i in range(gpus)],
        labels={"llmgw.io/site": "par1", "llmgw.io/rack": rack, "llmgw.io/pdu": f"{rack}-a"},
    )


def folded(records) -> State:
    state = State()
    for r in records:
        apply(state, *r)
    return state


def test_the_console_shows_the_labels_and_holds_the_operator_published():
    records = log_of(
        node("n1", "r1"), node("n2", "r1"), node("n3", "r2"),
        ev.NodeLabeled(at=2.0, node="n3", set={"rack": "r9"}, remove=["pdu"]),
        ev.DomainHeld(at=3.0, domain="rack/r1", drain=True, reason="maintenance"),
        ev.DomainHeld(at=4.0, domain="rack/r9"),
        ev.DomainReleased(at=5.0, domain="rack/r9"),
    )
    state = folded(records)
    # The operator's rack over the agent's; removing the operator's pdu (it set none) leaves the agent's.
    assert fac.location(state.nodes["n3"]) == {"site": "par1", "rack": "r9", "pdu": "r2-a"}
    assert fac.location(state.nodes["n1"]) == {"site": "par1", "rack": "r1", "pdu": "r1-a"}
    rows = {d.domain: d for d in fac.domain_rows(state)}
    assert rows["rack/r1"].nodes == 2 and rows["rack/r1"].gpus_free == 4
    assert rows["rack/r1"].held and rows["rack/r1"].drain and rows["rack/r1"].hold_reason == "maintenance"
    assert not rows["rack/r9"].held and rows["rack/r9"].nodes == 1
    assert rows["site/par1"].nodes == 3 and not rows.get("rack/r2", fac.DomainRow(domain="", kind="", name="")).nodes
    fleet = fleetmap.fleet_map(state)
    assert [n[0] for n in fleet["nodes"]] == ["n1", "n2", "n3"] and fleet["nodes"][0][3] == [fleetmap.FREE] * 2
    assert fleet["held"] == {"rack/r1": [True, "maintenance"]}


def test_the_decision_at_a_point_comes_with_the_facts_it_was_taken_on():
    place = ev.PlaceReplica(model="m", replica="m-1", profile="one", fingerprint="f", reason="m has 0 of 1 replicas",
                            shards=[ev.ShardPlacement(shard="m-1.0", node="n1", rank=0, gpus=[0], port=20000)])
    records = log_of(
        node("n1", "r1"),
        ev.ModelApplied(at=2.0, model=ev.ModelSpec(name="m", profiles=[ev.ProfileSpec(name="one", gpus=1)])),
        ev.Decided(at=3.0, basis=2, actions=[place], leader="c1"),
        ev.ShardStatus(at=4.0, node="n1", replica="m-1", shard="m-1.0", generation=3, state="ready"),
    )
    state = folded(records)
    d = views.decision_at(records, state, 4)
    assert d["seq"] == 3 and d["basis"] == 2 and d["leader"] == "c1"
    assert d["actions"] == ["place m-1 (m/one) on n1:[0] (m has 0 of 1 replicas)"]
    assert [f["type"] for f in d["facts"]] == ["node.registered", "model.applied"]
    assert views.decision_at(records, folded(records[:2]), 2) is None


def test_only_the_token_reads_and_actions_come_from_the_consoles_own_page():
    console = Console(None, None, "s3cret")
    assert console._authorized({"cookie": "a=b; llmgw_console=s3cret"})
    assert console._authorized({"authorization": "Bearer s3cret"})
    for headers in ({}, {"cookie": "llmgw_console=s3cre"}, {"authorization": "Bearer nope"}, {"cookie": "other=s3cret"}):
        assert not console._authorized(headers)
    console._same_origin({"origin": "http://127.0.0.1:9", "host": "127.0.0.1:9", "x-llmgw-console": "1"})
    for headers in ({"origin": "http://evil", "host": "127.0.0.1:9", "x-llmgw-console": "1"},
                    {"origin": "http://127.0.0.1:9", "host": "127.0.0.1:9"}, {"host": "127.0.0.1:9", "x-llmgw-console": "1"}):
        try:
            console._same_origin(headers)
        except HttpError as e:
            assert e.status == 403
        else:
            raise AssertionError(f"{headers} was let through")
