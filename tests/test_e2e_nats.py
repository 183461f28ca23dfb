"""End to end over a real nats-server: the log's rules, and the whole loop
with the control plane, simulated agents and the CLI as separate processes."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest
from nats.js.errors import APIError

from llmgw.bus import STREAM, Fenced, read_log
from llmgw.bus.nats import NatsBus
from llmgw.core.contract import events as ev
from llmgw.core.folding.fold import apply
from llmgw.core.folding.state import State

from .conftest import run_llmgw

pytestmark = pytest.mark.nats

CATALOG = """\
models:
  - name: chat
    min_replicas: 3
    profiles:
      - name: tp2
        gpus: 2
        gpu_memory_gb: 40
  - name: embed
    min_replicas: 2
    profiles:
      - name: one
        gpus: 1
"""


def live(url: str) -> tuple[State, list]:
    async def go():
        bus = await NatsBus.connect(url)
        try:
            records = await read_log(bus)
        finally:
            await bus.close()
        state = State()
        for seq, subject, data in records:
            apply(state, seq, subject, data)
        return state, records

    return asyncio.run(go())


def wait_for(url: str, predicate, timeout: float = 60.0) -> State:
    deadline = time.monotonic() + timeout
    while True:
        try:
            state, _ = live(url)
        except LookupError:  # the control plane has not created the stream yet
            state = State()
        if predicate(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s; replicas: {[(r.id, r.state) for r in state.replicas.values()]}")
        time.sleep(0.3)


def all_ready(n: int):
    return lambda s: len(s.replicas) == n and all(r.state == "ready" for r in s.replicas.values())


def placements(records) -> list[str]:
    out = []
    for _seq, subject, data in records:
        if subject == "llmgw.control.control.decided":
            out += [a.replica for a in ev.decode(data).actions if isinstance(a, ev.PlaceReplica)]
    return out


# ----------------------------------------------------------------- the log's rules


async def test_streams_are_created_idempotently_and_history_cannot_be_deleted(nats_server):
    bus = await NatsBus.connect(nats_server.url)
    try:
        await bus.ensure_streams()
        await bus.ensure_streams()
        info = await bus.js.stream_info(STREAM)
        assert info.config.deny_delete and info.config.deny_purge
        assert str(getattr(info.config.discard, "value", info.config.discard)) == "new"
        assert info.config.duplicate_window == 120
        assert not info.config.max_age and info.config.max_msgs == -1
        seq = await bus.publish("llmgw.ctl.model.removed", ev.encode(ev.ModelRemoved(at=1.0, name="x")), msg_id="a")
        with pytest.raises(APIError):
            await bus.js.purge_stream(STREAM)
        with pytest.raises(APIError):
            await bus.js.delete_msg(STREAM, seq)
        assert await bus.last_seq() == 1
    finally:
        await bus.close()


async def test_a_retried_publish_is_not_a_second_event(nats_server):
    bus = await NatsBus.connect(nats_server.url)
    try:
        await bus.ensure_streams()
        data = ev.encode(ev.ModelRemoved(at=1.0, name="x"))
        first = await bus.publish("llmgw.ctl.model.removed", data, msg_id="same")
        again = await bus.publish("llmgw.ctl.model.removed", data, msg_id="same")
        assert first == again == await bus.last_seq() == 1
    finally:
        await bus.close()


async def test_decisions_are_fenced_on_the_control_subjects_only(nats_server):
    bus = await NatsBus.connect(nats_server.url)
    try:
        await bus.ensure_streams()
        decided = ev.encode(ev.Decided(at=1.0, basis=0, actions=[]))
        one = await bus.publish("llmgw.control.control.decided", decided, msg_id="d1", expect_control_seq=0)
        # Agents speak in between: that must not refuse the next decision.
        await bus.publish("llmgw.agent.n1.shard.status", b"{}", msg_id="a1")
        two = await bus.publish("llmgw.control.control.decided", decided, msg_id="d2", expect_control_seq=one)
        # A writer that had not seen `two` (a stale leader) is refused.
        with pytest.raises(Fenced):
            await bus.publish("llmgw.control.control.decided", decided, msg_id="d3", expect_control_seq=one)
        assert await bus.last_seq() == two
    finally:
        await bus.close()


# ----------------------------------------------------------------- the whole loop


def start_fleet(processes, url: str, tmp_path, agents=("gpu-1", "gpu-2")):
    control = processes.start("control", "control", "--nats", url, "--state-dir", str(tmp_path / "state"))
    for name in agents:
        processes.start(name, "agent", "--simulate", "--name", name, "--gpus", "8", "--ready-after", "0.2", "--nats", url)
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    out = run_llmgw("ctl", "--nats", url, "apply", "-f", str(catalog))
    assert out.returncode == 0, out.stderr
    assert "model chat created" in out.stdout
    return control


def test_the_whole_loop_survives_a_kill_9_of_the_control_plane(nats_server, processes, tmp_path):
    url = nats_server.url
    control = start_fleet(processes, url, tmp_path)
    before = wait_for(url, all_ready(5))
    processes.kill9(control)
    processes.start("control-again", "control", "--nats", url, "--state-dir", str(tmp_path / "state"))
    # A model applied after the restart proves the new control plane decides.
    more = tmp_path / "more.yaml"
    more.write_text(CATALOG + "  - name: late\n    profiles: [{name: one, gpus: 1}]\n")
    out = run_llmgw("ctl", "--nats", url, "apply", "-f", str(more))
    assert "model chat unchanged" in out.stdout and "model late created" in out.stdout
    after = wait_for(url, all_ready(6))
    for rid, rep in before.replicas.items():
        assert after.replicas[rid].shards == rep.shards and after.replicas[rid].state == "ready"
    _, records = live(url)
    ids = placements(records)
    assert len(ids) == len(set(ids)) == 6, f"a replica was placed twice: {ids}"
    assert "caught up" in processes.log("control-again")


def test_a_failed_shard_is_replaced_and_bad_input_is_quarantined(nats_server, processes, tmp_path):
    url = nats_server.url
    start_fleet(processes, url, tmp_path)
    state = wait_for(url, all_ready(5))
    victim = state.replicas["chat-1"].shards[0]

    async def disturb():
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            await js.publish("llmgw.agent.gpu-1.garbage", b"\x00not an event", headers={"Nats-Msg-Id": "g1"})
            await js.publish(
                "llmgw.agent.gpu-1.node.registered",
                ev.encode(ev.NodeRegistered(at=1.0, node="gpu-2")),
                headers={"Nats-Msg-Id": "g2"},
            )
            reply = await nc.request(f"llmgw.sim.{victim.node}.fail", victim.id.encode(), timeout=5)
            assert reply.data == b"failed"
        finally:
            await nc.close()

    asyncio.run(disturb())
    after = wait_for(url, lambda s: "chat-1" not in s.replicas and all_ready(5)(s))
    assert after.quarantine_count == 2
    out = run_llmgw("replay", "--nats", url, "--quarantined", "--json")
    listed = json.loads(out.stdout)
    assert listed["count"] == 2
    assert "may not speak for node gpu-2" in listed["last"][1]["error"]
    history = run_llmgw("replay", "--nats", url, "--replica", "chat-1")
    assert "failed on request" in history.stdout and "stop chat-1" in history.stdout


def test_replay_from_an_exported_file_equals_the_live_log_and_verifies(nats_server, processes, tmp_path):
    url = nats_server.url
    start_fleet(processes, url, tmp_path)
    wait_for(url, all_ready(5))
    exported = tmp_path / "log.jsonl"
    assert run_llmgw("replay", "--nats", url, "--export", str(exported)).returncode == 0
    from_file = run_llmgw("replay", str(exported), "--json")
    from_live = run_llmgw("replay", "--nats", url, "--json")
    records = exported.read_text().splitlines()
    # The live log may have grown meanwhile only if something changed; fold the same length.
    at = str(len(records))
    assert json.loads(run_llmgw("replay", "--nats", url, "--json", "--at", at).stdout) == json.loads(from_file.stdout)
    assert json.loads(from_live.stdout)["replicas"].keys() == json.loads(from_file.stdout)["replicas"].keys()
    verified = run_llmgw("replay", str(exported), "--verify")
    assert verified.returncode == 0, verified.stdout
    assert ", 0 differ" in verified.stdout
    # The first pass that placed something (an earlier one may only say that
    # a model waits, if the agents registered after the catalog came).
    first_decision = next(json.loads(r)["seq"] for r in records if '"action":"place"' in r)
    early = json.loads(run_llmgw("replay", str(exported), "--json", "--at", str(first_decision - 1)).stdout)
    later = json.loads(run_llmgw("replay", str(exported), "--json", "--at", str(first_decision)).stdout)
    assert early["replicas"] == {} and later["replicas"] != {}
    table = run_llmgw("replay", str(exported), "--model", "embed").stdout
    assert "model embed applied" in table and "place embed-1" in table


def test_a_bad_catalog_names_file_line_and_field_and_publishes_nothing(nats_server, processes, tmp_path):
    url = nats_server.url
    start_fleet(processes, url, tmp_path)
    wait_for(url, all_ready(5))
    _, records = live(url)
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - name: chat\n    min_replicas: two\n    profiles:\n      - name: x\n        gpus: 1\n")
    out = run_llmgw("ctl", "--nats", url, "apply", "-f", str(bad))
    assert out.returncode == 2
    assert f"{bad}:3: models.0.min_replicas" in out.stderr
    assert len(live(url)[1]) == len(records)


def test_ctl_says_clearly_when_nats_is_unreachable(tmp_path):
    from llmgw.bus.server import free_port

    catalog = tmp_path / "c.yaml"
    catalog.write_text(CATALOG)
    out = run_llmgw("ctl", "--nats", f"nats://127.0.0.1:{free_port()}", "apply", "-f", str(catalog))
    assert out.returncode == 3 and "cannot reach NATS" in out.stderr
