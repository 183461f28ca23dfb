"""The event contract: the schema files match the code, and the code keeps
every promise the committed files made (fields only ever added, with defaults)."""

import copy

import msgspec
import pytest

from llmgw import contract
from llmgw.core.contract import events as ev
from llmgw.core.contract.policy import Policy


def test_schema_files_match_the_code():
    current, saved = contract.schemas(), contract.committed()
    assert set(saved) == set(current), "run `llmgw events schema --write`"
    for tag in current:
        assert saved[tag] == current[tag], f"events/schema/{tag}.json is out of date: run `llmgw events schema --write`"


def test_the_code_keeps_the_committed_contract():
    assert contract.incompatibilities(contract.committed(), contract.schemas()) == []


def test_every_event_has_an_explicit_tag_a_version_and_a_time():
    for cls in ev.EVENT_TYPES:
        assert isinstance(cls.__struct_config__.tag, str) and "." in cls.__struct_config__.tag
        fields = {f.name for f in msgspec.structs.fields(cls)}
        assert {"v", "at"} <= fields


def _shard_status_schema():
    return copy.deepcopy(contract.schemas())


def test_a_removed_field_is_incompatible():
    old = contract.schemas()
    new = copy.deepcopy(old)
    del new["shard.status"]["$defs"]["ShardStatus"]["properties"]["reason"]
    assert any("reason" in p and "removed" in p for p in contract.incompatibilities(old, new))


def test_a_retyped_field_is_incompatible():
    old = contract.schemas()
    new = copy.deepcopy(old)
    new["shard.status"]["$defs"]["ShardStatus"]["properties"]["generation"] = {"type": "string"}
    assert any("generation" in p and "retyped" in p for p in contract.incompatibilities(old, new))


def test_a_changed_tag_is_incompatible():
    old = contract.schemas()
    new = copy.deepcopy(old)
    new["shard.state"] = new.pop("shard.status")
    assert any("shard.status" in p for p in contract.incompatibilities(old, new))


def test_a_new_required_field_is_incompatible_but_a_defaulted_one_is_not():
    old = contract.schemas()
    new = copy.deepcopy(old)
    props = new["node.lost"]["$defs"]["NodeLost"]["properties"]
    props["cause"] = {"type": "string", "default": ""}
    assert contract.incompatibilities(old, new) == []
    new["node.lost"]["$defs"]["NodeLost"]["required"].append("cause")
    assert any("cause" in p for p in contract.incompatibilities(old, new))


def test_a_nested_field_change_is_found():
    old = contract.schemas()
    new = copy.deepcopy(old)
    del new["control.decided"]["$defs"]["ShardPlacement"]["properties"]["port"]
    assert any("port" in p for p in contract.incompatibilities(old, new))


@pytest.mark.parametrize("cls", ev.EVENT_TYPES)
def test_unknown_fields_from_a_newer_publisher_are_ignored(cls):
    # An older reader must fold a newer writer's event: fields are only added.
    schema_fields = {f.name for f in msgspec.structs.fields(cls)}
    assert "from_the_future" not in schema_fields
    sample = {
        ev.ModelApplied: ev.ModelApplied(at=1.0, model=ev.ModelSpec(name="m", profiles=[ev.ProfileSpec(name="p")])),
        ev.ModelRemoved: ev.ModelRemoved(at=1.0, name="m"),
        ev.NodeRegistered: ev.NodeRegistered(at=1.0, node="n"),
        ev.ShardStatus: ev.ShardStatus(at=1.0, node="n", replica="r", shard="r.0", generation=1, state="ready"),
        ev.Decided: ev.Decided(at=1.0, basis=0, actions=[]),
        ev.NodeLost: ev.NodeLost(at=1.0, node="n", reason="x"),
        ev.ReplicasRestart: ev.ReplicasRestart(at=1.0, replicas=["m-1"]),
        ev.ModelRetry: ev.ModelRetry(at=1.0, name="m"),
        ev.ApiKeyApplied: ev.ApiKeyApplied(at=1.0, name="k", owner="o", key_sha256="0" * 64),
        ev.ApiKeyRemoved: ev.ApiKeyRemoved(at=1.0, name="k"),
        ev.CredentialRevoked: ev.CredentialRevoked(at=1.0, role="agent", name="n1"),
        ev.ModelLoad: ev.ModelLoad(at=1.0, gateway="g", model="m"),
        ev.OwnerApplied: ev.OwnerApplied(at=1.0, name="org"),
        ev.OwnerRemoved: ev.OwnerRemoved(at=1.0, name="org"),
        ev.NodePorts: ev.NodePorts(at=1.0, node="n", taken=[20000]),
        ev.LeaderElected: ev.LeaderElected(at=1.0, term=1, leader="a"),
        ev.NodeLabeled: ev.NodeLabeled(at=1.0, node="n", set={"llmgw.io/rack": "r1"}, remove=["llmgw.io/pdu"]),
        ev.DomainHeld: ev.DomainHeld(at=1.0, domain="rack/r1", drain=True, reason="maintenance"),
        ev.DomainReleased: ev.DomainReleased(at=1.0, domain="rack/r1"),
        ev.FacilityApplied: ev.FacilityApplied(at=1.0, budgets={"pdu/pdu-a": 12000.0}),
        ev.NodePower: ev.NodePower(at=1.0, node="n", watts=700.0, gpus={0: 350.0, 1: 350.0}),
        ev.PolicyApplied: ev.PolicyApplied(at=1.0, policy=Policy(min_lifetime_s=30.0)),
        ev.NodeMuted: ev.NodeMuted(at=1.0, node="n", rate=5000.0, limit=100.0, window_s=10.0, events=50000),
        ev.NodeUnmuted: ev.NodeUnmuted(at=1.0, node="n", reason="fixed"),
        ev.NodeAdmitted: ev.NodeAdmitted(at=1.0, node="n", gpus=8, gpu_models=["H100"], pool="secure"),
        ev.UsageReported: ev.UsageReported(at=1.0, gateway="g", rows=[ev.UsageRow(model="m", key="k", requests=1)]),
    }[cls]
    data = msgspec.json.decode(ev.encode(sample))
    data["from_the_future"] = 42
    assert ev.decode(msgspec.json.encode(data)) == sample
