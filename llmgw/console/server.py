"""`llmgw console`: a small HTTP server (asyncio streams, no framework) that
serves the console's page and its data, follows the log for the live views
(server-sent events) and publishes the operator's actions.

Who may look: whoever presents the token `llmgw up` prints (in the URL once;
it is then swapped for an HttpOnly, SameSite=Strict cookie, so it leaves the
address bar and no script of the page can read it), or `Authorization:
Bearer TOKEN`. Anything else gets 401 and no data: the console reads the
whole fleet and publishes the operator's actions. It does so with a
credential of its own (role console, llmgw/bus/auth.py): the server lets it
publish those actions and nothing else of an operator's (not the catalog,
keys or policy). It used the operator's until issue 35 found that a hole in
the console then reached everything an operator may say.
An action (POST) must also come from the console's own page: its Origin is
the console's, and it carries X-LLMGW-Console (a header no form of another
site can send without a preflight we never answer).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import mimetypes
import secrets
import time
import urllib.parse
from collections import OrderedDict
from pathlib import Path

import msgspec

from ..core.contract import events as ev
from ..core.contract.bounds import MAX_TIME
from ..core.contract.catalog import NAME_RE
from ..core.folding.fold import apply
from ..core.simulation.history import summary
from ..core.folding.state import State
from ..ctl.readmodels import NoReadModels, ReadModels
from ..ctl.views import decision_words
from ..replay.tool import fold_until
from ..core.folding import facility_facts
from . import fleetmap, followup, series, views
from .config import CONFIG, COOKIE, ConsoleConfig

log = logging.getLogger("llmgw.console")
STATIC = Path(__file__).parent / "static"
REASONS = {200: "OK", 303: "See Other", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
           404: "Not Found", 405: "Method Not Allowed", 409: "Conflict", 413: "Payload Too Large", 500: "Internal Server Error"}


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def new_token() -> str:
    return secrets.token_urlsafe(32)


class Console:
    def __init__(self, bus, db: str | Path | None, token: str, config: ConsoleConfig = CONFIG) -> None:
        self.bus, self.token, self.config = bus, token, config
        self.models = ReadModels(db) if db else None
        self.records: list[tuple[int, str, bytes]] = []
        self.state = State()
        self.series = series.Recorder()  # the plots and timelines, kept as the log is folded
        self._past: OrderedDict[int, State] = OrderedDict()
        self._follower = None
        self.server: asyncio.AbstractServer | None = None

    # ------------------------------------------------------------- the log

    def _on_message(self, seq: int, subject: str, data: bytes) -> None:
        self.records.append((seq, subject, data))
        apply(self.state, seq, subject, data)
        self.series.observe(self.state, seq, subject, data)

    async def start(self) -> None:
        self._follower = await self.bus.follow(1, self._on_message)
        self.server = await asyncio.start_server(self._serve, self.config.listen, self.config.port)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        if self._follower is not None:
            await self._follower.stop()

    @staticmethod
    def _point(query: dict) -> tuple[str, float] | None:
        """The point of the log a query asks for: ("seq", N) or ("time", T); None: now."""
        if "seq" in query and query["seq"]:
            try:
                return ("seq", float(int(query["seq"])))
            except ValueError:
                raise HttpError(400, f"seq {query['seq']!r} is not a sequence number")
        if "time" in query and query["time"]:
            try:
                return ("time", float(query["time"]))
            except ValueError:
                raise HttpError(400, f"time {query['time']!r} is not Unix seconds")
        return None

    def at(self, query: dict) -> tuple[State, bool]:
        """The state to show: now, or folded from the log to `seq` or `time`."""
        point = self._point(query)
        if point is None:
            return self.state, False
        records = self.records
        # Past the end is now.
        if point[0] == "seq" and point[1] >= self.state.seq:
            return self.state, False
        cached = self._past.get(int(point[1])) if point[0] == "seq" else None
        if cached is not None:  # the slider back and forth over one point folds it once
            self._past.move_to_end(int(point[1]))
            return cached, True
        state = fold_until(records, point)
        if state.seq >= self.state.seq:
            return self.state, False
        self._past[state.seq] = state
        while len(self._past) > self.config.states_cached:
            self._past.popitem(last=False)
        return state, True

    # ------------------------------------------------------------- HTTP

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.config.header_timeout_s)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
                return
            lines = head.decode("latin-1").split("\r\n")
            try:
                method, target, _version = lines[0].split(" ", 2)
            except ValueError:
                await self._send(writer, 400, {"error": "a malformed request line"})
                return
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            url = urllib.parse.urlsplit(target)
            query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
            body = b""
            length = int(headers.get("content-length", "0") or 0)
            if length > self.config.max_body:
                await self._send(writer, 413, {"error": "the body is too large"})
                return
            if length:
                body = await reader.readexactly(length)
            try:
                await self._route(method, url.path, query, headers, body, writer, reader)
            except HttpError as e:
                await self._send(writer, e.status, {"error": str(e)})
            except ConnectionError:  # the browser went away (a page closed, an event stream ended)
                raise
            except Exception as e:  # one request's bug never stops the console
                log.exception("console: %s %s", method, url.path)
                await self._send(writer, 500, {"error": f"{type(e).__name__}: {e}"})
        except ConnectionError:
            pass
        finally:
            try:
                writer.close()
            except Exception:
                pass

    def _authorized(self, headers: dict) -> bool:
        presented = ""
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            presented = auth[7:].strip()
        else:
            for part in headers.get("cookie", "").split(";"):
                k, _, v = part.strip().partition("=")
                if k == COOKIE:
                    presented = v
        return bool(presented) and hmac.compare_digest(presented.encode(), self.token.encode())

    async def _route(self, method: str, path: str, query: dict, headers: dict, body: bytes, writer, reader) -> None:
        if method == "GET" and path == "/" and "token" in query:
            if not hmac.compare_digest(query["token"].encode(), self.token.encode()):
                raise HttpError(401, "a wrong token: use the URL llmgw up printed")
            cookie = f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/"
            await self._send(writer, 303, b"", extra={"Location": "/", "Set-Cookie": cookie})
            return
        if path == "/favicon.ico":  # asked by browsers that did not read the page's icon link; no secret in it
            await self._static(writer, "/static/favicon.svg")
            return
        if not self._authorized(headers):
            raise HttpError(401, "this console needs its token: open the URL llmgw up printed (…/?token=…)")
        if method == "POST":
            self._same_origin(headers)
            if not path.startswith("/api/action/"):
                raise HttpError(404, f"no action at {path}")
            try:
                args = json.loads(body or b"{}")
            except ValueError:
                raise HttpError(400, "the body is not JSON")
            if not isinstance(args, dict):
                raise HttpError(400, "the body is a JSON object")
            await self._send(writer, 200, await self.act(path.removeprefix("/api/action/"), args))
            return
        if method != "GET":
            raise HttpError(405, f"{method} is not served here")
        if path == "/api/events":
            await self._events(reader, writer)
            return
        if path.startswith("/api/"):
            await self._send(writer, 200, self.view(path.removeprefix("/api/"), query))
            return
        await self._static(writer, path)

    def _same_origin(self, headers: dict) -> None:
        origin, host = headers.get("origin", ""), headers.get("host", "")
        if not host or origin != f"http://{host}":
            raise HttpError(403, "an action must come from the console's own page (Origin)")
        if headers.get("x-llmgw-console") != "1":
            raise HttpError(403, "an action must come from the console's own page (X-LLMGW-Console)")

    async def _static(self, writer, path: str) -> None:
        name = "index.html" if path in ("/", "/index.html") else path.removeprefix("/static/")
        file = (STATIC / name).resolve()
        if STATIC.resolve() not in file.parents or not file.is_file():
            raise HttpError(404, f"nothing at {path}")
        kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        await self._send(writer, 200, file.read_bytes(), content_type=f"{kind}; charset=utf-8")

    async def _send(self, writer, status: int, payload, *, content_type: str = "application/json",
                    extra: dict | None = None) -> None:
        data = payload if isinstance(payload, bytes) else msgspec.json.encode(payload)
        head = [f"HTTP/1.1 {status} {REASONS.get(status, '')}", f"Content-Type: {content_type}",
                f"Content-Length: {len(data)}", "Connection: close", "Cache-Control: no-store",
                "X-Content-Type-Options: nosniff", "X-Frame-Options: DENY",
                "Content-Security-Policy: default-src 'self'; style-src 'self' 'unsafe-inline'"]
        head += [f"{k}: {v}" for k, v in (extra or {}).items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
        await writer.drain()

    async def _events(self, reader, writer) -> None:
        """Server-sent events: the log's position whenever it moves, until the
        browser goes (a page closed leaves no stream behind: writes to a closed
        socket do not fail, so the end is seen by the reader)."""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
                     b"Connection: keep-alive\r\n\r\n")
        said, quiet = -1, 0.0
        while not reader.at_eof() and not writer.is_closing():
            seq = self.state.seq
            if seq != said:
                said, quiet = seq, 0.0
                data = msgspec.json.encode({"seq": seq, "position": self._position()})
                writer.write(b"event: moved\ndata: " + data + b"\n\n")
            elif quiet >= self.config.keepalive_s:
                quiet = 0.0
                writer.write(b": keepalive\n\n")
            await writer.drain()
            await asyncio.sleep(self.config.tick_s)
            quiet += self.config.tick_s

    def _position(self) -> int:
        try:
            return self.models.position() if self.models else 0
        except (NoReadModels, OSError):
            return 0

    # ------------------------------------------------------------- views

    def view(self, what: str, query: dict):
        if what in ("plots", "timeline") or what.startswith("gpus/"):
            return self.over_time(what, query)
        state, past = self.at(query)
        head = {"seq": state.seq, "last": self.state.seq, "past": past, "at": self._at_of(state.seq),
                "first_at": self._at_of(self.records[0][0]) if self.records else 0.0}
        upto = state.seq if past else None
        if what in ("map", "fleet"):  # the same data, drawn two ways (fleetmap.py says why)
            return {**head, **fleetmap.fleet_map(state)}
        if what == "followed":  # what followed an action's event (the banner); always now
            return {**head, **msgspec.to_builtins(self.followed(query.get("event", "")))}
        if what == "models":
            return {**head, "models": views.models_view(state)}
        if what == "replicas":
            limit = int(query["limit"]) if query.get("limit", "").isdigit() else 0
            return {**head, "replicas": views.replicas_view(state, limit), "total": len(state.replicas)}
        if what == "quotas":
            return {**head, "quotas": views.quotas_view(state)}
        if what == "decision":
            return {**head, "decision": views.decision_at(self.records, state, state.seq)}
        if what == "decisions":
            rows = self._read(lambda m: m.decisions(model=query.get("model") or None, limit=0 if self._filtered(query)
                                                    else self.config.decisions_limit, before=upto,
                                                    after=self._after(query)))
            rows = [r for r in rows if self._matches(r, query)][-self.config.decisions_limit:]
            for r in rows:
                r["words"] = decision_words(r)
            return {**head, "decisions": rows}
        if what == "preemptions":
            rows = self._read(lambda m: m.preemptions(model=query.get("model") or None, limit=self.config.decisions_limit,
                                                      before=upto))
            return {**head, "preemptions": rows}
        if what.startswith("node/"):
            name = urllib.parse.unquote(what.removeprefix("node/"))
            page = views.node(state, name, self.models)
            if page is None:
                raise HttpError(404, f"no node {name} (at event {state.seq})")
            page["running"] = fleetmap.running_on(state, name)
            return {**head, "node": page}
        if what.startswith("explain/"):
            from ..ctl.explanation import explanation

            name = urllib.parse.unquote(what.removeprefix("explain/"))
            if name not in state.models:
                raise HttpError(404, f"no model {name} in the catalog (at event {state.seq})")
            lines, data = explanation(state, name)
            return {**head, "lines": lines, "explanation": data}
        raise HttpError(404, f"no view {what}")

    def over_time(self, what: str, query: dict) -> dict:
        """The plots, the decisions timeline and a node's GPU timeline over a
        window of the log (`from`, `to`: Unix seconds; the whole log by
        default), from what the console recorded as it folded the log
        (series.py). The slider's point (`seq` or `time`) is only said, for
        the cursor: nothing is folded again for it."""
        rec, cfg = self.series, self.config
        first, until = self._seconds(query, "from"), self._seconds(query, "to")
        if first is not None and until is not None and first >= until:
            raise HttpError(400, f"from {query['from']} is not before to {query['to']}")
        start, end = series.window(rec, first, until)
        point, last = self._point(query), self.state.seq
        seq = last if point is None else max(0, min(last, int(point[1]) if point[0] == "seq" else series.seq_at(rec, point[1])))
        head = {"seq": seq, "last": last, "past": seq < last, "at": self._at_of(seq),
                "first_at": self._at_of(self.records[0][0]) if self.records else 0.0, "from": start, "to": end}
        models = sorted(set(self.state.models) | set(rec.desired))
        if what == "plots":
            try:
                points = int(query.get("points") or cfg.plot_points)
            except ValueError:
                raise HttpError(400, f"points {query['points']!r} is not a number")
            if not 1 <= points <= cfg.plot_points_max:
                raise HttpError(400, f"points {points}: give 1 to {cfg.plot_points_max}")
            model = query.get("model") or (models[0] if models else "")
            if model and model not in models:
                raise HttpError(404, f"no model {model} in the log")
            return {**head, "model": model, "models": models, **series.plots(rec, model, start, end, points)}
        if what == "timeline":
            model = query.get("model") or ""
            if model and model not in models:
                raise HttpError(404, f"no model {model} in the log")
            return {**head, "lanes": series.timeline(rec, start, end, [model] if model else models, cfg.timeline_limit,
                                                     cfg.timeline_cells)}
        node = urllib.parse.unquote(what.removeprefix("gpus/"))
        if node not in self.state.nodes and node not in rec.segments:
            raise HttpError(404, f"no node {node}")
        return {**head, "node": node, "gpus": series.gpus(rec, self.state, node, start, end, cfg.timeline_limit)}

    @staticmethod
    def _seconds(query: dict, key: str) -> float | None:
        if not query.get(key):
            return None
        try:
            t = float(query[key])
        except ValueError:
            raise HttpError(400, f"{key} {query[key]!r} is not Unix seconds")
        if not 0 <= t <= MAX_TIME:  # (nor NaN: JSON has none to send back)
            raise HttpError(400, f"{key} {query[key]!r} is not Unix seconds")
        return t
    def followed(self, event: str) -> followup.Followed:
        if not event.isdigit():
            raise HttpError(400, f"event {event!r} is not a sequence number")
        seq = int(event)
        if seq < 1:
            raise HttpError(400, "event 0 is not in the log (the first is 1)")
        return followup.followed(self.records, self.state, seq, self._at_of(seq) or time.time(), time.time(),
                                 self.config.follow_settle_s)

    def _at_of(self, seq: int) -> float:
        """The time of the event at `seq` (0 when unknown)."""
        import bisect

        i = bisect.bisect_left(self.records, (seq,))
        if i < len(self.records) and self.records[i][0] == seq:
            try:
                return float(ev.decode(self.records[i][2]).at)
            except (msgspec.MsgspecError, AttributeError):
                return 0.0
        return 0.0

    @staticmethod
    def _filtered(query: dict) -> bool:
        return bool(query.get("replica") or query.get("node"))

    @staticmethod
    def _after(query: dict):
        return (int(query["after"]), -1) if query.get("after", "").isdigit() else None

    @staticmethod
    def _matches(row: dict, query: dict) -> bool:
        if query.get("replica") and row["replica"] != query["replica"]:
            return False
        if query.get("node") and query["node"] not in row["node"].split(","):
            return False
        return True

    def _read(self, how):
        if self.models is None:
            return []
        try:
            return how(self.models)
        except NoReadModels:
            return []

    # ------------------------------------------------------------- actions

    async def act(self, verb: str, args: dict) -> dict:
        """Publish one operator event, as `llmgw ctl` does; its sequence comes
        back, and the page then shows the decisions that followed it."""
        from ..ctl.changes import publish_event, restart_problem

        state = self.state
        now = time.time()
        if verb == "label":
            node = str(args.get("node", ""))
            if node not in state.nodes:
                raise HttpError(404, f"no node {node}")
            set_ = {str(k): str(v) for k, v in (args.get("set") or {}).items()}
            remove = [str(k) for k in (args.get("remove") or [])]
            for k, v in set_.items():
                if k not in facility_facts.KINDS or not NAME_RE.match(v):
                    raise HttpError(400, f"label {k}={v!r}: give one of {', '.join(facility_facts.KINDS)} and a name "
                                         "(letters, digits, _ and -)")
            for k in remove:
                if k not in facility_facts.KINDS:
                    raise HttpError(400, f"label {k}: give one of {', '.join(facility_facts.KINDS)}")
            if not set_ and not remove:
                raise HttpError(400, "nothing to set or remove")
            event: ev.Event = ev.NodeLabeled(at=now, node=node, set=set_, remove=remove)
        elif verb in ("hold", "release"):
            domain = str(args.get("domain", ""))
            kind, _, name = domain.partition("/")
            if kind not in facility_facts.KINDS or not NAME_RE.match(name):
                raise HttpError(400, f"domain {domain!r}: give KIND/NAME, KIND one of {', '.join(facility_facts.KINDS)}")
            if verb == "hold":
                event = ev.DomainHeld(at=now, domain=domain, drain=bool(args.get("drain")), reason=str(args.get("reason", "")))
            else:
                event = ev.DomainReleased(at=now, domain=domain)
        elif verb == "restart":
            rid = str(args.get("replica", ""))
            rep = self._read(lambda m: m.replica(rid))
            if not rep:
                raise HttpError(404, f"no replica {rid}")
            problem = restart_problem(rid, rep)
            if problem:
                raise HttpError(409, problem)
            event = ev.ReplicasRestart(at=now, replicas=[rid], in_place=bool(args.get("in_place")),
                                       max_surge=int(args.get("max_surge", 0) or 0))
        elif verb == "retry":
            name = str(args.get("model", ""))
            model = state.models.get(name)
            if model is None:
                raise HttpError(404, f"no model {name}")
            if not model.parked:
                raise HttpError(409, f"model {name} is not parked: nothing to retry")
            event = ev.ModelRetry(at=now, name=name)
        else:
            raise HttpError(404, f"no action {verb}")
        seq = await publish_event(self.bus, event)
        log.info("console: %s published as event %d", ev.tag_of(type(event)), seq)
        return {"seq": seq, "event": ev.tag_of(type(event)), "summary": summary(event)}


async def serve(nats: str, db: str | None, creds: str | None, token: str, config: ConsoleConfig,
                stop: asyncio.Event, *, on_ready=None) -> None:
    from ..bus.nats import NatsBus

    bus = await NatsBus.connect(nats, name="llmgw-console", forever=True, stop=stop, creds=creds)
    console = Console(bus, db, token, config)
    try:
        await bus.wait_for_streams(timeout=60)
        await console.start()
        if on_ready is not None:
            on_ready(console)
        await stop.wait()
    finally:
        await console.stop()
        await bus.close()


def token_from(path: str | None) -> str:
    """The token in `path` (made there, mode 0600, when missing); a new one without a path."""
    import os

    if not path:
        return new_token()
    p = Path(path)
    if p.exists():
        token = p.read_text().strip()
        if token:
            return token
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    token = new_token()
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def console_url(listen: str, port: int, token: str) -> str:
    host = "127.0.0.1" if listen in ("0.0.0.0", "::", "") else f"[{listen}]" if ":" in listen else listen
    return f"http://{host}:{port}/?token={token}"
