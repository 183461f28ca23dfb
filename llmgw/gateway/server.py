"""The gateway's shell: an HTTP/1.1 server on raw asyncio protocols (httptools
parsing, uvloop when there), the log followed and folded into the routing
table, load and usage published, metrics and spans.

A request goes: parse, authenticate (when the catalog has keys), resolve the
model or alias, check the key may use it and is within its limits, choose a
replica (choose.py, by the model's routing policy: where its prompt's prefix
is warm, by default), send, and pass the answer back as it comes. A
failure before the first byte reaches the client (no connection, connection
lost, a 502/503/504) counts against the replica's breaker and is tried on
another replica; after it, a streamed answer ends with an error event (what
the openai SDK raises), any other is cut off. An engine given an identity
that does not list it on a new connection is not the replica's (a failed
attempt, with the reason). A model with no ready replica makes its request
wait (counted as queued: that wakes an on-demand model) up to `wait_s`,
then 503 with Retry-After; so does one whose replicas failed the request
while another is coming (routing.when_none_ready). One the control plane
says cannot be served now (no room, over a limit, parked: core/waits.py)
gets 503 at once, with its reason and config.unavailable_retry_after.

The HTTP edge (connection.py: one client connection) holds to
config.GatewayConfig's limits: sizes counted as the bytes arrive (a refusal
stops the parser: nothing past a limit is buffered), each connection's
deadline by its phase (idle, head, body, answer, linger) and each request's
by request_timeout looked at by one sweep a tick, open connections capped,
in all and per client address, wrong keys throttled per address, and a
request's JSON depth checked before it is decoded (edge_limits.py). It listens on
`listen` only (and /metrics on `metrics_listen` when given): what the log
says never moves it.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import time
import uuid

from ..bus.msgids import fresh as fresh_msg_id
from ..core import events as ev
from ..core.fold import apply
from ..core.state import State
from ..core.tenancy import may_use
from ..telemetry import tracer
from . import api, intake, translated
from .checks import Refusal, tool_less
from .choose import PREFIX, Ask, Bounds, Router
from .config import KIB, MIB, GatewayConfig
from .connection import Client, Request, _enough_files
from .exchange import BROKEN, DONE, GONE, RETRY, STALE, TIMEOUT, Exchange
from .edge_limits import Connections, KeyFailures, nests_deeper
from .limits import retry_after
from .quota import Refused, estimate_prompt
from .shared_limits import SharedLimits
from .usage import Usage
from .usage import report as report_usage
from .waiting import Waiting
from .load import Loads
from .metrics import Metrics
from .prefix import prefix_of
from .routing import Backend, NoneReady, Table, build, when_none_ready
from .upstream import Lost, NotTheEngine, Pool

log = logging.getLogger("llmgw.gateway")
_tracer = tracer("llmgw.gateway")

REPORT_TICK_S = 0.25
WAKE_RETRY_AFTER_S = 5
WAIT_TICK_S = 0.5  # a waiting request looks again at least this often
MAX_ATTEMPTS = 3

METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def _shown(path: bytes) -> str:
    """A path in a message: at most 100 characters of it."""
    text = path[:100].decode(errors="replace")
    return text + "…" if len(path) > 100 else text


def _user(body: bytes) -> str:
    """The request's `user` (a session), or "" where it has none a session can be."""
    try:
        return api.request_head(body).user
    except ValueError:
        return ""


class Gateway:
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

    # ----------------------------------------------------------------- the log

    def on_message(self, seq: int, subject: str, data: bytes) -> None:
        apply(self.state, seq, subject, data)
        if not subject.startswith("llmgw.gw.") and not self._dirty:
            self._dirty = True
            asyncio.get_running_loop().call_soon(self.rebuild)

    def rebuild(self) -> None:
        """The routing table again, from the state as folded so far."""
        self._dirty = False
        table = build(self.state)
        backends: dict[tuple[str, str, str, str], Backend] = {}
        by_model: dict[str, list[Backend]] = {}
        for route in table.routes.values():
            found = []
            for t in route.targets:
                key = (t.replica, t.endpoint, t.identity, t.key_name)
                b = self.backends.get(key)
                if b is None:
                    b = Backend(t)
                    b.pool = Pool(
                        b.host, b.port, self.connect_timeout, t.identity, keys=self.bus, key_name=t.key_name,
                        key_timeout=self.config.key_timeout,
                    )
                else:
                    b.weight = t.weight
                backends[key] = b
                found.append(b)
            if found:
                by_model[route.name] = found
        gone = [b for key, b in self.backends.items() if key not in backends]
        for b in gone:
            b.pool.close()
        self.router.forget(b.token for b in gone)  # stopped, draining, a new generation: at once
        self.quotas.update(self.state.api_keys, self.state.owners)
        self.table, self.backends, self.by_model = table, backends, by_model
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    # ----------------------------------------------------------------- listening

    async def listen(self) -> None:
        """On --listen only: what the catalog says (API keys or not) never moves it."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        _enough_files(cfg.max_connections)
        self.now = time.monotonic()
        self.server = await self._serve(loop, cfg.listen, cfg.port, False)
        self.port = self.server.sockets[0].getsockname()[1]
        self.listening_on = cfg.listen
        if cfg.metrics_address is not None:
            host, port = cfg.metrics_address
            self.metrics_server = await self._serve(loop, host, port, True)
            self.metrics_port = self.metrics_server.sockets[0].getsockname()[1]
            log.info("llmgw gateway %s: /metrics at http://%s:%d/metrics", self.name, host, self.metrics_port)
        self._sweeper = loop.create_task(self._sweep())
        log.info("llmgw gateway %s: the OpenAI API at http://%s:%d/v1%s", self.name, cfg.listen, self.port,
                 " (API keys required)" if self.table.keys else " (no API keys defined: this machine's clients only)")

    async def _serve(self, loop, host: str, port: int, admin: bool) -> asyncio.AbstractServer:
        try:
            return await loop.create_server(lambda: Client(self, admin), host, port, reuse_address=True, backlog=1024)
        except OSError as e:
            raise ConnectionError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None

    async def _sweep(self) -> None:
        """The timeouts of the HTTP edge: each connection's deadline, looked at every tick."""
        tick = self.config.tick
        while True:
            await asyncio.sleep(tick)
            now = self.now = time.monotonic()
            late = [c for c in self.clients if 0.0 < c.deadline < now or 0.0 < c.answer_by < now]
            for c in late:
                try:
                    if 0.0 < c.answer_by < now:
                        c.answer_late()
                    if 0.0 < c.deadline < now:
                        c.expire()
                except Exception:  # one connection must not stop the sweep
                    log.exception("closing a connection past its deadline")

    def internal_error(self, e: Exception) -> None:
        """A bug met in handling a request (answered 500): its traceback logged
        once per kind and place, then only counted, so that a client who can
        trigger it cannot flood the log."""
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = f"{type(e).__name__} at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb else type(e).__name__
        self.metrics.edge("internal_error")
        if where not in self._errors_logged and len(self._errors_logged) < 1000:
            self._errors_logged.add(where)
            log.error("handling a request failed (answered 500; logged once): %s", where, exc_info=e)

    # ----------------------------------------------------------------- requests

    def handle(self, client: Client, req: Request) -> None:
        path, method = req.path, req.method
        if client.admin:
            return self.handle_admin(client, req)
        if translated.serves(path):  # /v1/responses, /v1/messages: onto chat completions
            return translated.start(self, client, req, path)
        if path in api.PROXIED:
            if method != b"POST":
                return client.reply(req, 405, api.error_body(405, f"{path.decode()} takes POST"))
            return self.proxy_start(client, req, path)
        if method != b"GET":
            return client.reply(req, 404, api.error_body(404, f"no route {_shown(method)} {_shown(path)}"))
        if path == b"/v1/models" or path.startswith(b"/v1/models/"):
            ok, owner = self.authenticate(client, req)
            if not ok:
                return
            if path == b"/v1/models":
                return client.reply(req, 200, api.models_list(self.table, owner))
            name = path[len(b"/v1/models/"):].decode(errors="replace")
            route = self.table.resolve(name)
            if route is None or (owner is not None and not may_use(owner, route.owner)):
                return client.reply(req, 404, self._no_model(name))
            return client.reply(req, 200, api.model_object(self.table, name))
        if path == b"/metrics" and self.metrics_server is None:
            ok, owner = self.authenticate(client, req)
            if not ok:
                return
            models = None if owner is None else set(api.visible(self.table, owner))
            return client.reply(req, 200, self.render_metrics(models), METRICS_TYPE)
        if path in (b"/health", b"/healthz", b"/"):
            return client.reply(req, 200, b'{"status":"ok"}')
        return client.reply(req, 404, api.error_body(404, f"no route GET {_shown(path)}"))

    def handle_admin(self, client: Client, req: Request) -> None:
        """The --metrics-listen address: /metrics of every model, no key (the address is the protection)."""
        if req.method == b"GET" and req.path == b"/metrics":
            return client.reply(req, 200, self.render_metrics(None), METRICS_TYPE)
        if req.method == b"GET" and req.path in (b"/health", b"/healthz", b"/"):
            return client.reply(req, 200, b'{"status":"ok"}')
        return client.reply(req, 404, api.error_body(404, f"no route {_shown(req.method)} {_shown(req.path)} here: /metrics only"))

    def _no_model(self, name: str) -> bytes:
        return api.error_body(404, f"The model `{name}` does not exist or you do not have access to it.", "model_not_found")

    def authenticate(self, client: Client, req: Request) -> tuple[bool, str | None]:
        """(ok, the key's owner): owner None when the catalog has no keys. Not ok:
        answered already. The key's name replaces the key in `req.auth`."""
        keys = self.table.keys
        if not keys:
            if not client.local:
                client.reply(req, 401, api.error_body(401, "this gateway has no API keys defined: it serves this machine only", "invalid_api_key"))
                return False, None
            return True, None
        auth = req.auth
        if not auth:
            client.reply(req, 401, api.error_body(401, "You didn't provide an API key (Authorization: Bearer KEY).", "invalid_api_key"))
            return False, None
        # Wrong keys are throttled by client address, before the key is looked at
        # (issue 35: 500 wrong keys at 8,590/s never met a 429).
        wait = self.key_failures.wait(client.client or "", self.now)
        if wait > 0:
            self.metrics.edge("max_key_failures")
            after = retry_after(wait)
            client.reply(
                req, 429,
                api.error_body(429, f"Too many incorrect API keys from this address: retry in {after}s.", "too_many_key_failures"),
                headers=b"Retry-After: %d\r\n" % after,
            )  # fmt: skip
            return False, None
        if auth[:7].lower() == b"bearer ":
            auth = auth[7:].strip()
        found = keys.get(hashlib.sha256(auth).hexdigest())
        if found is None:
            self.key_failures.failed(client.client or "", self.now)
            client.reply(req, 401, api.error_body(401, "Incorrect API key provided.", "invalid_api_key"))
            return False, None
        req.auth = found[0].encode()  # the key's name from here on; the key itself is forgotten
        return True, found[1].owner

    def proxy_start(self, client: Client, req: Request, path: bytes) -> None:
        ok, owner = self.authenticate(client, req)
        if not ok:
            return
        depth = self.config.max_json_depth
        if nests_deeper(req.body, depth):  # before any decoder recurses into it
            self.metrics.edge("max_json_depth")
            self.metrics.answered("", "", 400, 0.0)
            why = f"the request body nests deeper than {depth} levels (or is not JSON)"
            return client.reply(req, 400, api.error_body(400, why, "json_too_deep"))
        try:
            head = api.request_head(req.body)
        except ValueError as e:
            self.metrics.answered("", "", 400, 0.0)
            return client.reply(req, 400, api.error_body(400, str(e)))
        if not head.model:
            self.metrics.answered("", "", 400, 0.0)
            return client.reply(req, 400, api.error_body(400, "you must provide a model parameter", "missing_model"))
        self.admit(client, req, path, head.model, head.stream, req.body, owner)

    def admit(self, client: Client, req: Request, path: bytes, model: str, stream: bool, body: bytes, owner: str | None) -> None:
        """A request with its key checked and its body read (a chat request
        here, or one translated.py made): its model resolved, the key's access
        and limits asked, then sent (`proxy`)."""
        route = self.table.resolve(model)
        if route is None or (owner is not None and not may_use(owner, route.owner)):
            self.metrics.answered("", "", 404, 0.0)
            return client.reply(req, 404, self._no_model(model))
        limits = self.quotas.limits.get(req.auth.decode()) if owner is not None else None
        ready = intake.prepare(path, body, route.name, model, route.serves)
        if isinstance(ready, Refusal):
            self.metrics.answered(route.name, "", ready.status, 0.0)
            return client.reply(req, ready.status, api.error_body(ready.status, ready.message, ready.code, param=ready.param))
        ask = self.ask(route, req, ready.body)
        client.task = asyncio.get_running_loop().create_task(
            self.proxy(client, req, path, route.name, stream, ready.body, owner is not None, ready.tools, ask, limits, owner)
        )

    def ask(self, route, req: Request, body: bytes) -> Ask:
        """What the choice of a replica reads of a request: its model's policy,
        its prompt's blocks (at most prefix_hash_kib of it), its session
        (X-Session-Id, else the body's `user`)."""
        if route.routing != PREFIX:
            return Ask(route.routing)
        session = req.session.decode(errors="replace") if req.session else _user(body)
        return Ask(PREFIX, prefix_of(body, self.config.prefix_hash_kib * KIB), session)

    def choose(self, model: str, backends: list[Backend], tried: list[str], ask: Ask) -> Backend | None:
        """The replica for the request (choose.Router), its reason kept on `ask`."""
        self.turn += 1
        choice = ask.choice = self.router.pick(ask.policy, model, backends, time.monotonic(), self.turn, tried, ask.prefix, ask.session)
        return choice.backend if choice is not None else None

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
        if getattr(self, "_follower", None) is not None:
            await self._follower.stop()
