"""The agents' command protocol (llmgw/agent/protocol.py), pure: no NATS,
no engine. It runs on its in-memory parts (InMemory, Recorded) and, for
what must survive a restart, on the real agent's state file. The same rules
over real NATS, for both agents: tests/test_agent_protocol_e2e.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmgw.agent import protocol as p
from llmgw.agent.statefile import StateFile, StateMemory
from llmgw.bus import keystore, signing
from llmgw.bus.memory import MemoryBus
from llmgw.core.folding import commands as cmds
from llmgw.core.contract import events as ev

PROFILE = ev.ProfileSpec(name="p", gpus=1)


def start(shard: str = "m-1.0", generation: int = 1, *, nodes=("n1",), rank: int = 0, term: int = 1, log: str = "L",
          after=()) -> cmds.StartShard:  # fmt: skip
    return cmds.StartShard(
        shard=shard, replica=shard.rpartition(".")[0], generation=generation, model="m", profile=PROFILE,
        fingerprint="f", rank=rank, gpus=[0], port=1, nodes=list(nodes), after=list(after), term=term, log=log,
    )  # fmt: skip


def stop(shard: str = "m-1.0", generation: int = 1, *, term: int = 1, log: str = "L") -> cmds.StopShard:
    return cmds.StopShard(shard=shard, generation=generation, reason="r", term=term, log=log)


def agent(memory: p.Memory | None = None, key=None) -> tuple[p.CommandProtocol, p.Recorded]:
    actions = p.Recorded()
    return p.CommandProtocol("n1", key, memory or p.InMemory(), actions), actions


def feed(proto: p.CommandProtocol, *commands) -> list[str]:
    return [proto.on_command(cmds.encode(c)) for c in commands]


def test_a_start_and_a_stop_are_each_acted_on_once_and_remembered_before():
    proto, did = agent()
    assert feed(proto, start(), start(), stop(), stop(), start()) == ["start", "duplicate", "stop", "duplicate", "duplicate"]
    assert [verb for verb, _ in did.calls] == ["start", "stop"] and proto.duplicates == 3
    assert proto.memory.acted(("m-1.0", 1, "start")) and proto.memory.acted(("m-1.0", 1, "stop"))
    assert proto.memory.saves == 2  # once per command acted on, none for a duplicate of the same term


def test_a_start_whose_stop_came_first_is_remembered_and_not_acted_on():
    proto, did = agent()
    assert feed(proto, stop(), start(), start()) == ["stop", "stopped before", "duplicate"]
    assert [verb for verb, _ in did.calls] == ["stop"]
    # And one admitted, then stopped while it waited for its turn, is stopped since.
    proto, _ = agent()
    feed(proto, start("a-1.0"))
    assert not proto.stopped_since(start("a-1.0"))
    feed(proto, stop("a-1.0"))
    assert proto.stopped_since(start("a-1.0"))


def test_a_start_that_does_not_name_this_node_at_its_rank_is_ignored_and_not_remembered():
    proto, did = agent()
    assert feed(proto, start(nodes=("n2",)), start(nodes=("n0", "n1"), rank=5)) == ["another node"] * 2
    assert did.calls == [] and not proto.memory.acted(("m-1.0", 1, "start"))
    assert feed(proto, start(nodes=("n0", "n1"), rank=1)) == ["start"]  # its own rank of a multi-node replica


def test_term_fencing_a_deposed_leader_and_a_new_log_and_the_term_kept_once_moved():
    proto, did = agent()
    assert feed(proto, stop("a-1.0", term=3)) == ["stop"] and proto.memory.term == 3
    assert feed(proto, stop("b-1.0", term=2)) == ["refused"] and proto.gate.refused == {"stale term": 1}
    assert feed(proto, stop("c-1.0", term=3 + p.MAX_TERM_JUMP + 1)) == ["refused"]
    assert proto.memory.term == 3  # a refused command moves nothing
    saves = proto.memory.saves
    # A later term is kept even when nothing is acted on (a duplicate, a re-register).
    assert feed(proto, stop("a-1.0", term=4), cmds.Reregister(reason="healed", term=5, log="L")) == ["duplicate", "register"]
    assert proto.memory.term == 5 and proto.memory.saves == saves + 2
    # NATS made anew: another log, counted afresh.
    assert feed(proto, stop("d-1.0", term=1, log="M")) == ["stop"] and (proto.memory.term, proto.memory.log) == (1, "M")
    assert ("register", "asked: healed") in did.calls


def test_only_commands_signed_for_this_node_with_the_key_are_admitted(tmp_path):
    keys = keystore.Keystore(tmp_path / "creds").init()
    signer = signing.Signer.from_file(keys.keys_dir / signing.SEED_FILE)
    proto, did = agent(key=signing.Verifier.load(str(keys.folder / signing.PUBLIC_FILE)))
    assert proto.on_command(cmds.encode(stop())) == "refused"
    assert proto.on_command(signer.seal("n2", cmds.encode(stop()))) == "refused"
    assert proto.on_command(b"not even json") == "refused"
    assert proto.on_command(signer.seal("n1", cmds.encode(stop()))) == "stop"
    assert proto.gate.refused == {"unsigned": 2, "bad signature": 1} and [v for v, _ in did.calls] == ["stop"]


def test_memory_in_memory_keeps_the_last_commands_only():
    mem = p.InMemory(keep=2)
    for g in (1, 2, 3):
        mem.remember(("s", g, "start"))
    assert not mem.acted(("s", 1, "start")) and mem.acted(("s", 2, "start")) and mem.acted(("s", 3, "start"))


def test_the_state_file_memory_keeps_commands_and_term_across_a_restart(tmp_path):
    file = StateFile(tmp_path)
    proto, _ = agent(StateMemory(file, file.load()))
    feed(proto, start(term=4), stop("x-1.0", term=4))
    saved = json.loads((tmp_path / "agent.json").read_text())
    assert saved["term"] == 4 and ["m-1.0", 1, "start"] in saved["acted"]
    # The agent again, from its file: nothing acted on twice, the deposed leader fenced still.
    again, did = agent(StateMemory(file, file.load()))
    assert feed(again, start(term=4), stop("y-1.0", term=3), start("z-1.0", term=4)) == ["duplicate", "refused", "start"]
    assert [c.shard for _, c in did.calls] == ["z-1.0"]


def test_the_generation_rules():
    assert p.start_plan(None, start(generation=5)) == "start"
    assert p.start_plan(3, start(generation=5)) == "replace"
    assert p.start_plan(5, start(generation=5)) == p.start_plan(7, start(generation=5)) == "runs already"
    assert p.stop_plan(5, stop(generation=5)) == "stop"
    # A stop of another generation never stops the one running: it is acknowledged.
    assert p.stop_plan(7, stop(generation=5)) == p.stop_plan(None, stop(generation=5)) == "not here"
    assert p.replaced_reason(start(generation=7)) == "generation 7 replaces it"


async def test_a_start_in_place_waits_for_what_it_replaces_at_most_its_limit():
    here = {"old-1.0"}
    cmd = start("new-1.0", after=("old-1.0",))
    waiting = asyncio.create_task(p.wait_after(cmd, here.__contains__, poll=0.01))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    here.clear()
    assert await waiting is True
    assert await p.wait_after(cmd, lambda s: True, poll=0.01, limit=0.03) is False  # it starts anyway


async def test_it_listens_before_it_registers_and_registers_again_after_a_reconnect():
    bus = MemoryBus()
    bus.on_reconnect = []  # as NatsBus has
    proto, did = agent()
    follower = await proto.listen(bus)
    try:
        assert did.calls == [("register", "started")]
        await bus.send_command("n1", cmds.encode(start()))
        await bus.send_command("n2", cmds.encode(start("other-1.0", nodes=("n2",))))  # another node's subject
        for _ in range(100):
            if len(did.calls) > 1:
                break
            await asyncio.sleep(0.01)
        assert [v for v, _ in did.calls] == ["register", "start"]
        for hook in bus.on_reconnect:
            await hook()
        assert did.calls[-1] == ("register", "reconnected")
        # A fleet's node leaves the reconnect to its fleet.
        fleet_node, _ = agent()
        await (await fleet_node.listen(bus, on_reconnect=False)).stop()
        assert len(bus.on_reconnect) == 1
    finally:
        await follower.stop()


@pytest.mark.parametrize("data", [b"", b"{}", b'{"command":"start"}', b"\xff" * 10])
def test_bad_input_is_refused_with_no_traceback(data):
    proto, did = agent()
    assert proto.on_command(data) == "refused" and did.calls == []
