"""Who may speak: every forgery of issue 12, tried against a real nats-server
with auth on, is refused by the server and absent from the log.

The forgeries are published with plain nats-py (core publishes: had the
server let one through, the stream would have kept it), on a connection
that holds a real credential of another role or node."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import nats
import pytest

from llmgw.bus import COMMAND_PREFIX, HEARTBEAT_BUCKET, STREAM, read_log
from llmgw.bus import ENGINE_KEYS_BUCKET, auth, credentials, keystore, roles
from llmgw.bus.nats import NatsBus
from llmgw.core.contract import events as ev

pytestmark = pytest.mark.timeout(60)


class Speaker:
    """A raw nats-py connection as one credential, collecting the server's refusals."""

    def __init__(self, nc, errors: list) -> None:
        self.nc, self.errors = nc, errors

    @classmethod
    async def connect(cls, server, role: str, name: str | None = None) -> "Speaker":
        errors: list = []

        async def error_cb(e) -> None:
            errors.append(str(e))

        creds = server.creds(role, name)
        who = credentials.identity(creds)
        nc = await nats.connect(
            server.url, user_credentials=creds, inbox_prefix=who.inbox_prefix, error_cb=error_cb, allow_reconnect=False
        )
        return cls(nc, errors)

    async def refused(self, what: str, subject: str) -> bool:
        """Whether the server answered a publish or subscription with a permissions violation."""
        for _ in range(100):
            await self.nc.flush()
            if any("permissions violation" in e.lower() and what in e.lower() and subject.lower() in e.lower() for e in self.errors):
                return True
            await asyncio.sleep(0.02)
        return False

    async def close(self) -> None:
        await self.nc.close()


async def _control(server) -> NatsBus:
    bus = await NatsBus.connect(server.url, creds=server.creds("control"))
    await bus.ensure_streams()
    return bus


def _registered(node: str) -> bytes:
    gpus = [ev.Gpu(index=i, model="H100", memory_gb=80.0) for i in range(64)]
    return ev.encode(ev.NodeRegistered(at=1.0, node=node, gpus=gpus, memory_gb=2048, cpu_cores=256))


async def _subjects(bus: NatsBus) -> list[str]:
    return [subject for _, subject, _ in await read_log(bus)]


async def test_an_anonymous_connection_is_refused(auth_nats):
    with pytest.raises(Exception, match="Authorization Violation"):
        await nats.connect(auth_nats.url, allow_reconnect=False, max_reconnect_attempts=0)
    with pytest.raises(auth.CredentialRefused, match="anonymous"):
        await NatsBus.connect(auth_nats.url)


async def test_a_credential_of_another_fleet_is_refused(auth_nats, tmp_path):
    other = keystore.Keystore(tmp_path / "other").init()
    with pytest.raises(auth.CredentialRefused, match="agent a"):
        await NatsBus.connect(auth_nats.url, creds=str(other.issue("agent", "a")))


async def test_each_role_does_its_job(auth_nats):
    control = await _control(auth_nats)
    agent = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("agent", "a"))
    gateway = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("gateway", "g1"))
    operator = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("operator"))
    projector = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("projector"))
    try:
        await agent.ensure_streams()
        commands: list[bytes] = []
        follower = await agent.follow_commands("a", commands.append)
        await agent.publish("llmgw.agent.a.node.registered", _registered("a"), msg_id="r1")
        await agent.beat("a", b"{}")
        load = ev.ModelLoad(at=1.0, gateway="g1", model="m")
        await gateway.publish(ev.subject_for(load), ev.encode(load), msg_id="l1")
        removed = ev.ModelRemoved(at=1.0, name="m")
        await operator.publish(ev.subject_for(removed), ev.encode(removed), msg_id="o1")
        lost = ev.NodeLost(at=2.0, node="a", reason="test")
        await control.publish(ev.subject_for(lost), ev.encode(lost), msg_id="c1", expect_control_seq=0)
        await control.send_command("a", b'{"command":"reregister","reason":"test"}')
        beats: list[str] = []
        watch = await control.follow_heartbeats(beats.append)
        for _ in range(100):
            if commands and beats:
                break
            await asyncio.sleep(0.02)
        assert commands and beats == ["a"]
        await watch.stop()
        await follower.stop()
        for reader in (projector, operator, gateway):
            await reader.wait_for_streams(5)
            assert await _subjects(reader) == [
                "llmgw.agent.a.node.registered", "llmgw.gw.g1.model.load", "llmgw.ctl.model.removed", "llmgw.control.node.lost",
            ]  # fmt: skip
    finally:
        for b in (control, agent, gateway, operator, projector):
            await b.close()


async def test_the_forgeries_of_an_agent_are_refused_and_absent_from_the_log(auth_nats):
    control = await _control(auth_nats)
    a = await Speaker.connect(auth_nats, "agent", "a")
    try:
        decided = ev.Decided(at=1.0, basis=0, actions=[], leader="x")
        key = ev.ApiKeyApplied(at=1.0, name="k", owner="o", key_sha256="0" * 64)
        forgeries = {
            "llmgw.agent.b.node.registered": _registered("b"),  # as node b
            "llmgw.agent.b.shard.status": b"{}",
            "llmgw.control.decided": ev.encode(decided),  # as the control plane
            "llmgw.ctl.apikey.applied": ev.encode(key),  # as an operator
            f"{COMMAND_PREFIX}.b": b'{"command":"start"}',  # a command to another node
            f"{COMMAND_PREFIX}.a": b'{"command":"start"}',  # even to itself: commands are the control plane's
            f"$KV.{HEARTBEAT_BUCKET}.b": b"{}",  # a heartbeat for node b
        }
        for subject, data in forgeries.items():
            await a.nc.publish(subject, data)
            assert await a.refused("publish", subject), (subject, a.errors)
        # Reading: another node's commands, the log, another's inbox.
        for subject in (f"{COMMAND_PREFIX}.b", "llmgw.>", "_INBOX.>", f"$KV.{HEARTBEAT_BUCKET}.>"):
            await a.nc.subscribe(subject)
            assert await a.refused("subscription", subject), subject
        await a.nc.publish(f"$JS.API.CONSUMER.CREATE.{STREAM}", b"{}")
        assert await a.refused("publish", f"$JS.API.CONSUMER.CREATE.{STREAM}")
        assert await _subjects(control) == []
        kv = await control.js.key_value(HEARTBEAT_BUCKET)
        with pytest.raises(Exception):  # no forged heartbeat for b in the bucket
            await kv.get("b")
    finally:
        await a.close()
        await control.close()


FORBIDDEN = {
    # A gateway publishing an API key, speaking as another gateway, as an agent, commanding.
    ("gateway", "g1"): ["llmgw.ctl.apikey.applied", "llmgw.gw.g2.model.load", "llmgw.agent.a.shard.status", "llmgw.cmd.a"],
    ("operator", None): ["llmgw.control.decided", "llmgw.cmd.a", "llmgw.agent.a.node.registered", f"$JS.API.STREAM.DELETE.{STREAM}"],
    # The control plane runs the streams, but the log is forever.
    ("control", None): [
        f"$JS.API.STREAM.DELETE.{STREAM}", f"$JS.API.STREAM.PURGE.{STREAM}", f"$JS.API.STREAM.UPDATE.{STREAM}",
        f"$JS.API.STREAM.MSG.DELETE.{STREAM}", "llmgw.agent.a.shard.status",
    ],  # fmt: skip
    ("projector", None): ["llmgw.ctl.model.removed", "llmgw.control.decided", "llmgw.gw.x.model.load"],
}


@pytest.mark.parametrize("who", list(FORBIDDEN), ids=lambda w: w[0])
async def test_what_a_role_may_not_say_is_refused_and_absent_from_the_log(auth_nats, who):
    key = ev.ApiKeyApplied(at=1.0, name="k", owner="o", key_sha256="0" * 64)
    control = await _control(auth_nats)
    speaker = await Speaker.connect(auth_nats, *who)
    try:
        for subject in FORBIDDEN[who]:
            await speaker.nc.publish(subject, ev.encode(key))
            assert await speaker.refused("publish", subject), subject
        assert await _subjects(control) == []
        assert (await control.js.stream_info(STREAM)).config.name == STREAM  # not deleted
    finally:
        await speaker.close()
        await control.close()


async def test_the_bus_says_at_once_what_a_credential_may_not_publish(auth_nats):
    agent = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("agent", "a"))
    try:
        with pytest.raises(PermissionError, match="agent a .* may not publish on llmgw.agent.b.shard.status"):
            await agent.publish("llmgw.agent.b.shard.status", b"{}", msg_id="x")
    finally:
        await agent.close()


async def test_engine_keys_only_of_its_own_node_and_read_by_gateways(auth_nats):
    """The permission for part 4 (engine keys): agent N puts only keys N.>,
    reads back only those; gateways read all; other agents none."""
    control = await _control(auth_nats)  # makes the bucket (with direct gets)
    a = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("agent", "a"))
    b = await Speaker.connect(auth_nats, "agent", "b")
    gw = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("gateway", "g1"))
    try:
        akv = a._bucket(ENGINE_KEYS_BUCKET)
        await akv.put("a.shard-1", b"secret-a")
        # Read back through a direct get by subject, its own keys only.
        own = f"$JS.API.DIRECT.GET.KV_{ENGINE_KEYS_BUCKET}.$KV.{ENGINE_KEYS_BUCKET}.a.shard-1"
        assert (await a.nc.request(own, b"", timeout=5)).data == b"secret-a"
        gkv = await gw.js.key_value(ENGINE_KEYS_BUCKET)
        assert (await gkv.get("a.shard-1")).value == b"secret-a"
        await b.nc.publish(f"$KV.{ENGINE_KEYS_BUCKET}.a.shard-1", b"forged")
        assert await b.refused("publish", f"$KV.{ENGINE_KEYS_BUCKET}.a.shard-1")
        theirs = f"$JS.API.DIRECT.GET.KV_{ENGINE_KEYS_BUCKET}.$KV.{ENGINE_KEYS_BUCKET}.a.shard-1"
        await b.nc.publish(theirs, b"")
        assert await b.refused("publish", theirs)
        assert (await gkv.get("a.shard-1")).value == b"secret-a"
    finally:
        await b.close()
        for bus in (a, gw, control):
            await bus.close()


async def test_the_fast_reader_signs_in(auth_nats, monkeypatch):
    from llmgw.bus import catchup

    control = await _control(auth_nats)
    try:
        n = 1200
        for i in range(n):
            await control.js.publish("llmgw.control.x", b"{}", stream=STREAM)
        got: list[int] = []
        who = credentials.identity(auth_nats.creds("projector"))
        last = await catchup.read_range(
            auth_nats.url, STREAM, 1, n, lambda seq, s, d: got.append(seq), creds=who.path, inbox=who.inbox_prefix
        )
        assert last == n and got == list(range(1, n + 1))
        with pytest.raises(catchup.Unsupported):
            await catchup.read_range(auth_nats.url, STREAM, 1, n, lambda *a: None)
        # And NatsBus.follow, as the projector, takes the fast reader (signed in) for the stretch.
        real, read = catchup.read_range, []

        async def spy(*args, **kw):
            read.append(await real(*args, **kw))
            return read[-1]

        monkeypatch.setattr(catchup, "read_range", spy)
        projector = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("projector"))
        try:
            assert len(await read_log(projector)) == n and read == [n]
        finally:
            await projector.close()
    finally:
        await control.close()


async def test_a_revoked_credential_is_cut_off_and_refused(auth_nats, tmp_path):
    a = await Speaker.connect(auth_nats, "agent", "a")
    kept = tmp_path / "kept.creds"
    kept.write_text(open(auth_nats.creds("agent", "a")).read())
    keys = auth_nats.auth
    keys.revoke("agent", "a")
    auth_nats.reload()
    for _ in range(200):
        if not a.nc.is_connected:
            break
        await asyncio.sleep(0.02)
    assert not a.nc.is_connected, "the server kept the revoked connection"
    with pytest.raises(auth.CredentialRefused, match="agent a"):
        await NatsBus.connect(auth_nats.url, creds=str(kept))
    # A new credential for the same node is another key: accepted.
    fresh = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("agent", "a"))
    await fresh.close()
    assert [r.revoked for r in keys.issued() if r.role == "agent"] == [True, False]


def test_credential_files_are_private_and_nats_format(auth_nats):
    path = auth_nats.creds("agent", "a")
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    for f in auth_nats.auth.keys_dir.iterdir():
        assert oct(os.stat(f).st_mode & 0o777) == "0o600"
    jwt, seed = credentials.read_creds(path)
    assert seed.startswith("SU") and credentials.jwt_claims(jwt)["nats"]["pub"]["allow"][0] == "llmgw.agent.a.>"
    with pytest.raises(auth.CredentialError, match="not a NATS .creds"):
        bad = auth_nats.store_dir / "bad.creds"
        bad.write_text("hello")
        credentials.identity(bad)


def test_a_component_with_a_refused_credential_says_so_and_exits_3(auth_nats, tmp_path):
    other = keystore.Keystore(tmp_path / "other").init()
    creds = other.issue("agent", "a")
    env = {**os.environ, "LLMGW_CREDS": ""}
    out = subprocess.run(
        [sys.executable, "-m", "llmgw", "control", "--nats", auth_nats.url, "--creds", str(other.issue("control")), "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 3, out.stderr
    assert "refused the credential of control control" in out.stderr and "llmgw creds issue" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "llmgw", "agent", "--simulate", "--name", "b", "--nats", auth_nats.url, "--creds", str(creds)],
        capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 3 and "credential of agent a, not of b" in out.stderr, out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "llmgw", "replay", "--nats", auth_nats.url],
        capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 3 and "anonymous" in out.stderr, out.stderr


def test_permissions_match_the_servers_rule():
    perms = roles.permissions("agent", "a")
    assert roles.may_publish(perms, "llmgw.agent.a.shard.status")
    assert not roles.may_publish(perms, "llmgw.agent.ab.shard.status")
    assert not roles.may_publish(perms, "llmgw.agent.a")
    assert roles.may_publish(perms, f"$KV.{HEARTBEAT_BUCKET}.a") and not roles.may_publish(perms, f"$KV.{HEARTBEAT_BUCKET}.b")
    control = roles.permissions("control", "control")
    assert roles.may_publish(control, "$JS.API.STREAM.CREATE.LLMGW")
    assert not roles.may_publish(control, "$JS.API.STREAM.DELETE.LLMGW")
    with pytest.raises(auth.CredentialError):
        roles.permissions("agent", "a.b")
    with pytest.raises(auth.CredentialError):
        roles.permissions("root", "x")


def _fold(server) -> "object":
    from llmgw.core.folding.fold import apply
    from llmgw.core.folding.state import State

    async def fetch():
        bus = await NatsBus.connect(server.url, creds=server.creds("operator"))
        try:
            return await read_log(bus)
        finally:
            await bus.close()

    state = State()
    for seq, subject, data in asyncio.run(fetch()):
        apply(state, seq, subject, data)
    return state


def _until(predicate, timeout: float, why) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, why()
        time.sleep(0.2)


def test_a_revoked_node_is_cut_off_exits_3_and_is_lost(auth_nats, processes, tmp_path):
    """`llmgw creds revoke agent a`: the server drops the agent and refuses it;
    the agent says so and exits 3; the control plane declares the node lost
    ("credential revoked") and its replica is placed on the other node."""
    state_dir = tmp_path / "control"
    url = auth_nats.url
    processes.start("control", "control", "--nats", url, "--creds", auth_nats.creds("control"), "--state-dir", str(state_dir))
    agents = {}
    for n in ("a", "b"):
        agents[n] = processes.start(n, "agent", "--simulate", "--name", n, "--gpus", "1", "--nats", url, "--creds", auth_nats.creds("agent", n))
    catalog = tmp_path / "c.yaml"
    catalog.write_text("models:\n  - name: m\n    profiles: [{name: p, gpus: 1}]\n")
    tools = ("--nats", url, "--creds", auth_nats.creds("operator"))
    from .conftest import run_llmgw

    out = run_llmgw("ctl", *tools, "apply", "-f", str(catalog), cwd=tmp_path)
    assert out.returncode == 0, out.stderr

    def ready_on():
        st = _fold(auth_nats)
        return {s.node for r in st.replicas.values() if r.state == "ready" for s in r.shards}

    _until(lambda: ready_on() in ({"a"}, {"b"}), 30, lambda: processes.log("control"))
    (victim,) = ready_on()
    other = "b" if victim == "a" else "a"
    out = run_llmgw("creds", "revoke", "agent", victim, "--dir", str(auth_nats.auth.folder), *tools, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "the local NATS reloaded" in out.stdout and "recorded in the log" in out.stdout
    agents[victim].wait(30)
    assert agents[victim].returncode == 3, processes.log(victim)
    assert f"NATS refused the credential of agent {victim}" in processes.log(victim)
    _until(lambda: _fold(auth_nats).nodes[victim].state == "lost", 30, lambda: processes.log("control"))
    st = _fold(auth_nats)
    assert st.nodes[victim].reason == "credential revoked"
    assert f"node {victim} lost: credential revoked" in processes.log("control")
    _until(lambda: ready_on() == {other}, 30, lambda: processes.log("control"))
    listed = run_llmgw("creds", "list", "--json", "--dir", str(auth_nats.auth.folder), cwd=tmp_path)
    rows = {(r["role"], r["name"]): r for r in json.loads(listed.stdout)}
    assert rows[("agent", victim)]["revoked_at"] > 0 and rows[("agent", other)]["revoked_at"] == 0


@pytest.mark.parametrize("role", ["operator", "projector", "console", "agent"])
async def test_stored_responses_are_put_and_read_by_gateways_only(auth_nats, role):
    """The stored responses of /v1/responses (LLMGW_RESPONSES): gateways put and
    get them by key; no other role reads or writes a byte of them."""
    from llmgw.bus import RESPONSES_BUCKET

    control = await _control(auth_nats)  # makes the bucket
    g1 = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("gateway", "g1"))
    g2 = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("gateway", "g2"))
    other = await Speaker.connect(auth_nats, role, "x" if role in ("agent", "console", "operator") else None)
    try:
        await g1.put_stored("local.resp_1", b"kept")
        assert await g2.get_stored("local.resp_1") == b"kept"  # another gateway finds it
        assert await g2.get_stored("local.resp_2") is None
        put = f"$KV.{RESPONSES_BUCKET}.local.resp_1"
        await other.nc.publish(put, b"forged")
        assert await other.refused("publish", put)
        get = f"$JS.API.DIRECT.GET.KV_{RESPONSES_BUCKET}.$KV.{RESPONSES_BUCKET}.local.resp_1"
        await other.nc.publish(get, b"")
        assert await other.refused("publish", get)
        listing = f"$JS.API.CONSUMER.CREATE.KV_{RESPONSES_BUCKET}"
        gw_raw = await Speaker.connect(auth_nats, "gateway", "g3")  # not even a gateway lists them
        try:
            await gw_raw.nc.publish(listing, b"{}")
            assert await gw_raw.refused("publish", listing)
        finally:
            await gw_raw.close()
        assert await g1.get_stored("local.resp_1") == b"kept"
    finally:
        await other.close()
        for bus in (g1, g2, control):
            await bus.close()


async def test_prefix_hints_are_told_by_gateways_only_each_as_itself(auth_nats):
    """The gateways' prefix hints (gateway/hints.py, core NATS): gateway G
    publishes on llmgw.hint.G only, gateways alone hear them; an agent, an
    operator, the projector, the console, or a gateway speaking as another, is refused."""
    from llmgw.bus import HINTS_PREFIX

    g1 = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("gateway", "g1"))
    g2 = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("gateway", "g2"))
    heard: list = []
    sub = await g2.follow_hints(lambda gateway, data: heard.append((gateway, data)))
    await g2.nc.flush()  # the server has the subscription before anything is told
    try:
        await g1.hint("g1", b"told")
        for _ in range(100):
            if heard:
                break
            await asyncio.sleep(0.02)
        assert heard == [("g1", b"told")]
        forgers = [("gateway", "g3", f"{HINTS_PREFIX}.g1"), ("agent", "a", f"{HINTS_PREFIX}.g1"), ("operator", "x", f"{HINTS_PREFIX}.g1"),
                   ("projector", None, f"{HINTS_PREFIX}.g1"), ("console", "x", f"{HINTS_PREFIX}.g1")]  # fmt: skip
        for role, name, subject in forgers:
            speaker = await Speaker.connect(auth_nats, role, name)
            try:
                await speaker.nc.publish(subject, b"forged")
                assert await speaker.refused("publish", subject), (role, subject)
                if role != "gateway":  # nor may they listen
                    await speaker.nc.subscribe(f"{HINTS_PREFIX}.*")
                    assert await speaker.refused("subscription", f"{HINTS_PREFIX}.*"), role
            finally:
                await speaker.close()
        await asyncio.sleep(0.1)
        assert heard == [("g1", b"told")]  # no forgery arrived
    finally:
        await sub.unsubscribe()
        await g1.close()
        await g2.close()
