"""The gateway's HTTP edge: listening (on `listen` only, and /metrics on
`metrics_listen` when given: what the log says never moves it), the sweep
that looks at each connection's deadline every tick, and each request
admitted or answered here: routed by path, its key authenticated (wrong keys
throttled per address), its JSON depth checked before it is decoded, its
model resolved, the key's access and limits asked; then handed to the
exchange with an engine (proxying.py). A bug met here is answered 500 and
logged once per place.

One client connection is connection.py; the limits against one client are
edge_limits.py. A mixin of server.Gateway, which owns the attributes it reads.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time

from ..core.contract.tenancy import may_use
from . import api, intake, translated
from .checks import Refusal
from .choose import PREFIX, Ask
from .config import KIB
from .connection import Client, Request, _enough_files
from .edge_limits import nests_deeper
from .limits import retry_after
from .prefix import prefix_of

log = logging.getLogger("llmgw.gateway")

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


class HttpEdge:
    """Client connections, admission and the gateway's own replies."""

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
