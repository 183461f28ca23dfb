"""What reading the log through the READERS account costs (bus/accounts.py).

Readers (gateways, operators, the projector) reach the log's JetStream API
through service imports and receive their consumers' deliveries through a
stream import. This times `read_log` of N messages as the projector (READERS,
through the imports) and as a user of the llmgw account (directly, as
readers did before issue 35), on one nats-server with auth on; the fast
reader (bus/catchup.py) takes any stretch past CATCHUP_MIN either way.

    python -m benchmarks.accounts [--messages 200000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from llmgw.bus import STREAM, read_log
from llmgw.bus.nats import NatsBus
from llmgw.bus.server import NatsServer, free_port

from .authbench import keystore, loader_creds


async def _time_read(url: str, creds: str, repeat: int) -> float:
    bus = await NatsBus.connect(url, creds=creds)
    try:
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            await read_log(bus)
            best = min(best, time.perf_counter() - start)
        return best
    finally:
        await bus.close()


async def main(messages: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        keys = keystore(Path(tmp) / "creds")
        with NatsServer(Path(tmp) / "nats", free_port(), auth=keys) as server:
            control = await NatsBus.connect(server.url, creds=server.creds("control"))
            await control.ensure_streams()
            body = b'{"at":1.0,"gateway":"g1","model":"m","in_flight":3,"queued":0}'
            for start in range(0, messages, 1000):
                await asyncio.gather(*(control.js.publish("llmgw.control.x", body, stream=STREAM) for _ in range(min(1000, messages - start))))
            await control.close()
            direct = await _time_read(server.url, loader_creds(keys), repeat)
            through = await _time_read(server.url, server.creds("projector"), repeat)
    print(f"read_log of {messages} messages, best of {repeat}:")
    print(f"  llmgw account (directly):   {direct:.2f} s  {messages / direct:,.0f} msgs/s")
    print(f"  READERS (through imports):  {through:.2f} s  {messages / through:,.0f} msgs/s  ({through / direct:.2f}x)")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    asyncio.run(main(a.messages, a.repeat))
