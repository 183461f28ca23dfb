"""Limits every gateway holds together: leases of counters kept in NATS KV.

The choice. Three ways were open:

- a KV counter changed by compare-and-set on every request: exact, but a
  NATS round trip (and a retry under contention) inside every request, where
  the gateway is to add at most 0.5 ms;
- usage deltas published and summed by every gateway: no round trip, but
  each gateway learns of the others' usage only after it happened, so a
  burst through N gateways passes N times before anyone knows;
- leases (chosen): each limit is one counter in the QUOTAS_BUCKET
  (quota.py: a rate's GCRA time, a budget's tokens used in its window), and
  a gateway takes from it a share at once (`quota_lease` of the limit, by
  compare-and-set) that it then serves from memory. A request whose units
  are in hand costs no NATS round trip; one that finds its lease short
  leases more (one round trip), and a lease running low is topped up in the
  background before it is empty. Nothing is ever given out twice, so N
  gateways together never let in more than the limit; what a gateway holds
  and does not use is given back after `quota_lease_idle`, so they let in
  less than it by at most the leases in hand.

Tokens are reserved before a request is let in (quota.reservation: the
prompt's estimate and max_tokens) and settled when it ends: what was
reserved and not used goes back to the lease, what was used past it is
taken from the lease or, where the lease is short, charged to the counter
(`owed`, pushed in the background; a rate may so go into debt, which its
key pays by waiting).

When NATS does not answer within `quota_timeout`, `quota_failure` says:
`open` lets requests in under this gateway's own count of each rate (a
token bucket per gateway, as before issue 32: N gateways may then let in up
to N times the limit) and budgets are not held, the usage kept as owed and
charged when NATS answers again; `closed` refuses them (503 with
Retry-After). Either way NATS is asked again only after `quota_retry`, so a
partition costs one timeout, not one per request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from ..bus import Conflict
from . import quota
from .config import GatewayConfig
from .limits import Bucket
from .quota import Kind, Limit, Refused

log = logging.getLogger("llmgw.gateway")

MAX_SWAPS = 8  # compare-and-set tries against other gateways before a request is told to retry
FORGET_S = 120.0  # a lease with nothing in hand or owed, unused this long, is dropped (memory)


class _Down(Exception):
    pass


class _Lease:
    """One counter as this gateway holds it."""

    __slots__ = ("counter", "limit", "have", "used_at", "owed", "fallback", "flight", "half")

    def __init__(self, counter: str, limit: Limit, now: float) -> None:
        self.counter = counter
        self.limit = limit
        self.have = 0  # units leased from the counter, not yet used
        self.used_at = now
        self.owed = 0  # units used and not yet charged to the counter
        self.fallback: Bucket | None = None  # this gateway's own count, while NATS does not answer
        self.flight: asyncio.Future | None = None  # its one exchange with NATS under way (others wait for it)
        self.half = 0.0  # half a chunk: in hand below it, a top-up is begun (reserve)

    def chunk(self, share: float) -> int:
        return max(1, math.ceil(self.limit.amount * share))


class Grant:
    """What a request was let in with: the units taken of each lease."""

    __slots__ = ("parts", "tokens", "prompt", "price")

    def __init__(self, parts: list[tuple[_Lease, int, bool]], tokens: int, prompt: int, price: tuple[float, float]) -> None:
        self.parts = parts  # (lease, units, taken from the shared counter: else from the fallback)
        self.tokens = tokens
        self.prompt = prompt
        self.price = price  # the model's, per 1,000 tokens in and out (spend limits)


class SharedLimits:
    def __init__(self, bus, config: GatewayConfig = GatewayConfig(), clock=time.time) -> None:
        self.bus = bus
        self.config = config
        self.clock = clock  # wall time (a budget's window is a UTC day): injectable for tests
        self.leases: dict[str, _Lease] = {}
        self.limits: dict[str, tuple[Limit, ...]] = {}  # key name -> every limit its requests meet
        self.down_until = 0.0
        self.refused = 0  # requests refused past a limit (metrics)
        self._tasks: set[asyncio.Task] = set()

    def update(self, api_keys: dict, owners: dict) -> None:
        """The limits of each key, again (the catalog changed)."""
        self.limits = {name: lims for name, key in api_keys.items() if (lims := quota.limits_of(name, key, owners))}

    @property
    def down(self) -> bool:
        return self.clock() < self.down_until

    # ----------------------------------------------------------------- a request

    async def reserve(self, limits: tuple[Limit, ...], body: bytes, price: tuple[float, float] = (0.0, 0.0)) -> Grant | Refused:
        """Take one request and its reservation of tokens (and their cost at
        the model's `price`) from every limit, or none of them."""
        prompt, tokens, _ = quota.reservation(body, self.config.default_completion, limits)
        spend = quota.cost(prompt, tokens - prompt, price)
        big = quota.too_large(limits, tokens, spend)
        if big is not None:
            self.refused += 1
            return Refused(big, 0.0, too_large=True, requested=spend if big.spend else tokens)
        now = self.clock()
        parts: list[tuple[_Lease, int, bool]] = []
        short: list[tuple[_Lease, int]] = []
        down = now < self.down_until
        for limit in limits:
            n = tokens if limit.tokens else spend if limit.spend else 1
            if not n:  # a spend limit, and a model with no price
                continue
            lease = self._lease(limit, now)
            lease.used_at = now
            if down:
                short.append((lease, n))
            elif lease.have >= n:
                lease.have -= n
                parts.append((lease, n, True))
            else:
                short.append((lease, n))
        refused = None
        if short and not down:
            try:
                waits = await asyncio.gather(*(self._top_up(lease, n, now) for lease, n in short))
            except _Down:
                down = True
            else:
                for (lease, n), w in zip(short, waits):
                    if w > 0:
                        refused = refused or Refused(lease.limit, w)
                    else:  # claimed by _swap
                        parts.append((lease, n, True))
                short = []
        if down and refused is None:
            if self.config.quota_failure == "closed":
                refused = Refused(None, self.config.quota_retry)
            else:
                refused = self._fallback(short, parts, now)
        if refused is not None:
            self._undo(parts)
            self.refused += 1
            return refused
        for lease, _, shared in parts:
            if shared and lease.have < lease.half:
                self._prefetch(lease)
        return Grant(parts, tokens, prompt, price)

    def settle(self, grant: Grant, prompt: int, completion: int) -> None:
        """A request ended having used these tokens (its prompt, its answer)."""
        tokens, spend = prompt + completion, quota.cost(prompt, completion, grant.price)
        for lease, n, shared in grant.parts:
            if lease.limit.rate and not lease.limit.tokens:  # a request: taken whole at the start
                continue
            used = spend if lease.limit.spend else tokens
            if not shared:  # let in on the fallback: the counter is told what was used
                lease.owed += used
                if lease.fallback is not None and n > used:
                    lease.fallback.level = min(lease.fallback.per_minute, lease.fallback.level + (n - used))
                continue
            if used <= n:
                lease.have += n - used
            else:
                extra = used - n
                took = min(lease.have, extra)
                lease.have -= took
                lease.owed += extra - took

    def _undo(self, parts: list[tuple[_Lease, int, bool]]) -> None:
        for lease, n, shared in parts:
            if shared:
                lease.have += n
            elif lease.fallback is not None:
                lease.fallback.level = min(lease.fallback.per_minute, lease.fallback.level + n)

    def _fallback(self, short, parts, now: float) -> Refused | None:
        """NATS does not answer and the policy is open: this gateway's own count of each rate."""
        for lease, n in short:
            limit = lease.limit
            if limit.kind.rate:
                if lease.fallback is None or lease.fallback.per_minute != limit.amount:
                    lease.fallback = Bucket(limit.amount, now)
                w = lease.fallback.take(n, now)
                if w > 0:
                    return Refused(limit, w)
            if limit.kind is Kind.REQUESTS_PER_MINUTE:
                lease.owed += n  # a request: counted now (tokens and spend are, at the end)
            parts.append((lease, n, False))
        return None

    def _lease(self, limit: Limit, now: float) -> _Lease:
        counter = limit.counter(now)
        lease = self.leases.get(counter)
        if lease is None or lease.limit is not limit:  # new, or its amount changed
            if lease is None:
                lease = self.leases[counter] = _Lease(counter, limit, now)
            lease.limit = limit
            lease.half = lease.chunk(self.config.quota_lease) / 2
        return lease

    # ----------------------------------------------------------------- NATS

    async def _top_up(self, lease: _Lease, n: int, now: float) -> float:
        """Claim `n`, leasing what lacks (and a chunk more where it fits): 0,
        or how long until it would fit. One exchange with NATS a lease at a
        time: concurrent requests wait for it and look again, rather than
        race each other's compare-and-set."""
        while lease.flight is not None:
            await asyncio.shield(lease.flight)
            if lease.have >= n:
                lease.have -= n
                return 0.0
        return await self._flight(lease, self._swap(lease, n, lease.chunk(self.config.quota_lease), now))

    async def _flight(self, lease: _Lease, exchange):
        fut = lease.flight = asyncio.get_running_loop().create_future()
        try:
            return await exchange
        finally:
            lease.flight = None
            fut.set_result(None)

    async def _swap(self, lease: _Lease, n: int, extra: int, now: float) -> float:
        """Claim `n` from the lease, taking what lacks (and `extra` more where it fits)
        from the counter and pushing what is owed: 0, or the wait. What lacks
        is looked at again at each try: other requests' top-ups land meanwhile."""
        limit, timeout = lease.limit, self.config.quota_timeout
        for _ in range(MAX_SWAPS):
            need = max(0, n - lease.have)
            more = need + extra
            if not need and not lease.owed and (n or not extra):
                lease.have -= n  # claimed at once: another request's top-up may be what filled it
                return 0.0
            try:
                data, rev = await asyncio.wait_for(self.bus.quota_get(lease.counter), timeout)
            except Exception as e:
                raise self._failed(e) from None
            owed = lease.owed
            value = quota.decode(data)
            if owed:
                value = quota.charge(limit.kind, value, owed, limit.amount, now)
            got, new = more, quota.take(limit.kind, value, more, limit.amount, now) if more > 0 else value
            if new is None and need < more:
                got, new = need, (quota.take(limit.kind, value, need, limit.amount, now) if need > 0 else value)
            if new is None:
                got, new = 0, value
                if not owed:
                    return max(quota.wait(limit.kind, value, need, limit.amount, now), 1e-3)
            try:
                await asyncio.wait_for(self.bus.quota_swap(lease.counter, quota.encode(new), rev), timeout)
            except Conflict:
                continue
            except Exception as e:
                raise self._failed(e) from None
            lease.owed -= owed
            lease.have += got
            if got < need:  # only what was owed went in
                return max(quota.wait(limit.kind, new, need, limit.amount, now), 1e-3)
            lease.have -= n
            return 0.0
        return 1.0  # other gateways kept winning: come back in a second

    def _failed(self, e: BaseException) -> _Down:
        if not self.down:
            log.warning(
                "the shared limits cannot be read from NATS (%s): failing %s for %gs",
                type(e).__name__ if isinstance(e, asyncio.TimeoutError) else e, self.config.quota_failure, self.config.quota_retry,
            )  # fmt: skip
        self.down_until = self.clock() + self.config.quota_retry
        return _Down()

    async def _give_back(self, lease: _Lease, now: float) -> None:
        """What is in hand and unused, given back; what is owed, charged."""
        limit, timeout = lease.limit, self.config.quota_timeout
        for _ in range(MAX_SWAPS):
            have, owed = lease.have, lease.owed
            if not have and not owed:
                return
            data, rev = await asyncio.wait_for(self.bus.quota_get(lease.counter), timeout)
            value = quota.decode(data)
            if owed:
                value = quota.charge(limit.kind, value, owed, limit.amount, now)
            if have:
                value = quota.give(limit.kind, value, have, limit.amount, now)
            try:
                await asyncio.wait_for(self.bus.quota_swap(lease.counter, quota.encode(value), rev), timeout)
            except Conflict:
                continue
            lease.have -= have
            lease.owed -= owed
            return

    def _prefetch(self, lease: _Lease) -> None:
        if lease.flight is not None:
            return

        async def top_up() -> None:
            try:
                await self._flight(lease, self._swap(lease, 0, lease.chunk(self.config.quota_lease), self.clock()))
            except _Down:
                pass

        task = asyncio.get_running_loop().create_task(top_up())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def upkeep(self) -> None:
        """One pass: idle leases given back, owed usage charged, old leases forgotten."""
        now = self.clock()
        idle = self.config.quota_lease_idle
        for counter, lease in list(self.leases.items()):
            if now < self.down_until:
                return
            stale = now - lease.used_at
            if lease.owed or (lease.have and stale > idle):
                if lease.flight is not None:
                    continue
                try:
                    await self._flight(lease, self._give_back(lease, now))
                except Exception as e:
                    self._failed(e)
                    return
            elif not lease.have and not lease.owed and stale > FORGET_S:
                del self.leases[counter]

    async def run(self, stop: asyncio.Event) -> None:
        """Upkeep, every half of quota_lease_idle, until `stop`; then leases given back."""
        tick = self.config.quota_lease_idle / 2
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), tick)
            except asyncio.TimeoutError:
                pass
            try:
                await self.upkeep()
            except Exception:  # the upkeep must go on
                log.exception("keeping the shared limits")
        for lease in self.leases.values():
            lease.used_at = -math.inf
        try:
            await asyncio.wait_for(self.upkeep(), self.config.quota_timeout * 4)
        except Exception:
            pass
