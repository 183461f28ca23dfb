"""The exchange with an engine: a replica chosen for an admitted request
(choose.py, by the model's routing policy), the request sent on one of its
pool's connections and the answer passed back as it comes (exchange.py).

A failure before the first byte reaches the client (no connection,
connection lost, a 502/503/504) counts against the replica's breaker and is
tried on another replica, up to MAX_ATTEMPTS; after it, a streamed answer
ends with an error event (what the openai SDK raises), any other is cut off.
An engine given an identity that does not list it on a new connection is not
the replica's (a failed attempt, with the reason). A model with no ready
replica makes its request wait (counted as queued: that wakes an on-demand
model) up to `wait_s`, then 503 with Retry-After; so does one whose replicas
failed the request while another is coming (routing.when_none_ready). One
the control plane says cannot be served now (no room, over a limit, parked:
core/rules/waits.py) gets 503 at once, with its reason and
config.unavailable_retry_after. Each answer's figures (status, tokens, the
route's reason, time to first token) go to the metrics, the model's load
meter and the request's span.

A mixin of server.Gateway, which owns the attributes it reads.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..telemetry import tracer
from . import api, intake
from .checks import tool_less
from .choose import Ask
from .connection import Client, Request
from .exchange import BROKEN, DONE, GONE, RETRY, STALE, TIMEOUT, Exchange
from .limits import retry_after
from .quota import Refused, estimate_prompt
from .routing import Backend, NoneReady, when_none_ready
from .upstream import Lost, NotTheEngine

log = logging.getLogger("llmgw.gateway")
_tracer = tracer("llmgw.gateway")

WAKE_RETRY_AFTER_S = 5
WAIT_TICK_S = 0.5  # a waiting request looks again at least this often
MAX_ATTEMPTS = 3


class Proxying:
    """Choosing a replica, attempts, retries and the breakers' outcomes."""

    def choose(self, model: str, backends: list[Backend], tried: list[str], ask: Ask) -> Backend | None:
        """The replica for the request (choose.Router), its reason kept on `ask`."""
        self.turn += 1
        choice = ask.choice = self.router.pick(ask.policy, model, backends, time.monotonic(), self.turn, tried, ask.prefix, ask.session)
        if choice is None:
            return None
        if ask.prefix is not None:  # told to the other gateways (hints.py), by the report loop
            b = choice.backend
            self.hints.add(model, b.replica, b.identity, ask.prefix.hashes)
            self.kick()
        return choice.backend

    async def proxy(
        self, client: Client, req: Request, path: bytes, model: str, stream: bool, body: bytes, keyed: bool,
        tools: bool = False, ask: Ask | None = None, limits=None, owner: str | None = None,
    ) -> None:
        grant = None
        if limits:  # the key's and its owners' limits, held with every gateway (shared_limits.py)
            m = self.state.models.get(model)
            price = (m.spec.price_in_per_1k, m.spec.price_out_per_1k) if m is not None else (0.0, 0.0)
            grant = await self.quotas.reserve(limits, body, price)
            if isinstance(grant, Refused):
                self.usage.count(req.auth.decode(), owner or "", model, refused=1)
                return self.refuse_quota(client, req, model, grant)
        ask = ask if ask is not None else Ask()
        now = time.time()
        meter = self.loads.meter(model, now)
        meter.last_used = now
        span = _tracer.start_span("gateway.request", attributes={"llmgw.model": model, "http.route": path.decode()}) if self._tracing else None
        upstream_req = b"POST %s HTTP/1.1\r\n%%s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (path, len(body))
        tried: list[str] = []
        status, replica, why = 0, "", ""
        after = WAKE_RETRY_AFTER_S  # a 503's Retry-After
        ex: Exchange | None = None
        answered = False  # the client has had its answer (or is gone)
        deadline = failed_at = 0.0  # of the wait, once begun; of the last failure
        try:
            turned = await self.waiting.turn(model, owner, client, meter)  # a saturated model: its turn, fairly
            if turned is not None:
                status, why, answered = turned.status, turned.message, True
                if status == 499:
                    client.finished(False)
                else:
                    client.reply(req, status, api.error_body(status, why, turned.code), headers=b"Retry-After: %d\r\n" % turned.retry_after)
            while not answered:
                backends = self.by_model.get(model)
                b = self.choose(model, backends, tried, ask) if backends else None
                if b is None:
                    if not deadline:
                        deadline = time.monotonic() + self.wait_s
                    b, verdict = await self.wait_for_replica(client, model, meter, tried, failed_at, deadline, ask)
                    if b is None:
                        last = f"; the last tried, {tried[-1]}: {ex.error if ex else 'failed'}" if tried else ""
                        if client.closed:
                            status = 499
                        elif verdict is NoneReady.FAIL:
                            status = ex.status if ex is not None and ex.status in (503, 504) else 502
                            why = f"no replica of {model} could take the request{last}"
                        elif verdict is NoneReady.REFUSE:  # not servable now (routing.when_none_ready): at once
                            route = self.table.routes.get(model)
                            status, why = 503, (route.no_wait if route else f"model {model} was removed") + last
                            after = self.config.unavailable_retry_after
                        else:
                            status, why = 503, f"no replica of {model} became ready within {self.wait_s:g}s{last}"
                        break
                if tools and await self.tool_less(b):
                    status, replica, why = 400, b.replica, tool_less(model, b.replica)
                    client.reply(req, 400, api.error_body(400, why, "tools_not_supported", param="tools"))
                    answered = True
                    break
                req.route = ask.choice.reason.value.encode() if ask.choice is not None else b""
                ex = await self.attempt(client, req, b, stream, upstream_req, body, meter)
                outcome = ex.fut.result()
                if outcome == RETRY:
                    failed_at = time.monotonic()
                    tried.append(b.replica)
                    log.info("%s: %s failed before answering (%s)", model, b.replica, ex.error)
                    if len(tried) >= MAX_ATTEMPTS:
                        status = ex.status if ex.status in (503, 504) else 502
                        why = f"{len(tried)} replicas of {model} failed; the last, {b.replica}: {ex.error}"
                        break
                    self.metrics.retried(model)
                    continue
                replica = b.replica
                if outcome == DONE:  # answered and finished by attempt()
                    status, answered = ex.status, True
                elif outcome == GONE:
                    status = 499
                elif outcome == TIMEOUT:
                    status, why = 504, f"{b.replica} did not answer within {self.upstream_timeout:g}s"
                elif outcome == BROKEN:
                    status, why = 502, f"replica {b.replica} failed mid-answer: {ex.error}"
                    log.warning("%s: %s", model, why)
                    self._broken(client, ex, why)
                    answered = True
                break
            if not answered:
                if status == 499:
                    client.finished(False)
                else:
                    headers = b"Retry-After: %d\r\n" % after if status == 503 else b""
                    code = "model_unavailable" if status == 503 else "upstream_error"
                    client.reply(req, status, api.error_body(status, why, code), headers=headers)
        except Exception as e:  # a bug must not leave the client hanging
            log.exception("request for %s failed", model)
            status, why = 500, f"{type(e).__name__}: {e}"
            if ex is None or not ex.sent:
                client.reply(req, 500, api.error_body(500, "internal error of the gateway"))
            else:
                client.transport.abort()
                client.finished(False)
        except asyncio.CancelledError:
            if not client.late:
                raise
            # Past request_timeout (the client's answer_late): 504, or the stream ends with an error.
            status, why = 504, f"the request was not answered within {self.config.request_timeout:g}s"
            self.metrics.edge("request_timeout")
            req.keep_alive = False  # and the connection is freed
            ex = client.exchange or ex  # the attempt under way when cancelled (attempt() never returned it)
            if ex is None or not ex.sent:
                client.reply(req, 504, api.error_body(504, why, "request_timeout"))
            else:
                ex.keep_alive = False
                self._broken(client, ex, why, 504, "request_timeout")
        finally:
            elapsed = time.monotonic() - req.received
            self.metrics.answered(model, replica, status, elapsed)
            prompt = completion = cached = 0
            hit = False
            first = None  # seconds to the answer's first byte (a stream's first token)
            if ex is not None and replica and ex.status == 200:
                if ex.first_at:
                    first = ex.first_at - req.received
                    if stream:
                        self.metrics.first_token(model, replica, first)
                used = api.stream_usage(ex.tail) if stream else (api.usage_of(b"".join(ex.parts)) if ex.parts else None)
                if used is None and stream:  # cut before its usage: its prompt (estimated) and one event a token, less [DONE]
                    used = (grant.prompt if grant is not None else estimate_prompt(body), max(ex.events - 1, 0), 0)
                if used is not None:
                    prompt, completion, cached = used
                    self.metrics.used(model, replica, prompt, completion, cached)
                    choice = ask.choice
                    if choice is not None and choice.backend.replica == replica:
                        hit = self.router.answered(choice, prompt, cached)
                        self.metrics.cached(model, replica, cached, hit)
                    meter.tokens_in += prompt
                    meter.tokens_out += completion
                    meter.tokens_cached += min(cached, prompt)
            if grant is not None:
                self.quotas.settle(grant, prompt, completion)
            self.usage.count(req.auth.decode() if keyed else "", owner or "", model, 1, prompt, completion)
            meter.finished(first)
            if replica and ask.choice is not None:
                reason = ask.choice.reason
                self.metrics.routed(model, replica, reason)
                meter.routed(replica, reason.value, prompt, cached, hit)
            if span is not None:
                span.set_attribute("llmgw.replica", replica)
                span.set_attribute("http.status_code", status)
                span.set_attribute("llmgw.attempts", len(tried) + (1 if replica else 0))
                if tried:
                    span.set_attribute("llmgw.failed_replicas", tried)
                if prompt or completion:
                    span.set_attribute("llmgw.tokens_in", prompt)
                    span.set_attribute("llmgw.tokens_out", completion)
                if why:
                    span.set_attribute("llmgw.error", why)
                span.end()

    def refuse_quota(self, client: Client, req: Request, model: str, refused: Refused) -> None:
        """Past a limit (429, naming it), or the limits not checkable and the policy closed (503)."""
        self.metrics.answered(model, "", refused.status, 0.0)
        self.metrics.edge(f"quota_{refused.limit.kind.value}" if refused.limit is not None else "quota_unavailable")
        headers = b""
        message = refused.message()
        if not refused.too_large:  # one too large never passes: no Retry-After to come back after
            after = retry_after(refused.wait_s)
            headers = b"Retry-After: %d\r\n" % after
            message += f" Retry in {after}s."
        client.reply(req, refused.status, api.error_body(refused.status, message, refused.code), headers=headers)

    async def tool_less(self, b: Backend) -> bool:
        """Whether the replica's engine is known to take no tools (its template
        has none): asked of it first where not yet known."""
        if b.pool.tools is None and b.pool.identity:
            await b.pool.probe()
        return b.pool.tools is False

    async def attempt(self, client: Client, req: Request, b: Backend, stream: bool, upstream_req: bytes, body: bytes, meter) -> Exchange:
        loop = asyncio.get_running_loop()
        b.breaker.picked(time.monotonic())
        b.outstanding += 1
        meter.change(time.time(), in_flight=1)
        ex = Exchange(client, req, stream, b, loop.create_future())
        ex.completion_ids = req.path == intake.COMPLETIONS
        client.exchange = ex
        ex.timer = loop.call_later(self.upstream_timeout, ex.timed_out)
        try:
            conn = b.pool.take_idle()
            while True:
                if conn is None:
                    try:
                        conn = await b.pool.connect()
                    except (OSError, asyncio.TimeoutError) as e:
                        ex.error = Lost(f"cannot connect to {b.endpoint}: {e or type(e).__name__}")
                        ex._resolve(RETRY)
                        break
                    except NotTheEngine as e:
                        # Never a 200 from an engine that is not the replica's.
                        log.warning("%s: %s", b.replica, e)
                        ex.error = Lost(str(e))
                        ex._resolve(RETRY)
                        break
                if client.closed or ex.fut.done():  # gone, or timed out, while connecting
                    conn.pool.release(conn)
                    ex._resolve(GONE)
                    break
                ex.upstream = conn
                conn.send((upstream_req % b.pool.head) + body, ex)  # Host and the engine's key
                if client.paused:
                    conn.pause()
                outcome = await ex.fut
                if outcome == STALE:
                    conn = None
                    ex.fut = loop.create_future()
                    ex.status = 0
                    continue
                break
        except asyncio.CancelledError:  # past request_timeout: the engine stops generating for no one
            up, ex.upstream = ex.upstream, None
            if up is not None:
                up.abort()
            ex._resolve(TIMEOUT)
            if ex.sent:
                b.breaker.released()  # a long answer, not the replica's fault
            else:
                b.breaker.failure(time.monotonic())
            raise
        finally:
            b.outstanding -= 1
            self.waiting.released(b.model)  # a slot freed: the next waiting for one goes
            meter.change(time.time(), in_flight=-1)
            if ex.timer is not None:
                ex.timer.cancel()
                ex.timer = None
        outcome = ex.fut.result()
        if outcome == DONE:
            b.breaker.success()
            client.finished(ex.keep_alive)
        elif outcome in (RETRY, BROKEN, TIMEOUT):
            b.breaker.failure(time.monotonic())
        else:
            b.breaker.released()
        return ex

    def _broken(self, client: Client, ex: Exchange, why: str, status: int = 502, code: str = "upstream_error") -> None:
        """The replica failed (or time ran out) after the client had the first byte: end cleanly if the framing allows."""
        if client.closed:
            return client.finished(False)
        if ex.chunked:
            tail = api.sse_error(status, why, code) if ex.stream else b""
            framed = (b"%x\r\n%s\r\n" % (len(tail), tail) if tail else b"") + b"0\r\n\r\n"
            client.transport.write(framed)
            client.finished(ex.keep_alive)
        else:
            client.transport.abort()
            client.closed = True
            client.finished(False)

    async def wait_for_replica(
        self, client: Client, model: str, meter, tried: list[str], failed_at: float, deadline: float, ask: Ask | None = None
    ) -> tuple[Backend | None, NoneReady]:
        """Wait (queued) for a replica not yet tried to take the request, as
        long as `when_none_ready` says one may come and `deadline` allows.
        (None, why not) when none did; WAIT then means time ran out."""
        loop = asyncio.get_running_loop()
        queued = False
        try:
            while not client.closed:
                now = time.monotonic()
                backends = self.by_model.get(model)
                if backends:
                    b = self.choose(model, backends, tried, ask if ask is not None else Ask())
                    if b is not None:
                        return b, NoneReady.WAIT
                verdict = when_none_ready(self.table.routes.get(model), len(tried), now - failed_at, self.failover_s)
                if verdict is not NoneReady.WAIT:
                    return None, verdict
                remaining = deadline - now
                if remaining <= 0:
                    # Out of time in the grace after a failure, nothing coming: the failure is the answer.
                    route = self.table.routes.get(model)
                    return None, when_none_ready(route, len(tried), float("inf"), self.failover_s)
                if not queued:
                    queued, was_busy = True, meter.busy()
                    meter.change(time.time(), queued=1)
                    if not was_busy:
                        self.kick()  # the wake-up: report at once
                fut = loop.create_future()
                self.waiters.append(fut)
                timer = loop.call_later(min(remaining, WAIT_TICK_S), lambda f=fut: f.done() or f.set_result(None))
                await fut
                timer.cancel()
            return None, NoneReady.WAIT
        finally:
            if queued:
                meter.change(time.time(), queued=-1)
