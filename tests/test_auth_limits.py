"""Issue 35, findings 2, 3, 6 (size) and 9 (durable consumers): each attack
tried against a real nats-server with auth on, as the credential that made
it, and seen refused or contained."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.api import ConsumerConfig, KeyValueConfig, StorageType

from llmgw.bus import ENGINE_KEYS_BUCKET, HEARTBEAT_BUCKET, LEADER_BUCKET, STREAM, auth, buckets, credentials, keystore, read_log
from llmgw.bus.msgids import MsgIds
from llmgw.bus.nats import NatsBus
from llmgw.bus.server import NatsServer, free_port
from llmgw.core.contract import events as ev

from .test_auth import Speaker, _control, _registered, _subjects

pytestmark = pytest.mark.timeout(60)


async def _put(speaker: Speaker, subject: str, data: bytes, headers: dict | None = None) -> str:
    """A KV put as a raw JetStream publish: the server's answer, or why none came."""
    try:
        ack = await speaker.nc.request(subject, data, headers=headers, timeout=2)
    except Exception as e:
        return f"no answer ({type(e).__name__})"
    return ack.data.decode()


async def test_no_node_can_roll_up_or_purge_a_bucket(auth_nats):
    """A node's `Nats-Rollup: all` on its own engine key and heartbeat wiped
    every node's (finding 2): refused now, and the other node's keys and
    heartbeat are intact. A delete is a marker, as it always was."""
    control = await _control(auth_nats)
    nodes = {n: await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("agent", n)) for n in ("a", "b")}
    a = await Speaker.connect(auth_nats, "agent", "a")
    try:
        for n, bus in nodes.items():
            await bus.put_engine_key(f"{n}.s.1", f"key-{n}")
            await bus.beat(n, b"{}")
        for rollup in ("all", "sub"):
            for subject in (f"$KV.{ENGINE_KEYS_BUCKET}.a.s.1", f"$KV.{HEARTBEAT_BUCKET}.a"):
                answer = await _put(a, subject, b"", headers={"Nats-Rollup": rollup})
                assert "rollup" in answer.lower() and '"error"' in answer, (subject, answer)
        await nodes["a"].delete_engine_key("a.s.1")  # a marker: what an agent's delete is
        keys = await control.js.key_value(ENGINE_KEYS_BUCKET)
        beats = await control.js.key_value(HEARTBEAT_BUCKET)
        assert (await keys.get("b.s.1")).value == b"key-b"
        assert await nodes["a"].engine_key("a.s.1") is None
        assert (await beats.get("b")).value == b"{}" and (await beats.get("a")).value == b"{}"
        for bucket in (ENGINE_KEYS_BUCKET, HEARTBEAT_BUCKET):
            config = (await control.js.stream_info(f"KV_{bucket}")).config
            assert buckets.hardened(config), (bucket, config)
    finally:
        await a.close()
        for bus in (*nodes.values(), control):
            await bus.close()


async def test_buckets_made_by_an_older_llmgw_are_hardened_at_the_control_planes_start(auth_nats):
    harness_keys = auth_nats.auth
    old = await NatsBus.connect(auth_nats.url, creds=str(harness_keys.issue_unrestricted(auth_nats.store_dir / "h.creds")))
    try:
        for bucket, direct in ((HEARTBEAT_BUCKET, False), (ENGINE_KEYS_BUCKET, True), (LEADER_BUCKET, False)):
            kv = await old.js.create_key_value(
                KeyValueConfig(bucket=bucket, history=1, direct=direct, storage=StorageType.MEMORY if bucket == HEARTBEAT_BUCKET else StorageType.FILE)
            )  # as nats-py makes them: rollups allowed
            await kv.put("kept", b"yes")
            assert not buckets.hardened((await old.js.stream_info(f"KV_{bucket}")).config)
        control = await _control(auth_nats)
        try:
            await control.lease(10.0)
            for bucket in (HEARTBEAT_BUCKET, ENGINE_KEYS_BUCKET, LEADER_BUCKET):
                assert buckets.hardened((await old.js.stream_info(f"KV_{bucket}")).config), bucket
                assert (await (await old.js.key_value(bucket)).get("kept")).value == b"yes"
        finally:
            await control.close()
    finally:
        await old.close()


async def test_a_gateway_that_claims_the_control_planes_next_msg_id_cannot_freeze_decisions(auth_nats):
    """Finding 3: the gateway publishes first under the id the control plane
    will use next (the test reads it off the generator; nobody else can: it
    is random per message). The decision is acked as a duplicate of the
    gateway's message, which is not ours: published again, it lands."""
    control = await _control(auth_nats)
    gateway = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("gateway", "g1"))
    try:
        ids = MsgIds("leader-x")
        claimed = ids.peek()
        load = ev.ModelLoad(at=1.0, gateway="g1", model="m")
        squat = await gateway.publish(ev.subject_for(load), ev.encode(load), msg_id=claimed)
        decided = ev.NodeLost(at=2.0, node="a", reason="test")
        seq = await control.publish(ev.subject_for(decided), ev.encode(decided), msg_id=next(ids), expect_control_seq=0)
        assert seq != squat
        assert await _subjects(control) == ["llmgw.gw.g1.model.load", "llmgw.control.node.lost"]
        # A retry of our own publish under its id is still one event.
        again = await control.publish(ev.subject_for(load).replace("gw.g1", "control"), b"{}", msg_id="mine", expect_control_seq=seq)
        assert await control.publish(ev.subject_for(load).replace("gw.g1", "control"), b"{}", msg_id="mine") == again
        assert len(await read_log(control)) == 3
    finally:
        await gateway.close()
        await control.close()


async def test_an_operator_event_whose_id_a_node_claimed_still_lands(auth_nats):
    control = await _control(auth_nats)
    agent = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("agent", "a"))
    operator = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("operator"))
    try:
        await agent.publish("llmgw.agent.a.node.registered", _registered("a"), msg_id="ctl-next")
        removed = ev.ModelRemoved(at=1.0, name="m")
        await operator.publish(ev.subject_for(removed), ev.encode(removed), msg_id="ctl-next")
        assert await _subjects(control) == ["llmgw.agent.a.node.registered", "llmgw.ctl.model.removed"]
    finally:
        for bus in (agent, operator, control):
            await bus.close()


async def test_a_node_may_not_publish_900_kB(auth_nats):
    """Finding 6 (size): the server refuses a message past the role's
    payload limit (AuthConfig.agent_max_payload), and it is not in the log."""
    control = await _control(auth_nats)
    errors: list = []

    async def error_cb(e) -> None:
        errors.append(str(e))

    import nats

    creds = auth_nats.creds("agent", "a")
    who = credentials.identity(creds)
    assert credentials.jwt_claims(credentials.read_creds(creds)[0])["nats"]["payload"] == auth.DEFAULTS.agent_max_payload
    nc = await nats.connect(auth_nats.url, user_credentials=creds, inbox_prefix=who.inbox_prefix, error_cb=error_cb, allow_reconnect=False)
    try:
        await nc.publish("llmgw.agent.a.shard.status", b"x" * 900_000)
        for _ in range(100):
            if any("maximum payload" in e.lower() for e in errors) or nc.is_closed:
                break
            await asyncio.sleep(0.02)
        assert any("maximum payload" in e.lower() for e in errors) or nc.is_closed, errors
        assert await _subjects(control) == []
    finally:
        await nc.close()
        await control.close()


@pytest.mark.parametrize("role", ["gateway", "operator", "projector"])
async def test_a_reader_may_create_only_ephemeral_consumers(auth_nats, role):
    """Finding 9: a durable consumer is refused, by its API subject or by the
    name in the body; an ephemeral one (what readers use) is made."""
    control = await _control(auth_nats)
    reader = await Speaker.connect(auth_nats, role, "g1" if role == "gateway" else None)
    try:
        js = reader.nc.jetstream(timeout=2)
        for config in (ConsumerConfig(durable_name="kept"), ConsumerConfig(name="named")):
            with pytest.raises(Exception):
                await js.add_consumer(STREAM, config)
        # The create subject readers may use, with a durable name in the body: the server refuses it.
        with pytest.raises(Exception, match="(?i)durable|ephemeral"):
            await js._jsm._api_request(f"$JS.API.CONSUMER.CREATE.{STREAM}", b'{"stream_name":"LLMGW","config":{"durable_name":"kept","ack_policy":"none"}}', timeout=2)
        assert (await control.js.stream_info(STREAM)).state.consumer_count == 0
        sub = await js.subscribe("llmgw.>", stream=STREAM, ordered_consumer=True)
        assert (await control.js.stream_info(STREAM)).state.consumer_count == 1
        await sub.unsubscribe()
    finally:
        await reader.close()
        await control.close()


async def test_the_accounts_consumers_are_bounded(tmp_path):
    keys = keystore.Keystore(tmp_path / "creds", auth.AuthConfig(max_consumers=2)).init()
    server = NatsServer(tmp_path / "nats", free_port(), auth=keys).start()
    try:
        control = await _control(server)
        reader = await NatsBus.connect(server.url, creds=server.creds("projector"))
        try:
            subs = [await reader.js.subscribe("llmgw.>", stream=STREAM, ordered_consumer=True) for _ in range(2)]
            with pytest.raises(Exception, match="(?i)maximum consumers"):
                await reader.js.subscribe("llmgw.>", stream=STREAM, ordered_consumer=True)
            for sub in subs:
                await sub.unsubscribe()
        finally:
            await reader.close()
            await control.close()
    finally:
        server.stop()


async def test_the_memory_bus_too_counts_a_claimed_id_as_not_landed():
    from llmgw.bus.memory import MemoryBus

    bus = MemoryBus()
    squat = await bus.publish("llmgw.gw.g1.model.load", b"squat", msg_id="leader-1")
    ours = await bus.publish("llmgw.control.decided", b"ours", msg_id="leader-1", expect_control_seq=0)
    assert ours != squat and bus.log[ours - 1] == ("llmgw.control.decided", b"ours")
    assert await bus.publish("llmgw.control.decided", b"ours", msg_id="leader-1") == ours  # a retry: one event


async def test_a_gateway_squatting_on_the_control_planes_next_ids_does_not_freeze_it(auth_nats):
    """Finding 3 over a real control plane: a gateway keeps publishing under
    the id the plane will use next (read off its generator, which no one
    outside this process can), from before the plane's election on. The
    plane still gets elected and places the model an operator applied on the
    node that registered, each claimed id costing it one more publish."""
    from llmgw.agent.simulated import SimulatedAgent
    from llmgw.control.plane import ControlPlane

    from .scenario import model, until

    control = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("control"))
    await control.ensure_streams()
    gateway = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("gateway", "g1"))
    operator = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("operator"))
    node = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("agent", "n1"))
    plane = ControlPlane(control, tick=0.05)
    agent = SimulatedAgent(node, "n1", 1, loading_after=0.01, ready_after=0.01, heartbeat=0.2)
    stop = asyncio.Event()
    squatted: set[str] = set()

    async def squat() -> None:
        load = ev.ModelLoad(at=1.0, gateway="g1", model="m")
        while not stop.is_set():
            claimed = plane._msg_ids.peek()
            if claimed not in squatted:
                squatted.add(claimed)
                await gateway.publish(ev.subject_for(load), ev.encode(load), msg_id=claimed)
            await asyncio.sleep(0.005)

    squatter = asyncio.create_task(squat())
    await until(lambda: squatted)
    tasks = [asyncio.create_task(x.run(stop)) for x in (plane, agent)]
    try:
        applied = ev.ModelApplied(at=1.0, model=model("m"))
        await operator.publish(ev.subject_for(applied), ev.encode(applied), msg_id="apply-m")
        await until(lambda: [r.state for r in plane.state.replicas.values()] == ["ready"], timeout=20)
        assert plane.leading() and len(squatted) >= 2
    finally:
        stop.set()
        await asyncio.gather(*tasks, squatter)
        for bus in (gateway, operator, node, control):
            await bus.close()
