"""The control plane's shell over the in-memory bus: the loop, fencing,
commands, liveness and snapshots, without a server."""

import asyncio

import pytest

from llmgw.agent.simulated import SimulatedAgent
from llmgw.bus import Fenced
from llmgw.bus.memory import MemoryBus
from llmgw.control.plane import ControlPlane
from llmgw.control.snapshots import SnapshotStore
from llmgw.core.contract import events as ev
from llmgw.core.folding.fold import apply
from llmgw.core.folding.state import State

from .scenario import model, publish, until


def replay(bus: MemoryBus) -> State:
    state = State()
    for i, (subject, data) in enumerate(bus.log, 1):
        apply(state, i, subject, data)
    return state


def placed_ids(bus: MemoryBus) -> list[str]:
    out = []
    for subject, data in bus.log:
        if subject == "llmgw.control.control.decided":
            out += [a.replica for a in ev.decode(data).actions if isinstance(a, ev.PlaceReplica)]
    return out


async def test_control_plane_places_and_the_simulated_agents_make_ready():
    bus, stop = MemoryBus(), asyncio.Event()
    plane = ControlPlane(bus, tick=0.05)
    agents = [SimulatedAgent(bus, f"n{i}", 4, loading_after=0.01, ready_after=0.01, heartbeat=0.1) for i in (1, 2)]
    tasks = [asyncio.create_task(x.run(stop)) for x in (plane, *agents)]
    try:
        await publish(bus, ev.ModelApplied(at=1.0, model=model("m", min_replicas=3, gpus=2)))
        await until(lambda: [r.state for r in plane.state.replicas.values()] == ["ready"] * 3)
        # Live state equals a replay of the log, exactly.
        assert replay(bus) == plane.state
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def test_a_stale_writer_is_fenced_and_the_plane_decides_again():
    bus = MemoryBus()
    await publish(bus, ev.ModelApplied(at=1.0, model=model("m")))
    await publish(bus, ev.NodeRegistered(at=1.0, node="n1", gpus=[ev.Gpu(index=0)]))
    # Another writer publishes a decision the plane has not folded.
    other = ev.Decided(at=2.0, basis=2, actions=[ev.ModelWaiting(model="m", reason="someone else")])
    await bus.publish(ev.subject_for(other), ev.encode(other), msg_id="other", expect_control_seq=0)
    with pytest.raises(Fenced):
        await bus.publish(ev.subject_for(other), ev.encode(other), msg_id="again", expect_control_seq=0)
    plane = ControlPlane(bus, tick=0.05)
    plane.state = State()  # pretend it folded nothing yet, then let it catch up
    stop = asyncio.Event()
    task = asyncio.create_task(plane.run(stop))
    try:
        await until(lambda: "m-1" in plane.state.replicas)
        assert placed_ids(bus) == ["m-1"]
    finally:
        stop.set()
        await task


async def test_two_control_planes_never_place_a_replica_twice():
    bus, stop = MemoryBus(), asyncio.Event()
    planes = [ControlPlane(bus, tick=0.02) for _ in range(2)]
    agent = SimulatedAgent(bus, "n1", 8, loading_after=0.01, ready_after=0.01, heartbeat=0.1)
    tasks = [asyncio.create_task(x.run(stop)) for x in (*planes, agent)]
    try:
        for name in ("a", "b", "c"):
            await publish(bus, ev.ModelApplied(at=1.0, model=model(name, min_replicas=2)))
        await until(lambda: sum(r.state == "ready" for r in planes[0].state.replicas.values()) == 6)
        await asyncio.sleep(0.2)
        ids = placed_ids(bus)
        assert sorted(ids) == sorted(set(ids)) and len(ids) == 6
        assert planes[0].state == planes[1].state == replay(bus)
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def test_a_silent_node_is_lost_and_its_replicas_move():
    bus, stop = MemoryBus(), asyncio.Event()
    plane = ControlPlane(bus, tick=0.05, node_grace=0.5)
    steady = SimulatedAgent(bus, "steady", 2, loading_after=0.01, ready_after=0.01, heartbeat=0.1)
    doomed = SimulatedAgent(bus, "doomed", 2, loading_after=0.01, ready_after=0.01, heartbeat=0.1)
    doomed_stop = asyncio.Event()
    tasks = [asyncio.create_task(plane.run(stop)), asyncio.create_task(steady.run(stop))]
    doomed_task = asyncio.create_task(doomed.run(doomed_stop))
    try:
        await doomed.registered.wait()
        await publish(bus, ev.ModelApplied(at=1.0, model=model("m", min_replicas=2, gpus=1)))
        await until(lambda: sum(r.state == "ready" for r in plane.state.replicas.values()) == 2)
        doomed_stop.set()  # its heartbeats stop
        await doomed_task
        await until(lambda: plane.state.nodes["doomed"].state == "lost", timeout=5)
        assert "no heartbeat" in plane.state.nodes["doomed"].reason
        await until(
            lambda: [s.node for r in plane.state.replicas.values() if r.state == "ready" for s in r.shards]
            == ["steady", "steady"]
        )
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def test_a_restart_from_a_snapshot_folds_only_the_tail_and_equals_a_full_replay(tmp_path):
    bus, stop = MemoryBus(), asyncio.Event()
    store = SnapshotStore(tmp_path / "snap")
    plane = ControlPlane(bus, tick=0.05, snapshots=store)
    agent = SimulatedAgent(bus, "n1", 4, loading_after=0.01, ready_after=0.01, heartbeat=0.1)
    tasks = [asyncio.create_task(x.run(stop)) for x in (plane, agent)]
    await publish(bus, ev.ModelApplied(at=1.0, model=model("m", min_replicas=2)))
    await until(lambda: sum(r.state == "ready" for r in plane.state.replicas.values()) == 2)
    stop.set()
    await asyncio.gather(*tasks)
    saved_at = store.load(await bus.log_id(), await bus.last_seq()).seq
    assert saved_at == len(bus.log)
    await publish(bus, ev.ModelApplied(at=2.0, model=model("n")))  # the tail
    seen = []
    again = ControlPlane(bus, tick=0.05, snapshots=store)
    original = again._on_message
    again._on_message = lambda seq, subject, data: (seen.append(seq), original(seq, subject, data))
    stop2 = asyncio.Event()
    task = asyncio.create_task(again.run(stop2))
    await again.ready.wait()
    stop2.set()
    await task
    assert seen[0] == saved_at + 1
    assert again.state.seq == len(bus.log)
    assert replay(bus) == again.state


def test_a_snapshot_from_another_fold_or_a_longer_log_is_not_trusted(tmp_path, monkeypatch):
    from llmgw.control import snapshots

    store = SnapshotStore(tmp_path / "snap")
    state = State(seq=10)
    store.save(state, "log-a")
    assert store.load("log-a", 10) == state
    assert store.load("log-b", 10) is None  # another log under the same name
    assert store.load("log-a", 9) is None  # further along than the log
    monkeypatch.setattr(snapshots, "FOLD_VERSION", snapshots.FOLD_VERSION + 1)
    assert store.load("log-a", 10) is None


async def test_a_lost_node_that_is_heard_again_registers_and_its_shards_are_adopted():
    bus, stop = MemoryBus(), asyncio.Event()
    plane = ControlPlane(bus, tick=0.05, node_grace=0.4, resend_after=0.2)
    agent = SimulatedAgent(bus, "n1", 2, loading_after=0.01, ready_after=0.01, heartbeat=0.1)
    tasks = [asyncio.create_task(plane.run(stop))]
    agent_stop = asyncio.Event()
    agent_task = asyncio.create_task(agent.run(agent_stop))
    try:
        await publish(bus, ev.ModelApplied(at=1.0, model=model("m", min_replicas=2)))
        await until(lambda: sum(r.state == "ready" for r in plane.state.replicas.values()) == 2)
        agent.heartbeat = 1.0  # a partition: its heartbeats come too late
        await until(lambda: plane.state.nodes["n1"].state == "lost", timeout=5)
        agent.heartbeat = 0.1
        # Heard again: asked to register, it reports its two running shards,
        # which the fold takes as strays and stops; the model gets new replicas.
        await until(lambda: plane.state.nodes["n1"].state == "ready", timeout=5)
        await until(lambda: sum(r.state == "ready" for r in plane.state.replicas.values()) == 2, timeout=5)
        assert replay(bus) == plane.state
    finally:
        agent_stop.set()
        stop.set()
        await asyncio.gather(*tasks, agent_task)
