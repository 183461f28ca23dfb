"""Why a model waits, as data (core/rules/waits.py), and what a gateway makes of it:
a request for a model that cannot be served now (no room, over a limit,
parked) is refused at once with the control plane's reason; one for a model
on its way (placing, loading, waking, room being made) waits. Pure: the
fold, decide and the gateway's routing table, no I/O (the processes are in
tests/test_failfast_e2e.py)."""

from __future__ import annotations

from llmgw.core.contract import events as ev
from llmgw.core.rules.waits import FAIL_FAST, WaitKind, legacy_kind, request_wait
from llmgw.gateway.routing import NoneReady, build, when_none_ready

from .scenario import Fleet, model

GRACE = 5.0


def waits(f: Fleet, name: str) -> tuple[str, str]:
    m = f.state.models[name]
    return m.waiting_kind, m.waiting


def verdict(f: Fleet, name: str) -> NoneReady:
    return when_none_ready(build(f.state).routes[name], 0, 0.0, GRACE)


def last_wait(actions: list[ev.Action]) -> ev.ModelWaiting:
    return [a for a in actions if isinstance(a, ev.ModelWaiting)][-1]


def test_a_model_that_fits_nowhere_waits_for_no_room_and_its_requests_are_refused_with_the_reason():
    f = Fleet()
    f.register("gpu-1", gpus=8)
    f.apply(model("big", gpus=16))
    said = last_wait(f.decide())
    assert said.kind == "no_room" and said.reason.startswith("no room: profile default needs a node with 16 free GPU(s)")
    assert "needs 16, has 8" in said.reason
    assert waits(f, "big") == ("no_room", said.reason)
    route = build(f.state).routes["big"]
    assert route.wait_kind == "no_room"
    assert route.no_wait == f"model big cannot be served now: {said.reason}"
    assert verdict(f, "big") is NoneReady.REFUSE
    # Room comes (a node big enough): placed, no longer waiting, and its requests wait for it.
    f.register("gpu-2", gpus=16)
    f.decide()
    assert waits(f, "big") == ("", "")
    assert verdict(f, "big") is NoneReady.WAIT
    assert request_wait(f.state.models["big"], on_way=1).kind is WaitKind.PLACING


def test_a_model_short_of_room_for_one_more_replica_still_waits_for_the_one_loading():
    f = Fleet()
    f.register("gpu-1", gpus=1)
    f.apply(model("m", min_replicas=2))
    f.decide()
    assert waits(f, "m")[0] == "no_room"
    f.report("m-1.0", "starting")
    f.report("m-1.0", "loading")
    assert verdict(f, "m") is NoneReady.WAIT  # m-1 is on its way
    assert request_wait(f.state.models["m"], on_way=1, loading=1).kind is WaitKind.LOADING
    f.report("m-1.0", "ready")
    assert verdict(f, "m") is NoneReady.WAIT  # served: no room is room for a second one
    assert not build(f.state).routes["m"].no_wait
    f.report("m-1.0", "failed", reason="crashed")
    assert verdict(f, "m") is NoneReady.WAIT  # failed, to be replaced in the room it frees


def test_no_node_ready_is_waited_for_a_node_may_register():
    f = Fleet()
    f.apply(model("m"))
    said = last_wait(f.decide())
    assert (said.kind, said.reason) == ("no_node", "no node is ready")
    assert verdict(f, "m") is NoneReady.WAIT


def test_over_its_owners_limit_is_refused_at_once():
    f = Fleet()
    f.register("gpu-1", gpus=8)
    f.publish(ev.OwnerApplied(at=f.tick(), name="lab", limit=ev.Limit(gpus=2)))
    f.apply(model("train", gpus=4, owner="lab"))
    said = last_wait(f.decide())
    assert said.kind == "over_limit" and said.reason.startswith("over limit: owner lab")
    assert verdict(f, "train") is NoneReady.REFUSE
    assert "cannot be served now: over limit" in build(f.state).routes["train"].no_wait


def test_a_parked_model_is_refused_and_once_retried_is_waited_for_again():
    f = Fleet()
    f.register("gpu-1", gpus=8)
    f.apply(model("m"))
    for i in range(1, 6):
        f.decide()
        f.report(f"m-{i}.0", "failed", reason="no such weights")
        f.tick(400)  # past the back-off
    said = last_wait(f.decide())
    assert said.kind == "parked" and f.state.models["m"].parked
    route = build(f.state).routes["m"]
    assert route.wait_kind == "parked" and route.no_wait.startswith("model m is parked: parked: 5 replicas")
    assert verdict(f, "m") is NoneReady.REFUSE
    f.retry("m")  # the waiting reason still says parked until the next pass: not a refusal
    assert verdict(f, "m") is NoneReady.WAIT


def test_backing_off_held_and_preempting_are_on_their_way():
    for kind in ("backing_off", "held", "preempting", "room_later", "no_node"):
        assert WaitKind(kind) not in FAIL_FAST
    f = Fleet()
    f.register("gpu-1", gpus=8)
    f.apply(model("m"))
    f.decide()
    f.report("m-1.0", "failed", reason="crashed at start")
    said = last_wait(f.decide())
    assert said.kind == "backing_off" and said.reason.startswith("backing off:")
    assert verdict(f, "m") is NoneReady.WAIT


def test_an_on_demand_model_at_zero_is_woken_by_a_request_and_refused_once_it_fits_nowhere():
    f = Fleet()
    f.register("gpu-1", gpus=8)
    f.apply(model("od", min_replicas=0, on_demand=True, gpus=16))
    f.decide()
    assert waits(f, "od") == ("", "")
    assert request_wait(f.state.models["od"], on_way=0).kind is WaitKind.WAKING
    assert verdict(f, "od") is NoneReady.WAIT  # the request is queued: the load wakes it
    f.load("od", queued=1)
    said = last_wait(f.decide())
    assert said.kind == "no_room"
    assert verdict(f, "od") is NoneReady.REFUSE


def test_a_waiting_reason_recorded_before_kinds_is_read_from_its_words():
    assert legacy_kind("no room: profile one needs a node with 1 free GPU(s)") is WaitKind.NO_ROOM
    assert legacy_kind("no room; batch-5 would make room but became ready less than 10s ago") is WaitKind.ROOM_LATER
    assert legacy_kind("over limit: owner lab holds 2 GPUs") is WaitKind.OVER_LIMIT
    assert legacy_kind("parked: 5 replicas in a row failed to start") is WaitKind.PARKED
    assert legacy_kind("no node is ready: 2 cordoned") is WaitKind.NO_NODE
    assert legacy_kind("preempting batch-5 to make room") is WaitKind.PREEMPTING
    assert legacy_kind("waiting for batch-5, preempted for it, to stop") is WaitKind.PREEMPTING
    assert legacy_kind("held: it gave room to judge") is WaitKind.HELD
    assert legacy_kind("backing off: 1 replica(s) in a row failed") is WaitKind.BACKING_OFF
    assert legacy_kind("a replica of m was not ready by its start deadline") is WaitKind.BACKING_OFF
    assert legacy_kind("something said later") is WaitKind.NONE
    # Folded: a ModelWaiting without a kind gets the one its words say; one with a kind keeps it.
    f = Fleet()
    f.apply(model("m"))
    f.publish(ev.Decided(at=f.tick(), basis=0, actions=[ev.ModelWaiting(model="m", reason="no room: x")]))
    assert waits(f, "m") == ("no_room", "no room: x")
    f.publish(ev.Decided(at=f.tick(), basis=0, actions=[ev.ModelWaiting(model="m", reason="no room: y", kind="held")]))
    assert waits(f, "m") == ("held", "no room: y")
    # Decided again on that state, the kind it lacks is said once, with the same words.
    f.register("gpu-1", gpus=0)
    said = last_wait(f.decide())
    assert said.kind == "no_room"
