"""The APIs the gateway serves by translation onto chat completions:
OpenAI's `/v1/responses` (responses_api.py) and Anthropic's `/v1/messages`
and `/v1/messages/count_tokens` (anthropic_api.py).

A translated request goes the way of every chat request (edge.py
`Gateway.admit`: the model resolved, the key's access and limits, a replica
chosen, retries, waiting, load and usage reported): only its body is
made here, and its answer is rewritten on its way out.

The rewriting is at the client's transport (`Rewriter`): for the length of
one request, what the gateway writes to the client (an answer passed from
the engine, or the gateway's own error) is read back as the HTTP answer it
is and written in the translated API's shape: a stream's chunks as its
events, as they come; a whole answer at its end; an error in the API's own
error shape (Anthropic's on its paths, 401s and 503s included). So nothing
of the chat path knows about the translated APIs, and no answer can leave
in the wrong shape.

A stored response is put in the bucket (stored.py) as its answer's last
byte leaves, not before: waiting for the bucket's ack (an fsync, with
`sync_interval: always`) added 1.2-2.6 ms to every stored response's answer
(benchmarks/gateway.py), over the 1 ms this path may add. A client that
asks at once with `previous_response_id` is still answered: by this gateway
after the put it has under way, by another after `stored_miss_wait`'s
bounded look again (stored.py `Stored.get`).
"""

from __future__ import annotations

import asyncio
import json
import logging

import httptools

from . import anthropic_api, chat_answer, responses_api
from .chat_answer import BadRequest, SseReader
from .connection import Client, Request, _status_line
from .edge_limits import nests_deeper
from .stored import Stored

log = logging.getLogger("llmgw.gateway")

CHAT = b"/v1/chat/completions"
RESPONSES = b"/v1/responses"
MESSAGES, COUNT = anthropic_api.PATHS
PATHS = (RESPONSES, MESSAGES, COUNT)
RESPONSE_PREFIX = b"/v1/responses/"
_DROPPED = (b"content-length", b"transfer-encoding", b"content-type")


def serves(path: bytes) -> bool:
    return path in PATHS or path.startswith(RESPONSE_PREFIX)


anthropic = anthropic_api.serves


def _error_message(body: bytes) -> str:
    """The message of an error answer in OpenAI's shape (the gateway's own, or engine_errors')."""
    try:
        err = json.loads(body).get("error")
        return str(err.get("message") if isinstance(err, dict) else err)
    except (ValueError, AttributeError):
        return body[:300].decode(errors="replace") or "error"


# --------------------------------------------------------------------------- shapes of the answer


class Shape:
    """How one request's answer is rewritten (a chat answer in; the API's out)."""

    stream = False

    def error(self, status: int, body: bytes) -> bytes:
        return body  # OpenAI's shape already

    def whole(self, body: bytes) -> bytes:
        raise NotImplementedError

    def start(self) -> bytes:
        return self.events.start()

    def feed(self, data: bytes) -> bytes:
        out = self.events.feed(data)
        self.failed = self.events.failed
        return out

    def finish(self) -> bytes:
        return self.events.finish()

    events = None  # the API's Stream, when the answer is streamed
    failed = False
    done: dict | None = None  # the Response to store, once finished


class ErrorsOnly(Shape):
    """Before the request is read (its key, its JSON): only errors to rewrite."""

    def __init__(self, path: bytes) -> None:
        self.anthropic = anthropic(path)

    def error(self, status: int, body: bytes) -> bytes:
        return anthropic_api.error_body(status, _error_message(body)) if self.anthropic else body


class ResponsesShape(Shape):
    def __init__(self, req: dict, response: dict) -> None:
        self.req = req
        self.stream = bool(req.get("stream"))
        self.response = response
        self.events = responses_api.Stream(response) if self.stream else None

    def whole(self, body: bytes) -> bytes:
        self.done = responses_api.complete(self.response, chat_answer.whole(body))
        return json.dumps(self.done, separators=(",", ":")).encode()

    def finish(self) -> bytes:
        out, self.done = self.events.finish()
        return out


class MessagesShape(Shape):
    def __init__(self, req: dict, model: str, counting: bool) -> None:
        self.model = model
        self.counting = counting
        self.stream = bool(req.get("stream")) and not counting
        self.events = anthropic_api.Stream(model) if self.stream else None

    def error(self, status: int, body: bytes) -> bytes:
        return anthropic_api.error_body(status, _error_message(body))

    def whole(self, body: bytes) -> bytes:
        answer = chat_answer.whole(body)
        out = anthropic_api.count(answer) if self.counting else anthropic_api.message(answer, self.model)
        return json.dumps(out, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- the rewriting transport


class Rewriter:
    """The client's transport for one translated request: what is written to
    it is parsed as an HTTP answer (httptools) and written to the real
    transport in `shape`'s form. Everything else (close, abort, pause, its
    extra info) is the real transport's."""

    def __init__(self, client: Client, shape: Shape) -> None:
        self.client = client
        self.real = client.transport
        self.shape = shape
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[bytes] = []
        self.keep: list[bytes] = []  # a whole answer, until its end
        self.sse = SseReader()
        self.streaming = False
        self.done = False  # its answer complete: written as it is from here on
        self.on_done = None  # callable(shape) once its last bytes left, for a 200 (the store)
        client.transport = self

    # the real transport's, for everything but write
    def __getattr__(self, name):
        return getattr(self.real, name)

    def _out(self, data: bytes) -> None:
        if data:
            self.real.write(data)

    def write(self, data: bytes) -> None:
        if self.done:
            return self._out(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:  # the gateway wrote something that is not HTTP: a bug, said once
            log.error("translated answer could not be read back: %s", e)
            self.done = True
            self.real.abort()

    def close(self) -> None:
        self._restore()
        self.real.close()

    def abort(self) -> None:
        self._restore()
        self.real.abort()

    def _restore(self) -> None:
        self.done = True
        if self.client.transport is self:
            self.client.transport = self.real

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in _DROPPED:
            self.headers.append(b"%s: %s\r\n" % (name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status == 200 and self.shape.stream:
            self.streaming = True
            self._out(
                b"%sContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n%s\r\n"
                % (_status_line(200), b"".join(self.headers))
            )
            self._chunk(self.shape.start())

    def _chunk(self, data: bytes) -> None:
        if data:
            self._out(b"%x\r\n%s\r\n" % (len(data), data))

    def on_body(self, data: bytes) -> None:
        if not self.streaming:
            self.keep.append(data)
            return
        if self.shape.failed:
            return
        for event in self.sse.feed(data):
            self._chunk(self.shape.feed(event))

    def on_message_complete(self) -> None:
        shape = self.shape
        if self.streaming:
            if not shape.failed:
                for event in self.sse.rest():
                    self._chunk(shape.feed(event))
            last = b"" if shape.failed else shape.finish()
            self._finish(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last) if last else b"0\r\n\r\n")
            return
        body = b"".join(self.keep)
        status = self.status
        if status == 200:
            try:
                body = shape.whole(body)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                status, body = 502, shape.error(502, responses_api.error_body(502, f"the engine's answer could not be translated: {e}", code="upstream_error"))
        elif status >= 400:
            body = shape.error(status, body)
        self._finish(
            b"%sContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (_status_line(status), len(body), b"".join(self.headers), body)
        )

    def _finish(self, last: bytes) -> None:
        """The answer's last bytes; then its store, when it is one to keep."""
        self._out(last)
        self._restore()
        if self.on_done is not None and self.shape.done is not None and self.status == 200:
            self.on_done(self.shape)


# --------------------------------------------------------------------------- requests


def reply_error(gw, client: Client, req: Request, path: bytes, e: BadRequest) -> None:
    gw.metrics.answered("", "", e.status, 0.0)
    if anthropic(path):
        body = anthropic_api.error_body(e.status, e.message)
    else:
        body = responses_api.error_body(e.status, e.message, e.param, e.code)
    client.reply(req, e.status, body)


def start(gw, client: Client, req: Request, path: bytes) -> None:
    """A request on a translated path (edge.py `handle`)."""
    if path.startswith(RESPONSE_PREFIX):
        return _stored_request(gw, client, req, path)
    rewriter = Rewriter(client, ErrorsOnly(path))
    if req.method != b"POST":
        return reply_error(gw, client, req, path, BadRequest(f"{path.decode()} takes POST", status=405))
    ok, owner = gw.authenticate(client, req)
    if not ok:
        return
    depth = gw.config.max_json_depth
    if nests_deeper(req.body, depth):
        gw.metrics.edge("max_json_depth")
        return reply_error(gw, client, req, path, BadRequest(f"the request body nests deeper than {depth} levels (or is not JSON)", code="json_too_deep"))
    try:
        body = json.loads(req.body)
    except (ValueError, RecursionError):
        return reply_error(gw, client, req, path, BadRequest("We could not parse the JSON body of your request: it must be a JSON object.", code="invalid_json"))
    try:
        if path == RESPONSES:
            responses_api.check(body)
        else:
            anthropic_api.check(body, counting=path == COUNT)
    except BadRequest as e:
        return reply_error(gw, client, req, path, e)
    if path == RESPONSES and body.get("previous_response_id"):  # the chain first, from the bucket
        client.task = asyncio.get_running_loop().create_task(_continued(gw, client, req, body, owner, rewriter))
    else:  # nothing to wait for: on at once (a task less, a turn of the loop less)
        _send(gw, client, req, path, body, owner, rewriter, [])


async def _continued(gw, client: Client, req: Request, body: dict, owner: str | None, rewriter: Rewriter) -> None:
    """A response continuing a stored one: its chain read back, then sent."""
    try:
        history = await gw.stored.history(owner, body["previous_response_id"])
    except BadRequest as e:
        return reply_error(gw, client, req, RESPONSES, e)
    except asyncio.CancelledError:
        if not client.late:
            raise
        why = f"the request was not answered within {gw.config.request_timeout:g}s"
        return reply_error(gw, client, req, RESPONSES, BadRequest(why, code="request_timeout", status=504))
    except Exception as e:  # the bucket unreachable: said, not a hang
        log.warning("reading stored responses failed: %s", e)
        return reply_error(gw, client, req, RESPONSES, BadRequest(f"stored responses cannot be read now: {e}", code="store_unavailable", status=503))
    _send(gw, client, req, RESPONSES, body, owner, rewriter, history)


def _send(gw, client: Client, req: Request, path: bytes, body: dict, owner: str | None, rewriter: Rewriter, history: list) -> None:
    """The chat body made and sent down the chat path, its answer's shape set on `rewriter`."""
    model = body["model"]
    try:
        chat, rewriter.shape = _shape(path, body, model, history, owner, gw, rewriter)
    except BadRequest as e:
        return reply_error(gw, client, req, path, e)
    except (TypeError, AttributeError, KeyError, ValueError) as e:  # a shape the checks did not foresee: still the input's
        why = f"Invalid request body: {type(e).__name__}: {e}"
        return reply_error(gw, client, req, path, BadRequest(why, code="invalid_request"))
    gw.admit(client, req, CHAT, model, bool(chat.get("stream")), json.dumps(chat, separators=(",", ":")).encode(), owner)


def _shape(path: bytes, body: dict, model: str, history: list, owner, gw, rewriter: Rewriter) -> tuple[dict, Shape]:
    """(the chat body, how its answer is rewritten); a stored response's put set on `rewriter`."""
    if path != RESPONSES:
        return anthropic_api.to_chat(body, model, counting=path == COUNT), MessagesShape(body, model, path == COUNT)
    chat = responses_api.to_chat(body, model, history)
    shape = ResponsesShape(body, responses_api.skeleton(body, responses_api.new_id("resp"), model))
    if body.get("store", True):
        items = responses_api.input_items(body)
        rewriter.on_done = lambda s: gw.stored.put_soon(owner, s.done, items)
    return chat, shape


def _stored_request(gw, client: Client, req: Request, path: bytes) -> None:
    """GET (and DELETE) /v1/responses/{id}: a stored response, its owner's only."""
    rid = path[len(RESPONSE_PREFIX):].decode(errors="replace")
    if "/" in rid:
        return reply_error(gw, client, req, path, BadRequest(f"{path.decode(errors='replace')[:100]} is not served by this gateway", status=404))
    if req.method not in (b"GET", b"DELETE"):
        return reply_error(gw, client, req, path, BadRequest(f"{path.decode()}: this gateway serves GET and DELETE", status=405))
    ok, owner = gw.authenticate(client, req)
    if not ok:
        return

    async def answer() -> None:
        try:
            rec = await gw.stored.get(owner, rid, param=None)
            if req.method == b"DELETE":
                await gw.stored.delete(owner, rid)
                out = {"id": rid, "object": "response", "deleted": True}
            else:
                out = rec["response"]
        except BadRequest as e:
            return reply_error(gw, client, req, path, e)
        except Exception as e:
            return reply_error(gw, client, req, path, BadRequest(f"stored responses cannot be reached now: {e}", code="store_unavailable", status=503))
        gw.metrics.answered("", "", 200, 0.0)
        client.reply(req, 200, json.dumps(out, separators=(",", ":")).encode())

    client.task = asyncio.get_running_loop().create_task(answer())


def stored(gw) -> Stored:
    return Stored(gw.bus, gw.config)
