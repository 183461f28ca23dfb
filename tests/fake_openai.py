"""A stand-in OpenAI engine for tests of the gateway, in the test's own loop:
the simulated engine of the package (llmgw.agent.sim_engine) that misbehaves
on request and keeps every request it got.

Answers "hello from NAME" (3 tokens, 7 of prompt), streams `chunks` events
"w0 ", "w1 ", … (`delay` seconds apart), and misbehaves by `mode`: "down"
(stop(): the port closed), "503" (answers 503), "hang-up" (closes the
connection without answering), "die-after:N" (a stream cut off after N
events). `identity`: what its GET /v1/models lists beside its name; `key`:
the key it asks of every request but GET /health ("" : none asked).
"""

from __future__ import annotations

import asyncio

from llmgw.agent.sim_engine import SimEngine, error


class FakeEngine(SimEngine):
    def __init__(self, name: str = "fake", chunks: int = 4, delay: float = 0.0, identity: str = "", key: str = "") -> None:
        super().__init__(name, identity=identity, says=f"hello from {name}", delay=delay, key=key)
        self.name = name
        self.chunks = chunks
        self.mode = "ok"
        self.requests: list[dict] = []
        self.paths: list[str] = []

    def pieces(self) -> list[str]:
        return [f"w{i} " for i in range(self.chunks)]

    def prompt_tokens(self, req: dict) -> int:
        return 2 if "input" in req else 7

    async def answer(self, writer: asyncio.StreamWriter, method: str, path: str, req: dict) -> bool:
        self.paths.append(path)
        self.requests.append(req)
        mode = self.mode
        if mode == "hang-up":
            writer.transport.abort()
            return False
        if mode == "503":
            self.send_json(writer, 503, error(503, "Loading model"))
            return True
        if mode.startswith("die-after:") and req.get("stream"):
            return await self.stream(writer, path.endswith("/chat/completions"), 7, int(mode.split(":")[1]))
        return await super().answer(writer, method, path, req)
