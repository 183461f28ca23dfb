"""Records `events/logs/contention.jsonl`: two classes of model and two
owners contending for a small simulated fleet, over a real nats-server.

    python -m tests.record_contention events/logs/contention.jsonl

Two nodes of four GPUs join. The catalog `events/logs/contention.catalog.yaml`
is applied in two steps: an opportunistic batch model of research fills all
eight GPUs (four past research's guarantee) and is ready; then the critical
judge of product, which fits nowhere, waits for the batch replicas' minimum
lifetime (10 s in that catalog's policy), then preempts two of them (taken
back from what research borrowed), and is placed and ready. Then the judge is restarted
(no room beside it: in place). `tests/test_whatif.py` decides this history
again under other policies and catalogs (`llmgw replay --what-if`).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from llmgw.bus.nats import NatsBus
from llmgw.bus.server import NatsServer, free_port
from llmgw.core.contract import events as ev
from llmgw.ctl.catalog_file import load_catalog

from .conftest import REPO, Processes, run_llmgw
from .test_e2e_nats import wait_for

CATALOG = REPO / "events" / "logs" / "contention.catalog.yaml"


async def publish(url: str, event: ev.Event) -> None:
    bus = await NatsBus.connect(url)
    try:
        await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=f"record-{ev.tag_of(type(event))}")
    finally:
        await bus.close()


def main(out: str) -> None:
    tmp = Path(tempfile.mkdtemp())
    server = NatsServer(tmp / "nats", free_port()).start()
    procs = Processes(tmp)
    url = server.url
    try:
        procs.start("control", "control", "--nats", url, "--state-dir", str(tmp / "state"))
        for name in ("gpu-1", "gpu-2"):
            procs.start(name, "agent", "--simulate", "--name", name, "--gpus", "4", "--ready-after", "0.3", "--nats", url)
        wait_for(url, lambda s: len(s.nodes) == 2)
        # First everything but the judge (ctl apply), and the batch placed
        # and ready; then the judge, at once (published as ctl apply would:
        # its process takes seconds to start here), while the batch replicas
        # are within their minimum lifetime.
        text = CATALOG.read_text()
        first = tmp / "without-judge.yaml"
        first.write_text(text[: text.index("  - name: judge")])
        result = run_llmgw("ctl", "--nats", url, "apply", "-f", str(first))
        assert result.returncode == 0, result.stderr
        wait_for(url, lambda s: sum(r.model == "batch" and r.state == "ready" for r in s.replicas.values()) == 8)
        judge_spec = next(m for m in load_catalog(CATALOG).models if m.name == "judge")
        asyncio.run(publish(url, ev.ModelApplied(at=time.time(), model=judge_spec)))
        judge_ready = lambda s: any(r.model == "judge" and r.state == "ready" for r in s.replicas.values())  # noqa: E731
        state = wait_for(url, judge_ready, timeout=60)
        assert any(r.preempted_for == "judge" for r in state.replicas.values()) or len(
            [r for r in state.replicas.values() if r.model == "batch"]) < 8
        judge = next(r.id for r in state.replicas.values() if r.model == "judge" and r.state == "ready")
        time.sleep(1)
        # As `ctl restart` publishes it (which reads read models this run has not).
        asyncio.run(publish(url, ev.ReplicasRestart(at=time.time(), replicas=[judge])))
        wait_for(url, lambda s: judge not in s.replicas and judge_ready(s), timeout=60)
        time.sleep(12)  # the hold ends (10 s): batch tries again, and waits for room
        result = run_llmgw("replay", "--nats", url, "--export", out)
        print(result.stderr.strip())
    finally:
        procs.stop_all()
        server.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(REPO / "events" / "logs" / "contention.jsonl"))
