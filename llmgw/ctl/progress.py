"""Progress of long work on stderr: a line about once a second (CliConfig.progress_every_s),
nothing at all for work that ends sooner."""

from __future__ import annotations

import asyncio
import sys
import time

from .config import CONFIG
from .printable import printable_lines


class Progress:
    def __init__(self, every_s: float | None = None) -> None:
        self.every_s = CONFIG.progress_every_s if every_s is None else every_s
        self.started = time.monotonic()
        self.last = self.started
        self.told = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def due(self) -> bool:
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            return True
        return False

    def say(self, text: str) -> None:
        self.told = True
        print(printable_lines(text), file=sys.stderr, flush=True)  # it quotes the read models' reasons

    def maybe(self, text_of) -> None:
        """Say `text_of()` if a line is due (text_of is called only then)."""
        if self.due():
            self.say(text_of())


async def read_log_showing_progress(bus, what: str, start_seq: int = 1) -> list[tuple[int, str, bytes]]:
    """Every message of the log from `start_seq` to its end as of now (as
    `llmgw.bus.read_log`), saying how far it is while it reads."""
    last = await bus.last_seq()
    records: list[tuple[int, str, bytes]] = []
    if last < start_seq:
        return records
    done = asyncio.Event()
    progress = Progress()

    def on_message(seq: int, subject: str, data: bytes) -> None:
        if seq <= last:
            records.append((seq, subject, data))
        if seq >= last:
            done.set()
        elif progress.due():
            rate = len(records) / max(progress.elapsed(), 1e-9)
            progress.say(f"{what}: event {seq} of {last} ({rate:,.0f} events/s)")

    follower = await bus.follow(start_seq, on_message)
    try:
        await done.wait()
    finally:
        await follower.stop()
    if progress.told:
        progress.say(f"{what}: {len(records)} events in {progress.elapsed():.1f}s")
    return records
