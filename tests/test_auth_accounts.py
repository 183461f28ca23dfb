"""Issue 35, finding 1: no reader of the log can make the server deliver
into a command subject. Tried over a real nats-server with auth on, as each
reader's credential (gateway, operator, projector): a push consumer that
delivers to `llmgw.cmd.<node>`, and JetStream API requests whose reply is
`llmgw.cmd.<node>`. The server does deliver them (it checks neither,
nats-server#8274), but a push consumer's into the llmgw account's subject of
that name and an answer into READERS': the agents are in NODES
(bus/accounts.py), and a subscriber holding the agent's credential sees
nothing, where the control plane's genuine command arrives. Likewise
nothing is written into the log or the buckets."""

from __future__ import annotations

import asyncio
import json

import nats
import pytest

from llmgw.bus import COMMAND_PREFIX, COMMAND_STREAM, ENGINE_KEYS_BUCKET, LEADER_BUCKET, STREAM, accounts, credentials, keystore, roles
from llmgw.bus.nats import NatsBus

from .test_auth import Speaker, _control

pytestmark = pytest.mark.timeout(60)

QUIET_S = 1.0  # how long the agent's subscriber listens for what must not come


async def _listen(server, role: str, name: str, *subjects: str) -> tuple[object, list]:
    """Subscriptions on `subjects` holding `role name`'s credential; what they receive."""
    got: list = []
    creds = server.creds(role, name) if role else str(server.auth.issue_unrestricted(server.store_dir / "harness.creds"))
    who = credentials.identity(creds, foreign_ok=True)
    nc = await nats.connect(server.url, user_credentials=creds, **({"inbox_prefix": who.inbox_prefix} if who else {}))

    async def cb(msg) -> None:
        got.append(msg.data)

    for subject in subjects:
        await nc.subscribe(subject, cb=cb)
    await nc.flush()
    return nc, got


READERS = {"gateway": "g1", "operator": None, "projector": None}


@pytest.mark.parametrize("role", list(READERS))
async def test_a_reader_cannot_make_the_server_deliver_into_a_command_subject(auth_nats, role):
    control = await _control(auth_nats)
    target = f"{COMMAND_PREFIX}.a"
    agent_nc, to_agent = await _listen(auth_nats, "agent", "a", target)
    # Where the push consumer's deliveries land: the llmgw account's subject
    # of that name (seen by an llmgw user), the command stream's copy's, not an agent's.
    llmgw_nc, in_llmgw = await _listen(auth_nats, None, "", target)
    reader = await Speaker.connect(auth_nats, role, READERS[role])
    try:
        # A command-shaped message in the log (the control plane's subjects
        # are the attacker's to read, not to write: published by it here).
        await control.publish("llmgw.control.x", b'{"command":"stop","shard":"m-1.0","generation":9}', msg_id="c1", expect_control_seq=0)
        node = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("agent", "a"))
        await node.put_engine_key("a.s.1", "k")  # something in a bucket for a direct get
        await node.close()
        attacks = [
            # a push consumer delivering the log into the command subject
            (f"$JS.API.CONSUMER.CREATE.{STREAM}", {"stream_name": STREAM, "config": {"deliver_subject": target, "ack_policy": "none", "deliver_policy": "all"}}),
            # stream message gets, their answer sent to the command subject
            (f"$JS.API.STREAM.MSG.GET.{STREAM}", {"seq": 1}),
            (f"$JS.API.DIRECT.GET.KV_{ENGINE_KEYS_BUCKET}", {"seq": 1}),
            (f"$JS.API.DIRECT.GET.KV_{LEADER_BUCKET}", {"seq": 1}),
            (f"$JS.API.STREAM.MSG.GET.{COMMAND_STREAM}", {"seq": 1}),
        ]
        perms = roles.permissions(role, READERS[role] or ("local" if role == "operator" else role))
        tried = 0
        for subject, body in attacks:
            if roles.may_publish(perms, subject):
                await reader.nc.publish(subject, json.dumps(body).encode(), reply=target)
                tried += 1
        await reader.nc.flush()
        assert tried >= 2, "the reader could try nothing: the test tries no attack"
        await asyncio.sleep(QUIET_S)
        assert to_agent == [], f"the {role}'s deliveries reached the agent: {to_agent}"
        assert in_llmgw, "the server delivered nothing at all: the attack was not made"
        # And the genuine command, through the control plane's NODES credential, arrives.
        await control.send_command("a", b'{"command":"reregister"}')
        for _ in range(100):
            if to_agent:
                break
            await asyncio.sleep(0.02)
        assert to_agent == [b'{"command":"reregister"}']
    finally:
        await reader.close()
        await agent_nc.close()
        await llmgw_nc.close()
        await control.close()


async def test_the_command_stream_keeps_a_copy_of_each_command(auth_nats):
    control = await _control(auth_nats)
    try:
        await control.send_command("a", b'{"command":"reregister"}')
        for _ in range(100):
            if (await control.js.stream_info(COMMAND_STREAM)).state.messages == 1:
                break
            await asyncio.sleep(0.02)
        msg = await control.js.get_msg(COMMAND_STREAM, 1)
        assert (msg.subject, msg.data) == (f"{COMMAND_PREFIX}.a", b'{"command":"reregister"}')
    finally:
        await control.close()


async def test_only_the_control_planes_commands_credential_publishes_commands(auth_nats):
    """In NODES, a command subject takes only the control plane's second
    credential: not a node's (to another or to itself), not a fleet simulator's."""
    for role, name in (("agent", "b"), ("fleet", "sim")):
        speaker = await Speaker.connect(auth_nats, role, name)
        try:
            for subject in (f"{COMMAND_PREFIX}.a", f"{COMMAND_PREFIX}.b"):
                await speaker.nc.publish(subject, b"{}")
                assert await speaker.refused("publish", subject), (role, subject)
        finally:
            await speaker.close()
    creds = auth_nats.creds("control")
    commands = accounts.commands_creds_path(creds)
    claims = credentials.jwt_claims(credentials.read_creds(commands)[0])
    assert claims["nats"]["pub"]["allow"] == [f"{COMMAND_PREFIX}.>"]
    assert claims["iss"] == credentials.jwt_claims(credentials.read_creds(auth_nats.creds("agent", "a"))[0])["iss"]  # both of NODES
    assert claims["iss"] != credentials.jwt_claims(credentials.read_creds(creds)[0])["iss"]


async def test_nodes_still_reach_the_log_heartbeats_and_their_engine_keys(auth_nats):
    control = await _control(auth_nats)
    agent = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("agent", "a"))
    try:
        await agent.ensure_streams()
        seq = await agent.publish("llmgw.agent.a.shard.status", b"{}", msg_id="f1")
        assert seq == 1 and await agent.publish("llmgw.agent.a.shard.status", b"{}", msg_id="f1") == 1
        await agent.beat("a", b'{"at":1}')
        await agent.put_engine_key("a.s.1", "secret")
        assert await agent.engine_key("a.s.1") == "secret"
        assert (await (await control.js.key_value("llmgw-heartbeats")).get("a")).value == b'{"at":1}'
    finally:
        await agent.close()
        await control.close()


def test_control_credentials_are_issued_listed_and_revoked_together(tmp_path):
    keys = keystore.Keystore(tmp_path / "creds").init()
    path = keys.issue("control")
    commands = accounts.commands_creds_path(path)
    assert commands.exists() and commands.name == "control-commands.creds"
    rows = [(r.role, r.account) for r in keys.issued()]
    assert rows == [("control", accounts.LLMGW), ("control", accounts.NODES)]
    assert keys.ensure("control") == path  # both there and live: kept
    keys.revoke("control", "control")
    assert not path.exists() and not commands.exists()
    revoked: dict[str, set] = {}
    for token in keys.server_conf().split('"')[1::2]:
        claims = credentials.jwt_claims(token)
        revoked[claims["name"]] = set(claims["nats"].get("revocations", {}))
    llmgw, nodes = keys.issued()
    assert llmgw.revoked and nodes.revoked
    assert revoked[keys.config.account_name] == {llmgw.public_key} and revoked[keys.config.nodes_account_name] == {nodes.public_key}


def test_a_node_credential_from_before_the_split_is_issued_again(tmp_path):
    """A key store of an older llmgw signed agents with the llmgw account key:
    `ensure` (what `llmgw up` and a local agent use) issues it again in NODES."""
    keys = keystore.Keystore(tmp_path / "creds").init()
    old = keys._user("agent", "a", roles.permissions("agent", "a"), accounts.LLMGW, keys.file_for("agent", "a"))
    keys._save([old])
    path = keys.ensure("agent", "a")
    claims = credentials.jwt_claims(credentials.read_creds(path)[0])
    assert claims["sub"] != old.public_key
    assert [r.account for r in keys.issued()] == [accounts.LLMGW, accounts.NODES]


@pytest.mark.parametrize("role", list(READERS))
async def test_a_reader_cannot_make_the_server_write_into_the_log_or_the_buckets(auth_nats, role):
    """The same server behaviour aimed at the log's own subjects: a
    JetStream API answer sent to a reply subject that a stream captures was
    stored there when the readers were users of the llmgw account (seen: a
    stream message get stored as node b's heartbeat and engine key and as a
    decision; a direct get of an engine key, raw bytes node a chose, as node
    b's fact). Readers are users of READERS now (bus/accounts.py): the
    answers land there, where nothing captures them."""
    from llmgw.bus import HEARTBEAT_BUCKET

    control = await _control(auth_nats)
    node = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("agent", "a"))
    reader = await Speaker.connect(auth_nats, role, READERS[role])
    targets = ("llmgw.control.decided", "llmgw.agent.b.node.registered", "llmgw.ctl.apikey.applied", "llmgw.gw.g2.model.load",
               f"$KV.{HEARTBEAT_BUCKET}.b", f"$KV.{ENGINE_KEYS_BUCKET}.b.s.1")  # fmt: skip
    try:
        await node.put_engine_key("a.s.1", '{"chosen":"by node a"}')
        await control.publish("llmgw.control.x", b'{"chosen":"by the control plane"}', msg_id="c1", expect_control_seq=0)
        before = await _stored(control)
        perms = roles.permissions(role, READERS[role] or ("local" if role == "operator" else role))
        tried = 0
        for api in (f"$JS.API.STREAM.MSG.GET.{STREAM}", f"$JS.API.DIRECT.GET.KV_{ENGINE_KEYS_BUCKET}", f"$JS.API.STREAM.INFO.{STREAM}"):
            if roles.may_publish(perms, api):
                for target in targets:
                    await reader.nc.publish(api, b'{"seq":1}', reply=target)
                    tried += 1
        for target in targets:  # push consumers delivering there
            config = {"deliver_subject": target, "ack_policy": "none", "deliver_policy": "all"}
            await reader.nc.publish(f"$JS.API.CONSUMER.CREATE.{STREAM}", json.dumps({"stream_name": STREAM, "config": config}).encode())
        await reader.nc.flush()
        assert tried >= len(targets)
        await asyncio.sleep(QUIET_S)
        assert await _stored(control) == before
    finally:
        await reader.close()
        await node.close()
        await control.close()


async def _stored(control: NatsBus) -> dict[str, int]:
    """How many messages each subject holds in the log and the buckets."""
    from llmgw.bus import HEARTBEAT_BUCKET

    stored: dict[str, int] = {}
    for stream in (STREAM, f"KV_{HEARTBEAT_BUCKET}", f"KV_{ENGINE_KEYS_BUCKET}"):
        stored.update((await control.js.stream_info(stream, subjects_filter=">")).state.subjects or {})
    return stored


async def test_a_gateway_cannot_make_the_server_deliver_a_nodes_log_request_or_test_hook(auth_nats):
    """The subjects that do cross into NODES (operators' log requests, the
    simulators' hooks) take a gateway's publish nowhere (its permissions),
    nor the server's deliveries and answers aimed there on its behalf."""
    control = await _control(auth_nats)
    fleet_nc, to_fleet = await _listen(auth_nats, "fleet", "sim", "llmgw.sim.*.>", "llmgw.agent-logs.*")
    gateway = await Speaker.connect(auth_nats, "gateway", "g1")
    try:
        await control.publish("llmgw.control.x", b"{}", msg_id="c1", expect_control_seq=0)
        for target in ("llmgw.sim.a.fail", "llmgw.sim.a.silence", "llmgw.agent-logs.a"):
            config = {"deliver_subject": target, "ack_policy": "none", "deliver_policy": "all"}
            await gateway.nc.publish(f"$JS.API.CONSUMER.CREATE.{STREAM}", json.dumps({"stream_name": STREAM, "config": config}).encode())
            await gateway.nc.publish(f"$JS.API.STREAM.MSG.GET.{STREAM}", b'{"seq":1}', reply=target)
            await gateway.nc.publish(target, b"a")
            assert await gateway.refused("publish", target)
        await asyncio.sleep(QUIET_S)
        assert to_fleet == []
        # (the subscriptions work: an operator's request arrives)
        operator = await Speaker.connect(auth_nats, "operator")
        await operator.nc.publish("llmgw.sim.a.fail", b"m-1.0")
        await operator.nc.flush()
        for _ in range(100):
            if to_fleet:
                break
            await asyncio.sleep(0.02)
        await operator.close()
        assert to_fleet == [b"m-1.0"]
    finally:
        await gateway.close()
        await fleet_nc.close()
        await control.close()


async def test_what_a_node_can_still_aim_at_another_node(auth_nats):
    """A node's own requests may name any reply subject. Aimed at the log's
    and the buckets' subjects (through NODES' imports), nothing is stored:
    an answer reaches only the requester's account's subscribers. Aimed at
    another node's command subject in NODES, it arrives: the answer to a
    direct get of its own engine key (bytes the node chose, with JetStream's
    Nats-Stream header) and a fact's ack. The command's signature is what
    refuses those (the agent's check); this test pins down that they come."""
    from llmgw.bus import HEARTBEAT_BUCKET

    control = await _control(auth_nats)
    a = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("agent", "a"))
    b_nc, to_b = await _listen(auth_nats, "agent", "b", f"{COMMAND_PREFIX}.b")
    try:
        await a.put_engine_key("a.s.1", '{"command":"stop"}')
        before = await _stored(control)
        own_key = f"$JS.API.DIRECT.GET.KV_{ENGINE_KEYS_BUCKET}.$KV.{ENGINE_KEYS_BUCKET}.a.s.1"
        for target in ("llmgw.agent.b.node.registered", "llmgw.control.decided", f"$KV.{HEARTBEAT_BUCKET}.b", f"$KV.{ENGINE_KEYS_BUCKET}.b.s.1"):
            await a.nc.publish(own_key, b"", reply=target)
        await a.nc.publish(own_key, b"", reply=f"{COMMAND_PREFIX}.b")
        await a.nc.flush()
        await asyncio.sleep(QUIET_S)
        assert await _stored(control) == before
        assert to_b == [b'{"command":"stop"}']
    finally:
        await b_nc.close()
        await a.close()
        await control.close()
