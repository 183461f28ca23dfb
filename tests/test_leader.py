"""One leader, standbys that take over (issue 13): the lease on NATS KV, the
term in the log and on every command, agents that refuse an older term.

The quick chaos test runs real processes: three `llmgw control` on one log,
simulated agents, a rolling restart, and a kill -9 of the leader in the
middle of it. The figures (takeover time over many kills, a cluster losing
its stream leader) are benchmarks/chaos.py's.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from llmgw.agent.inventory import Inventory
from llmgw.agent.node import NodeAgent
from llmgw.agent.simulated import SimulatedAgent
from llmgw.bus import read_log
from llmgw.bus.memory import MemoryBus
from llmgw.control.plane import ControlPlane
from llmgw.core.folding import commands as cmds
from llmgw.core.contract import events as ev
from llmgw.core.folding.fold import apply
from llmgw.core.folding.liveness import lost_nodes, mass_silence
from llmgw.core.folding.state import Node, State

from . import chaos_fleet as cf
from .scenario import model, publish, until


# --------------------------------------------------------------------------- the fold


def test_terms_only_grow_in_the_fold():
    state = State()
    apply(state, 1, "llmgw.control.leader.elected", ev.encode(ev.LeaderElected(at=5.0, term=1, leader="a")))
    assert (state.term, state.leader, state.leader_since, state.control_seq) == (1, "a", 5.0, 1)
    apply(state, 2, "llmgw.control.leader.elected", ev.encode(ev.LeaderElected(at=6.0, term=1, leader="b")))
    assert state.leader == "a" and state.quarantine_count == 1 and "not after term 1" in state.quarantined[0].error
    # Only the control plane's subjects may say who leads.
    apply(state, 3, "llmgw.ctl.leader.elected", ev.encode(ev.LeaderElected(at=7.0, term=9, leader="x")))
    assert state.term == 1 and state.quarantine_count == 2


# --------------------------------------------------------------------------- liveness on evidence


def _ready_nodes(n: int) -> State:
    state = State()
    for i in range(n):
        state.nodes[f"n{i}"] = Node(name=f"n{i}", gpus=[])
    return state


def test_silence_counts_only_from_when_heartbeats_could_be_read():
    state = _ready_nodes(4)
    seen = {f"n{i}": 100.0 for i in range(4)}
    # Silent for 30 s, but the bucket has been readable for 5 s only: no evidence yet.
    assert lost_nodes(state, seen, watching_since=125.0, now=130.0, grace=10) == []
    seen["n0"] = 100.0
    for i in (1, 2, 3):
        seen[f"n{i}"] = 129.0
    ((node, reason),) = lost_nodes(state, seen, watching_since=60.0, now=130.0, grace=10)
    assert node == "n0"
    assert "no heartbeat for 30s" in reason and "last heartbeat 30s ago" in reason and "3 of 4 ready nodes heard" in reason
    assert mass_silence(state, [(node, reason)]) == ""


def test_most_of_the_fleet_silent_at_once_is_the_bus_not_the_nodes():
    state = _ready_nodes(4)
    lost = lost_nodes(state, {"n3": 129.0}, watching_since=60.0, now=130.0, grace=10)
    assert len(lost) == 3
    assert "3 of 4 ready nodes silent at once" in mass_silence(state, lost)
    # One node of one, or of two: that may well be the node.
    assert mass_silence(_ready_nodes(1), lost[:1]) == ""
    assert mass_silence(_ready_nodes(2), lost[:1]) == ""


# --------------------------------------------------------------------------- agents fence commands by term


async def test_an_agent_never_acts_on_a_command_of_an_older_term_even_after_a_restart(tmp_path):
    inventory = Inventory(gpus=[], cpu_cores=1, memory_gb=1)
    agent = NodeAgent(MemoryBus(), "n1", state_dir=tmp_path / "agent", inventory=inventory)
    agent.adopt()
    agent._on_command(cmds.encode(cmds.StopShard(shard="m-1.0", generation=3, reason="x", term=2)))
    assert agent.protocol.memory.acted(("m-1.0", 3, "stop")) and agent.state.term == 2
    agent._on_command(cmds.encode(cmds.StopShard(shard="m-2.0", generation=4, reason="deposed", term=1)))
    assert not agent.protocol.memory.acted(("m-2.0", 4, "stop"))
    # The term is in the state file: a restarted agent refuses the old leader too.
    again = NodeAgent(MemoryBus(), "n1", state_dir=tmp_path / "agent", inventory=inventory)
    again.adopt()
    assert again.state.term == 2
    again._on_command(cmds.encode(cmds.StopShard(shard="m-2.0", generation=4, reason="deposed", term=1)))
    assert not again.protocol.memory.acted(("m-2.0", 4, "stop"))
    again._on_command(cmds.encode(cmds.StopShard(shard="m-2.0", generation=4, reason="new leader", term=3)))
    assert again.protocol.memory.acted(("m-2.0", 4, "stop")) and again.state.term == 3
    # NATS made anew is another log: its terms count from 1 again, and are obeyed.
    again._on_command(cmds.encode(cmds.StopShard(shard="m-3.0", generation=1, reason="new log", term=1, log="LLMGW@2")))
    assert again.protocol.memory.acted(("m-3.0", 1, "stop")) and (again.state.term, again.state.log) == (1, "LLMGW@2")
    for a in (agent, again):
        await asyncio.gather(*a._tasks)


async def test_one_of_two_control_planes_leads_and_the_standby_takes_over_when_it_stops():
    bus = MemoryBus()
    stops = [asyncio.Event(), asyncio.Event()]
    planes = [ControlPlane(bus, tick=0.02, lease_ttl=1.0, renew_every=0.1, campaign_every=0.05) for _ in range(2)]
    agent_stop = asyncio.Event()
    agent = SimulatedAgent(bus, "n1", 8, loading_after=0.01, ready_after=0.01, heartbeat=0.1)
    tasks = [asyncio.create_task(p.run(s)) for p, s in zip(planes, stops)]
    tasks.append(asyncio.create_task(agent.run(agent_stop)))
    try:
        await publish(bus, ev.ModelApplied(at=1.0, model=model("a", min_replicas=2)))
        await until(lambda: sum(r.state == "ready" for r in planes[0].state.replicas.values()) == 2)
        (first,) = [p for p in planes if p.leading()]
        other = planes[1 - planes.index(first)]
        assert other.commands_sent == 0 and other.passes == 0
        stops[planes.index(first)].set()  # a clean stop lets go of the lease: no wait for it to expire
        await until(lambda: other.leading())
        await publish(bus, ev.ModelApplied(at=2.0, model=model("a", min_replicas=3)))
        await until(lambda: sum(r.state == "ready" for r in other.state.replicas.values()) == 3)
        records = await read_log(bus)
        elected = [ev.decode(d) for _, s, d in records if s == "llmgw.control.leader.elected"]
        assert [(e.term, e.leader) for e in elected] == [(1, first.leader), (2, other.leader)]
        assert elected[1].previous == first.leader
        leaders = {ev.decode(d).leader for _, s, d in records if s == "llmgw.control.control.decided"}
        assert leaders == {first.leader, other.leader}
        sent = [cmds.decode(c) for c in bus._commands["n1"]]
        assert {c.term for c in sent} == {1, 2} and agent.protocol.memory.term == 2 and agent.stale_commands == 0
    finally:
        for s in (*stops, agent_stop):
            s.set()
        await asyncio.gather(*tasks)


# --------------------------------------------------------------------------- real processes


@pytest.mark.nats
def test_three_control_planes_one_leader_and_a_kill_9_mid_rolling_restart(tmp_path):
    """The leader is killed while 4 replicas restart one at a time (--max-surge
    1): a standby takes over, ready never falls below 4, nothing is placed
    twice, only the leader of each term decided or sent commands, and the log
    verifies."""
    server = cf.single_server(tmp_path)
    fleet = cf.Fleet(tmp_path / "fleet", server.url)
    try:
        for i in range(3):
            fleet.control(f"control-{i}", lease_ttl=2.0)
        for name in ("gpu-1", "gpu-2"):
            fleet.agent(name, gpus=4)
        fleet.projector()
        assert fleet.apply(cf.catalog(4)).returncode == 0
        cf.wait_until("4 replicas ready", lambda: cf.ready_count(server.url) == 4, 60)
        first = cf.wait_until("a leader", lambda: cf.leader_now(fleet), 30)
        roles = sorted(r["role"] for r in first["rows"])
        cf.wait_until("two standbys", lambda: len((cf.leader_now(fleet) or {"rows": []})["rows"]) == 3, 15)
        out = fleet.ctl("restart", "m-1", "m-2", "m-3", "m-4", "--max-surge", "1")
        assert out.returncode == 0, out.stderr
        restart_seq = int(re.search(r"\(event (\d+)\)", out.stdout).group(1))
        cf.wait_until("the first replacement placed", lambda: "m-5" in cf.fold(cf.records(server.url)).replicas, 30)
        killed_at = fleet.kill9(fleet.by_pid(cf.pid_of(first["id"])))

        def restarted():
            state = cf.fold(cf.records(server.url))
            ready = {r.id for r in state.replicas.values() if r.state == "ready"}
            return len(ready) == 4 and not ready & {"m-1", "m-2", "m-3", "m-4"}

        cf.wait_until("every replica replaced", restarted, 120)
        second = cf.wait_until("a new leader", lambda: cf.leader_now(fleet), 30)
        assert second["id"] != first["id"] and second["term"] > first["term"]
        recs = cf.records(server.url)
        s = cf.story(recs, watch_from=(restart_seq,))
        assert [e[2] for e in s.elections][:1] == [first["id"]] and s.elections[-1][2] == second["id"]
        assert s.decisions_by_non_leaders == 0
        assert s.gpu_twice == [] and s.nodes_lost == []
        assert s.min_ready_after[restart_seq] >= 4
        terms = {c.term for _, c in cf.commands_sent(server.url)}
        assert terms <= {e[1] for e in s.elections} and 0 not in terms
        took = s.first_decision_of(second["id"]) - killed_at
        print(f"takeover: {took:.2f}s from kill -9 to the new leader's first decision")
        assert took < 30  # the goal (<= 5 s) is measured by benchmarks/chaos.py
        assert ", 0 differ" in cf.verify(server.url, tmp_path)
        assert roles == ["leader", "standby", "standby"]
    finally:
        fleet.stop()
        server.stop()
