"""Simulated nodes as processes (`llmgw agent --simulate`) under `llmgw up`
(issue 34): they take no profile of a real engine unless the catalog lets it
run simulated, a node given --engine-ports registers that range and its
engines listen on the ports placement gave them, and `llmgw ctl describe`
shows the port each replica really listens on."""

from __future__ import annotations

import json
import socket
import time

import pytest

from .conftest import engine_ports, run_llmgw
from .test_ctl_e2e import Up, ctl

pytestmark = [pytest.mark.nats, pytest.mark.timeout(180)]

CATALOG = """\
models:
  - name: chat
    min_replicas: 2
    profiles: [{name: one, gpus: 1}]
  - name: embed
    profiles: [{name: cpu, engine: llama.cpp, gpus: 0, model: smollm2}]
  - name: embed-sim
    profiles: [{name: cpu, engine: llama.cpp, gpus: 0, model: smollm2, simulate: true}]
"""


def wait_json(up: Up, check, *args: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        out = ctl(up, *args, "-o", "json")
        if out.returncode == 0:
            data = json.loads(out.stdout)
            if check(data):
                return data
        assert time.monotonic() < deadline, f"`ctl {' '.join(args)}` never showed it: {out.stdout or out.stderr}"
        time.sleep(0.3)


def listens(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_simulated_nodes_take_no_real_engine_and_say_the_ports_their_replicas_listen_on(tmp_path, processes):
    up = Up(tmp_path)
    try:
        ports = engine_ports()
        first, last = map(int, ports.split("-"))
        processes.start("gpu-1", "agent", "--simulate", "--name", "gpu-1", "--gpus", "4", "--nats", up.url,
                        "--engine-ports", ports, env=up.env)  # fmt: skip
        processes.start("gpu-2", "agent", "--simulate", "--name", "gpu-2", "--gpus", "4", "--nats", up.url, env=up.env)
        wait_json(up, lambda rows: sorted(n["name"] for n in rows if n["state"] == "ready") == ["gpu-1", "gpu-2"], "get", "nodes")
        catalog = tmp_path / "catalog.yaml"
        catalog.write_text(CATALOG)
        applied = ctl(up, "apply", "-f", str(catalog))
        assert applied.returncode == 0, applied.stderr

        def ready(rows) -> bool:
            return sorted(r["id"] for r in rows if r["state"] == "ready") == ["chat-1", "chat-2", "embed-sim-1"]

        rows = wait_json(up, ready, "get", "replicas")
        assert not any(r["model"] == "embed" for r in rows)  # a real engine: on no simulated node
        embed = wait_json(up, lambda d: "waiting" in json.dumps(d) and "engine" in json.dumps(d), "describe", "model", "embed")
        assert "engine: needs a node that runs llama.cpp, has a simulated one" in json.dumps(embed)

        seen = {}
        for rid in ("chat-1", "chat-2"):
            page = json.loads(ctl(up, "describe", "replica", rid, "-o", "json").stdout)
            shard = page["replica"]["shards"][0]
            endpoint_port = int(shard["endpoint"].rsplit(":", 1)[1])
            assert listens(endpoint_port)
            text = ctl(up, "describe", "replica", rid).stdout
            row = next(line.split() for line in text.splitlines() if line.strip().startswith(f"{rid}.0"))
            assert row[4] == str(endpoint_port), text  # PORT: the one it listens on
            seen[shard["node"]] = (shard["port"], endpoint_port)
        # Given --engine-ports: its range registered, and the engine on the very port placement gave it.
        given, listening = seen["gpu-1"]
        assert first <= given <= last and listening == given
        # Without: a port the system picked, which describe shows rather than the one numbered.
        assert seen["gpu-2"][1] not in range(first, last + 1)
    finally:
        up.stop()


def test_a_fleet_given_engine_ports_must_not_serve_on_them(tmp_path):
    out = run_llmgw("agent", "--simulate", "--fleet", "3", "--engine-ports", engine_ports(), "--nats", "nats://127.0.0.1:1",
                    cwd=tmp_path)  # fmt: skip
    assert out.returncode == 2 and "--engine-ports with a fleet needs --no-serve" in out.stderr, out.stderr
