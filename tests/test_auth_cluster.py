"""The shipped cluster configuration (deploy/nats/cluster-*.conf), run as
written but on loopback ports: three servers, auth from `llmgw creds init`,
TLS from deploy/nats/make-certs.sh with a CA this test makes. Anonymous and
plain-text clients are refused; the components' credentials work over TLS
and the log is an R3 stream across the three."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import time

import pytest

from llmgw.bus import STREAM, read_log
from llmgw.bus import auth, keystore
from llmgw.bus.nats import NatsBus
from llmgw.bus.server import free_port, nats_server_binary

from .conftest import REPO

pytestmark = [pytest.mark.timeout(40), pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")]


def _conf(n: int, tmp_path, client: dict, route: dict) -> str:
    text = (REPO / "deploy" / "nats" / f"cluster-{n}.conf").read_text()
    text = text.replace("/etc/llmgw/tls", str(tmp_path / "tls")).replace("/var/lib/llmgw/nats", str(tmp_path / f"n{n}" / "js"))
    # The clients' listen is the top-level one, the routes' the cluster block's (indented): whatever ports the file says.
    text = re.sub(r"^listen: \S+", f"listen: 127.0.0.1:{client[n]}", text, flags=re.M)
    text = re.sub(r"^(\s+)listen: \S+", lambda m: f"{m.group(1)}listen: 127.0.0.1:{route[n]}", text, flags=re.M)
    text = re.sub(r"http: \S+\n", "", text)  # no monitoring port
    return re.sub(r"nats://nats-(\d)\.example\.internal:\d+", lambda m: f"nats://127.0.0.1:{route[int(m.group(1))]}", text)


@pytest.fixture
def cluster(tmp_path):
    subprocess.run([str(REPO / "deploy" / "nats" / "make-certs.sh"), str(tmp_path / "tls"), "nats-1", "nats-2", "nats-3"],
                   check=True, capture_output=True)  # fmt: skip
    keys = keystore.Keystore(tmp_path / "creds").init()
    client = {n: free_port() for n in (1, 2, 3)}
    route = {n: free_port() for n in (1, 2, 3)}
    procs = []
    try:
        for n in (1, 2, 3):
            folder = tmp_path / f"n{n}"
            folder.mkdir()
            shutil.copy(keys.server_conf_path, folder / "auth.conf")
            (folder / "nats.conf").write_text(_conf(n, tmp_path, client, route))
            log = open(folder / "log", "wb")
            procs.append(subprocess.Popen([nats_server_binary(), "-c", str(folder / "nats.conf")], stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip
        for n in (1, 2, 3):
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection(("127.0.0.1", client[n]), timeout=0.5).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline and procs[n - 1].poll() is None, (tmp_path / f"n{n}" / "log").read_text()
                    time.sleep(0.1)
        yield keys, client
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def test_the_shipped_cluster_config_runs_with_auth_and_tls(cluster, tmp_path, monkeypatch):
    keys, client = cluster
    tls = {n: f"tls://127.0.0.1:{p}" for n, p in client.items()}
    # No CA given: the servers' certificates are not trusted, and it says so.
    with pytest.raises(ConnectionError, match="LLMGW_NATS_CA"):
        await NatsBus.connect(tls[1], creds=str(keys.ensure("control")))
    monkeypatch.setenv(auth.CA_ENV, str(tmp_path / "tls" / "ca.pem"))
    with pytest.raises(auth.CredentialRefused, match="anonymous"):
        await NatsBus.connect(tls[1])
    for n in (1, 2, 3):  # no plain text: every server asks for TLS and a credential
        with socket.create_connection(("127.0.0.1", client[n]), timeout=5) as s:
            info = json.loads(s.recv(4096)[5:])
        assert info["tls_required"] and info["auth_required"]

    control = await NatsBus.connect(",".join(tls.values()), creds=str(keys.ensure("control")), replicas=3)
    agent = await NatsBus.connect(tls[2], creds=str(keys.ensure("agent", "n1")))
    operator = await NatsBus.connect(tls[3], creds=str(keys.ensure("operator")))
    try:
        deadline = time.monotonic() + 60
        while True:  # the JetStream meta leader is elected a moment after the routes form
            try:
                await control.ensure_streams()
                break
            except Exception:
                assert time.monotonic() < deadline, "no JetStream cluster formed"
                await asyncio.sleep(0.5)
        info = await control.js.stream_info(STREAM)
        assert info.config.num_replicas == 3 and len(info.cluster.replicas or []) == 2
        await agent.publish("llmgw.agent.n1.node.registered", b"{}", msg_id="r1")
        with pytest.raises(PermissionError):
            await agent.publish("llmgw.agent.n2.node.registered", b"{}", msg_id="r2")
        await operator.wait_for_streams(10)
        assert [s for _, s, _ in await read_log(operator)] == ["llmgw.agent.n1.node.registered"]
    finally:
        for b in (control, agent, operator):
            await b.close()
