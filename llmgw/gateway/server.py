"""The gateway: an OpenAI-compatible HTTP/1.1 server on raw asyncio
protocols (httptools parsing, uvloop when there) that follows the log and
sends each request to a replica of its model. This module is the whole put
together and its life (fold the log to its end, listen, report, close);
its jobs are each in a module of their own:

- edge.py (HttpEdge): the HTTP edge: listening, connection deadlines,
  admission (keys, models, limits) and the gateway's own replies;
  connection.py is one client connection.
- proxying.py (Proxying): the exchange with an engine: the choice of a
  replica, attempts, retries, the breakers' outcomes.
- table_upkeep.py (TableUpkeep): the log folded into the routing table,
  its backends and pools, replicas forgotten.
- here: each model's load published (it wakes on-demand models), the
  prefix hints told and heard (hints.py), and /metrics.

The HTTP edge holds to config.GatewayConfig's limits: sizes counted as the
bytes arrive (a refusal stops the parser: nothing past a limit is buffered),
each connection's deadline by its phase (idle, head, body, answer, linger)
and each request's by request_timeout looked at by one sweep a tick, open
connections capped, in all and per client address, wrong keys throttled per
address, and a request's JSON depth checked before it is decoded
(edge_limits.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid

from ..bus.msgids import fresh as fresh_msg_id
from ..core.contract import events as ev
from ..core.folding.state import State
from . import hints, translated
from .choose import Bounds, Router
from .config import MIB, GatewayConfig
from .connection import Client
from .edge import HttpEdge
from .edge_limits import Connections, KeyFailures
from .load import Loads
from .metrics import Metrics
from .proxying import Proxying
from .routing import Backend, Table
from .shared_limits import SharedLimits
from .table_upkeep import TableUpkeep
from .usage import Usage
from .usage import report as report_usage
from .waiting import Waiting

log = logging.getLogger("llmgw.gateway")

REPORT_TICK_S = 0.25


class Gateway(HttpEdge, Proxying, TableUpkeep):
    def __init__(self, bus, *, name: str, config: GatewayConfig = GatewayConfig()) -> None:
        self.bus = bus
        self.name = name
        self.config = config
        self.port = config.port  # the one listened on, once listening
        self.wait_s = config.wait_timeout
        self.upstream_timeout = config.upstream_timeout
        self.connect_timeout = config.connect_timeout
        self.failover_s = config.failover_timeout
        self.now = time.monotonic()  # the sweep's clock: deadlines are this plus a timeout
        self.state = State()
        self.table = Table()
        self.backends: dict[tuple[str, str, str, str], Backend] = {}
        self.by_model: dict[str, list[Backend]] = {}
        self.quotas = SharedLimits(bus, config)  # the limits every gateway holds together
        self.usage = Usage(time.time())  # per key, owner and model (usage.py)
        self.waiting = Waiting(config, lambda model: self.by_model.get(model) or (), self.state)  # saturated models' queues
        self.loads = Loads()
        self.metrics = Metrics()
        self.router = Router(
            config.prefix_index_mib * MIB, config.prefix_sessions, Bounds(config.prefix_epsilon, config.prefix_floor)
        )
        self.hints = hints.Outbox()  # where prompts went, to tell the other gateways
        self.hints_told = self.hints_heard = self.hints_dropped = 0  # messages told; hints heard, dropped
        self._hints_sub = None
        self.clients: set[Client] = set()
        self.per_client = Connections()  # open connections by client address
        self.key_failures = KeyFailures(config.max_key_failures, config.key_failure_window)
        self._errors_logged: set[str] = set()
        self.turn = 0
        self.waiters: list[asyncio.Future] = []
        self.server: asyncio.AbstractServer | None = None
        self.metrics_server: asyncio.AbstractServer | None = None
        self.metrics_port = 0
        self.listening_on = ""
        self._dirty = False
        self._sweeper: asyncio.Task | None = None
        self._kick: asyncio.Event | None = None
        self._instance = uuid.uuid4().hex[:8]
        self._published = 0
        self._tracing = False
        self._publish_warned = 0.0
        self.stored = translated.stored(self)  # /v1/responses' stored responses (NATS KV)

    # ----------------------------------------------------------------- load, metrics

    def kick(self) -> None:
        if self._kick is not None:
            self._kick.set()

    async def report_loop(self, stop: asyncio.Event) -> None:
        self._kick = asyncio.Event()
        while not stop.is_set():
            try:
                await asyncio.wait_for(self._kick.wait(), REPORT_TICK_S)
            except asyncio.TimeoutError:
                pass
            self._kick.clear()
            for r in self.loads.due(time.time()):
                await self.publish_load(r)
            if len(self.hints):
                await self.tell_hints()

    async def tell_hints(self) -> None:
        for data in self.hints.batches():
            try:
                await self.bus.hint(self.name, data)
                self.hints_told += 1
            except Exception as e:  # advice: lost, not retried
                now = time.monotonic()
                if now - self._publish_warned > 30:
                    self._publish_warned = now
                    log.warning("cannot tell the prefix hints: %s", e)
                return

    def on_hint(self, gateway: str, data: bytes) -> None:
        """What another gateway told (hints.py): learned where the table lists
        that replica, at that identity; the rest dropped."""
        if gateway == self.name:
            return
        try:
            told = hints.decode(data)
        except ValueError as e:
            self.hints_dropped += 1
            log.debug("a malformed prefix hint from %s: %s", gateway, e)
            return
        for model, replica, identity, hashes in told:
            b = next((b for b in self.by_model.get(model) or () if b.replica == replica and b.identity == identity), None)
            if b is None or not hashes:
                self.hints_dropped += 1
                continue
            self.router.told(hashes, b)
            self.hints_heard += 1

    async def publish_load(self, r) -> None:
        event = ev.ModelLoad(
            at=time.time(), gateway=self.name, model=r.model, in_flight=r.in_flight, queued=r.queued,
            last_used=r.last_used, tokens_in=r.tokens_in, tokens_out=r.tokens_out, requests=r.requests,
            tokens_cached=r.tokens_cached, ttft_p50=r.ttft_p50, ttft_p90=r.ttft_p90,
            routes=[ev.RouteCount(rep, why, n, p, c, h) for rep, why, n, p, c, h in r.routes],
        )  # fmt: skip
        self._published += 1
        try:
            await self.bus.publish(ev.subject_for(event), ev.encode(event), msg_id=fresh_msg_id(f"gw-{self.name}-{self._instance}-{self._published}"))
        except Exception as e:
            now = time.monotonic()
            if now - self._publish_warned > 30:
                self._publish_warned = now
                log.warning("cannot publish the load of %s: %s", r.model, e)

    def render_metrics(self, models: set[str] | None = None) -> bytes:
        """Every model's (None), or only these models' (a key's view: no edge figures either)."""
        loads = {m: (meter.in_flight, meter.queued) for m, meter in self.loads.meters.items()}
        for model in self.table.routes:
            loads.setdefault(model, (0, 0))
        backends = [(b.model, b.replica, b.outstanding, b.breaker.state != "closed") for b in self.backends.values()]
        whole = models is None  # the edge's figures and the index's size: not a key's view
        return self.metrics.render(
            loads, backends, models=models, connections=len(self.clients) if whole else None,
            index_blocks=len(self.router.index) if whole else None,
            hints=(self.hints_told, self.hints_heard, self.hints_dropped) if whole else None,
        ) + (self.usage.render() if whole else b"")  # per key: not in a key's view (other keys' names)

    # ----------------------------------------------------------------- the whole

    async def start(self) -> None:
        """Fold the log to its end, then listen."""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        self._tracing = isinstance(trace.get_tracer_provider(), TracerProvider)
        loop = asyncio.get_running_loop()
        while True:
            try:
                last = await self.bus.last_seq()
                break
            except LookupError:
                log.info("waiting for the llmgw stream (is the control plane running?)")
                await asyncio.sleep(1.0)
        caught_up = loop.create_future()

        def on_message(seq: int, subject: str, data: bytes) -> None:
            self.on_message(seq, subject, data)
            if seq >= last and not caught_up.done():
                caught_up.set_result(None)

        if last == 0:
            caught_up.set_result(None)
        self._follower = await self.bus.follow(1, on_message)
        self._hints_sub = await self.bus.follow_hints(self.on_hint)
        await caught_up
        self.rebuild()
        await self.listen()
        # What start-up made lives as long as the process: out of the
        # collector's full passes, which would otherwise walk it all.
        gc.collect()
        gc.freeze()

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        reports = asyncio.get_running_loop().create_task(self.report_loop(stop))
        quotas = asyncio.get_running_loop().create_task(self.quotas.run(stop))
        usage = asyncio.get_running_loop().create_task(
            report_usage(self.bus, self.name, self._instance, self.usage, self.config.usage_interval, stop)
        )
        try:
            await stop.wait()
        finally:
            await self.close()
            reports.cancel()
            try:
                await reports
            except (asyncio.CancelledError, Exception):
                pass
            for r in self.loads.due(time.time() + 3600):  # the last word: zero
                await self.publish_load(r)
            await quotas  # its leases given back
            await usage  # its last report

    async def close(self, grace: float = 5.0) -> None:
        if self.server is not None:
            self.server.close()
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        deadline = time.monotonic() + grace
        while any(c.busy for c in self.clients) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for c in list(self.clients):
            if c.transport is not None:
                c.transport.close()
        for b in self.backends.values():
            b.pool.close()
        if self._hints_sub is not None:
            try:
                await self._hints_sub.unsubscribe()
            except Exception:  # closing: the connection may be gone already
                pass
        if getattr(self, "_follower", None) is not None:
            await self._follower.stop()
