"""A fleet that rides out NATS trouble (issue 13): a bus outage is not node
loss, `llmgw up` restarts its nats-server, and operator commands say what
the trouble is (never that the streams do not exist when they do)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from llmgw.bus import BusUnavailable
from llmgw.bus.nats import NatsBus
from llmgw.bus.nats_trouble import is_trouble, stream_missing
from llmgw.bus.server import NatsServer, free_port

from . import chaos_fleet as cf
from .test_up import pid_alive, start_up

pytestmark = pytest.mark.nats


def test_what_is_trouble_and_what_is_a_missing_stream():
    assert is_trouble(ServiceUnavailableError(code=503, description="no responders"))
    assert is_trouble(APIError(code=500, err_code=10008, description="JetStream system temporarily unavailable"))
    assert is_trouble(asyncio.TimeoutError())
    missing = NotFoundError(code=404, err_code=10059, description="stream not found")
    assert stream_missing(missing) and not is_trouble(missing)


async def test_wait_for_streams_says_missing_only_when_they_are(tmp_path):
    with NatsServer(tmp_path / "nats", free_port()) as server:
        bus = await NatsBus.connect(server.url)
        try:
            with pytest.raises(TimeoutError, match="do not exist"):
                await bus.wait_for_streams(timeout=0.5)
        finally:
            await bus.close()
        # Made, then the server goes: the answer is that the bus is unreachable.
        bus = await NatsBus.connect(server.url)
        await bus.ensure_streams()
        server.stop()
        try:
            with pytest.raises(BusUnavailable, match="electing a stream leader, or is unreachable"):
                await bus.wait_for_streams(timeout=1.0)
        finally:
            await bus.close()


def test_a_nats_outage_longer_than_the_grace_declares_no_node_lost(tmp_path):
    """NATS killed (kill -9) for longer than the node grace, then back on the
    same store: every component reconnects by itself, no node is lost, and
    the control plane leads again (a new term: its lease expired meanwhile)."""
    port = free_port()
    server = NatsServer(tmp_path / "nats", port).start()
    fleet = cf.Fleet(tmp_path / "fleet", server.url)
    try:
        fleet.control("control", lease_ttl=2.0, node_grace=2.0)
        fleet.projector()  # `ctl apply` returns once the read models include the change
        for name in ("gpu-1", "gpu-2"):
            fleet.agent(name, gpus=2)
        assert fleet.apply(cf.catalog(2)).returncode == 0
        cf.wait_until("2 replicas ready", lambda: cf.ready_count(server.url) == 2, 60)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
        time.sleep(5.0)  # 2.5 graces without a heartbeat anyone could read
        server.start()
        cf.wait_until("a leader again", lambda: cf.leader_now(fleet), 30)
        time.sleep(5.0)  # 2.5 graces with the bus healthy: a lost node would be declared by now
        recs = cf.records(server.url)
        s = cf.story(recs)
        assert s.nodes_lost == []
        assert cf.ready_count(server.url) == 2
        assert [e[1] for e in s.elections] == [1, 2]
        assert "heartbeats cannot be read" in fleet.log("control")
        for name in ("gpu-1", "gpu-2", "control"):
            assert fleet.procs[name].poll() is None, fleet.log(name)[-2000:]
        # The heartbeats are read again, not only waited for: the bucket
        # (in memory, gone with the server) was made again and followed
        # from its start, so a node that goes silent now is declared lost.
        assert "heartbeat bucket was missing" in fleet.log("control")
        os.kill(fleet.procs["gpu-2"].pid, signal.SIGKILL)
        cf.wait_until("gpu-2 lost", lambda: [n.split(":")[0] for n in cf.story(cf.records(server.url)).nodes_lost] == ["gpu-2"], 30)
    finally:
        fleet.stop()
        server.stop()


async def test_a_heartbeat_bucket_on_disk_is_made_again_in_memory(tmp_path):
    """An older llmgw kept heartbeats on disk (2,000 fsynced stores a second
    at 2,000 nodes); the control plane's next start keeps them in memory."""
    from nats.js.api import KeyValueConfig, StorageType

    from llmgw.bus import HEARTBEAT_BUCKET

    with NatsServer(tmp_path / "nats", free_port()) as server:
        bus = await NatsBus.connect(server.url)
        try:
            await bus.js.create_key_value(KeyValueConfig(bucket=HEARTBEAT_BUCKET, history=1, storage=StorageType.FILE))
            await bus.ensure_streams()
            info = await bus.js.stream_info(f"KV_{HEARTBEAT_BUCKET}")
            assert info.config.storage == StorageType.MEMORY
            await bus.beat("gpu-1", b"{}")
            assert (await (await bus.js.key_value(HEARTBEAT_BUCKET)).get("gpu-1")).value == b"{}"
        finally:
            await bus.close()


def test_llmgw_up_restarts_its_nats_server_after_kill_9(tmp_path):
    port = free_port()
    proc, lines = start_up(tmp_path, port)
    try:
        text = "".join(lines)
        nats_pid = int(text.split("(pid ", 1)[1].split(")", 1)[0])
        os.kill(nats_pid, signal.SIGKILL)
        said = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            said.append(line)
            if "NATS started again" in line:
                break
        out = "".join(said)
        assert "NATS exited with -9; starting it again" in out and "NATS started again" in out, out
        assert not pid_alive(nats_pid)
        # The fleet is back without a person: an operator command works.
        catalog = tmp_path / "c.yaml"
        catalog.write_text(cf.catalog(0))
        def apply():
            r = subprocess.run(
                [sys.executable, "-m", "llmgw", "ctl", "--nats", f"nats://127.0.0.1:{port}",
                 "--creds", str(tmp_path / "state" / "creds" / "operator.creds"),
                 "--db", str(tmp_path / "state" / "readmodels.db"), "apply", "-f", str(catalog)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            return r if r.returncode == 0 else None

        got = cf.wait_until("ctl apply after the restart", apply, 60)
        assert "model m created" in got.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_cluster_losing_its_stream_leader_mid_burst_loses_nothing_and_recovers_by_itself(tmp_path):
    """3 nats-servers (deploy/nats/ configs, R3 streams): kill -9 of the
    server leading the log's stream while operators apply: every apply that
    was acknowledged is in the log, no node is declared lost, and every
    component goes on by itself (a leader, new replicas placed and ready)."""
    nats = cf.Cluster(tmp_path / "nats").start()
    fleet = cf.Fleet(tmp_path / "fleet", nats.url)
    try:
        for i in range(2):
            fleet.control(f"control-{i}", replicas=3)
        cf.wait_until("a leader", lambda: fleet.ctl("get", "leader").returncode == 0, 60)
        for name in ("gpu-1", "gpu-2"):
            fleet.agent(name, gpus=4)
        fleet.projector()  # `ctl apply` returns once the read models include the change
        assert fleet.apply(cf.catalog(2)).returncode == 0
        cf.wait_until("2 ready", lambda: cf.ready_count(nats.url) == 2, 60)
        victim = nats.stream_leader("LLMGW")
        acked, refused = [], []
        for i in range(6):
            if i == 2:
                nats.kill9(victim)
            out = fleet.apply(cf.catalog(0, name=f"burst-{i}"))
            if out.returncode == 0:
                acked += [int(x) for x in re.findall(r"\(event (\d+)\)", out.stdout)]
            else:
                refused.append(out.stderr)
        for why in refused:  # a refusal says what the trouble is
            assert "electing a stream leader, or is unreachable" in why and "do not exist" not in why, why
        assert fleet.apply(cf.catalog(3)).returncode == 0
        cf.wait_until("3 ready after", lambda: cf.ready_count(nats.url) == 3, 60)
        recs = cf.records(nats.url)
        assert set(acked) <= {seq for seq, _, _ in recs}
        assert cf.story(recs).nodes_lost == []
        assert cf.leader_now(fleet) is not None
        for name, proc in fleet.procs.items():
            assert proc.poll() is None, fleet.log(name)[-2000:]
    finally:
        fleet.stop()
        nats.stop()
