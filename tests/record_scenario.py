"""Records `events/logs/fleet-day.jsonl`: a day in a small simulated fleet,
over a real nats-server, with every component a process of its own.

    python -m tests.record_scenario events/logs/fleet-day.jsonl

Three nodes join; a catalog is applied; a shard fails and is replaced; a
malformed message arrives and is quarantined; a node dies (kill -9 of its
agent) and is lost, its replicas moved; a model is scaled down; another is
deleted and its replicas stop. `tests/test_recorded_logs.py` replays and
verifies the result against the current policy, so it is re-recorded when the
contract grows or a rule of `decide` changes (the old file, replayed with
`llmgw replay --verify`, shows what the new rules would have done instead).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import nats

from llmgw.bus.server import NatsServer, free_port

from .conftest import REPO, Processes, run_llmgw
from .test_e2e_nats import wait_for


def main(out: str) -> None:
    tmp = Path(tempfile.mkdtemp())
    server = NatsServer(tmp / "nats", free_port()).start()
    procs = Processes(tmp)
    url = server.url
    try:
        procs.start("control", "control", "--nats", url, "--state-dir", str(tmp / "state"), "--node-grace", "3")
        agents = {
            name: procs.start(name, "agent", "--simulate", "--name", name, "--gpus", "8", "--ready-after", "0.3", "--nats", url)
            for name in ("gpu-1", "gpu-2", "gpu-3")
        }
        wait_for(url, lambda s: len(s.nodes) == 3)
        run_llmgw("ctl", "--nats", url, "apply", "-f", str(REPO / "deploy" / "catalog.example.yaml"))
        state = wait_for(url, lambda s: len(s.replicas) == 5 and all(r.state == "ready" for r in s.replicas.values()))

        async def disturb():
            nc = await nats.connect(url)
            shard = state.replicas["qwen-8b-1"].shards[0]
            await nc.request(f"llmgw.sim.{shard.node}.fail", shard.id.encode(), timeout=5)
            await nc.jetstream().publish("llmgw.agent.gpu-1.status", b"{not json", headers={"Nats-Msg-Id": "junk-1"})
            await nc.close()

        asyncio.run(disturb())
        wait_for(url, lambda s: "qwen-8b-1" not in s.replicas and sum(r.state == "ready" for r in s.replicas.values()) == 5)
        procs.kill9(agents["gpu-2"])
        wait_for(url, lambda s: s.nodes["gpu-2"].state == "lost", timeout=30)
        wait_for(url, lambda s: len(s.replicas) == 5 and all(r.state == "ready" for r in s.replicas.values()))
        smaller = tmp / "smaller.yaml"
        smaller.write_text(
            (REPO / "deploy" / "catalog.example.yaml").read_text().replace("min_replicas: 3", "min_replicas: 1")
        )
        run_llmgw("ctl", "--nats", url, "apply", "-f", str(smaller))
        wait_for(url, lambda s: sum(r.model == "qwen-8b" for r in s.replicas.values()) == 1)
        run_llmgw("ctl", "--nats", url, "delete", "model", "llama-70b")
        wait_for(url, lambda s: not any(r.model == "llama-70b" for r in s.replicas.values()))
        time.sleep(1)
        result = run_llmgw("replay", "--nats", url, "--export", out)
        print(result.stderr.strip())
    finally:
        procs.stop_all()
        server.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(REPO / "events" / "logs" / "fleet-day.jsonl"))
