"""Requests waiting for a slot on a saturated model (the shell of fairqueue.py).

A replica is saturated with `replica_slots` requests outstanding per unit of
its weight (GatewayConfig): past that, an engine would only queue them in
arrival order, where a noisy neighbour's burst goes before everyone. So a
request for a model whose every replica is saturated, or whose queue
already holds others (no overtaking them), waits here in the model's
FairQueue, counted as queued (the load that scales the model), until a
slot frees (`released`, one woken a slot), its client leaves, or
`max_queue_wait` passes (503 with Retry-After); past `max_queue` waiting, it
is refused at once (429 with Retry-After), or pushes out the last of the
owner with the most waiting (fairqueue.py), which is then refused so.

A waiter woken for a slot holds it (`granted`) until it is sent: between the
wake-up and the send, the replica's outstanding count does not show it yet.
Counted as free, that slot was handed out again by the next waiter's tick —
in the fairness benchmark a 10x burst so sent twice the engine's slots, and
the engine queued a neighbour within its share behind the burst, in arrival
order (its p99 2.8x its p99 alone).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from .config import GatewayConfig
from .fairqueue import CLASS_RANK, FairQueue, weight_of

PUSHED_OUT = object()  # what a waiter pushed out of a full queue is woken with
TICK_S = 0.5  # a waiting request looks at its client (gone?) and its replicas (more room?) this often


@dataclass(frozen=True, slots=True)
class Turned:
    """Why a queued request is not sent: rendered at the edge (server.py)."""

    status: int  # 429: the queue is full; 503: waited max_queue_wait; 499: the client left
    message: str
    code: str
    retry_after: int


class Waiting:
    def __init__(self, config: GatewayConfig, backends_of, state) -> None:
        self.config = config
        self.backends_of = backends_of  # model -> its Backends now
        self.state = state  # the folded log: models' classes, owners' guarantees
        self.queues: dict[str, FairQueue] = {}
        self.granted: dict[str, int] = {}  # by model: waiters woken for a slot, not yet sent

    def saturated(self, model: str) -> bool:
        slots = self.config.replica_slots
        if slots <= 0:
            return False
        backends = self.backends_of(model)
        if not backends:
            return False
        free = sum(max(0, max(1, round(slots * b.weight)) - b.outstanding) for b in backends)
        return free <= self.granted.get(model, 0)

    def queued(self, model: str) -> int:
        q = self.queues.get(model)
        return len(q) if q is not None else 0

    async def turn(self, model: str, owner: str | None, client, meter) -> Turned | None:
        """None: go (now, or after waiting its turn); else why not."""
        q = self.queues.get(model)
        if not (q is not None and len(q)) and not self.saturated(model):
            return None
        cfg = self.config
        if q is None:
            q = self.queues[model] = FairQueue(cfg.max_queue, cfg.max_queue_wait)
        m = self.state.models.get(model)
        rank = CLASS_RANK.get(m.spec.priority, 1) if m is not None else 1
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        full = Turned(429, f"Too many requests are waiting for {model} ({cfg.max_queue}): retry later.", "queue_full", cfg.queue_retry_after)
        entry, out = q.push(fut, owner or "", weight_of(owner or "", self.state.owners), time.monotonic(), rank)
        if out is not None and not out.item.done():
            out.item.set_result(PUSHED_OUT)  # its waiter answers 429
        if entry is None:
            return full
        meter.change(time.time(), queued=1)
        try:
            deadline = entry.since + cfg.max_queue_wait
            while not fut.done():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    q.remove(entry)
                    why = f"{model} was saturated for the {cfg.max_queue_wait:g}s a request may wait for it"
                    return Turned(503, why, "model_saturated", cfg.queue_retry_after)
                await asyncio.wait((fut,), timeout=min(remaining, TICK_S))
                if fut.done():
                    break
                if client.closed:
                    q.remove(entry)
                    return Turned(499, "the client left while queued", "", 0)
                if not self.saturated(model):  # room came otherwise (a replica ready)
                    self.released(model)
            return full if fut.result() is PUSHED_OUT else None
        finally:
            if not fut.done():  # cancelled (past request_timeout): out of the queue, or a freed slot would wake no one
                q.remove(entry)
            elif fut.result() is None:  # its slot: sent now (the caller sends before it awaits), or given up
                self._ungrant(model)
            meter.change(time.time(), queued=-1)

    def _ungrant(self, model: str) -> None:
        n = self.granted.get(model, 0) - 1
        if n > 0:
            self.granted[model] = n
        else:
            self.granted.pop(model, None)

    def released(self, model: str) -> None:
        """A slot of `model` freed: the next in its queue goes."""
        q = self.queues.get(model)
        if q is None:
            return
        e = q.pop()
        if e is not None and not e.item.done():
            e.item.set_result(None)
            self.granted[model] = self.granted.get(model, 0) + 1
        if not len(q):
            del self.queues[model]
