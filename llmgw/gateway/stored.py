"""Stored responses of the Responses API: where every gateway finds them.

A response asked with `store` (OpenAI's default) is kept in the NATS KV
bucket RESPONSES_BUCKET (bus/__init__.py), so `previous_response_id` is
answered by any gateway of the fleet, not only the one that served it. Each
record is the Response and the input items it answered, under
`<owner>.<response id>`, owner being a digest of the key's owner: a key
finds only its own owner's, and another owner's id is not found (404, as
an id that never was), never told apart.

A chain (`previous_response_id` of a response that had one) is walked back
record by record, each holding only its own turn, so a long conversation
costs no more per record than its longest turn. Bounds, in GatewayConfig:
a record past `max_stored_response` bytes is not stored (a marker is, so a
later `previous_response_id` to it says why it is missing), a chain past
`max_response_chain` is refused, and a record older than
`stored_response_ttl` is not found (the bucket's age limit drops it from
NATS after 30 days; a gateway may keep them shorter).

A put is not awaited by the answer it stores (translated.py says why): a
gateway asked for a response whose put it has under way waits for that put;
one that does not find a response looks again for up to `stored_miss_wait`
(another gateway's put may be landing), so an unknown id costs that long
before its 404.

Only gateways may put and get in the bucket (bus/roles.py); there is no
listing: a response is found by its id, which is 128 random bits.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time

from .chat_answer import BadRequest

log = logging.getLogger("llmgw.gateway")

VERSION = 1
LOCAL_OWNER = "local"  # a gateway without API keys: this machine's clients


def owner_prefix(owner: str | None) -> str:
    """The key's owner as a KV key token (owners may hold any character)."""
    if owner is None:
        return LOCAL_OWNER
    return "o" + hashlib.sha256(owner.encode()).hexdigest()[:32]


def key_of(owner: str | None, rid: str) -> str:
    return f"{owner_prefix(owner)}.{rid}"


def valid_id(rid: str) -> bool:
    """A response id as this gateway makes them (and nothing a KV key cannot hold)."""
    return rid.startswith("resp_") and 5 < len(rid) <= 64 and all(c.isalnum() or c in "_-" for c in rid)


def not_found(rid: str, param: str | None = "previous_response_id") -> BadRequest:
    return BadRequest(f"Response with id '{rid}' not found.", param, "response_not_found" if param is None else "previous_response_not_found", 404)


def record(response: dict, input_items: list, max_bytes: int, now: float | None = None) -> bytes:
    """What is stored for a response: it and its input, or (past `max_bytes`) a marker saying so."""
    data = json.dumps({"v": VERSION, "at": time.time() if now is None else now, "response": response, "input": input_items},
                      separators=(",", ":")).encode()  # fmt: skip
    if len(data) > max_bytes:
        return json.dumps({"v": VERSION, "at": time.time() if now is None else now, "too_large": len(data)}).encode()
    return data


class Stored:
    """The bucket, as a gateway uses it."""

    def __init__(self, bus, config) -> None:
        self.bus = bus
        self.config = config
        self.pending: dict[str, asyncio.Task] = {}  # puts under way, by key

    async def put(self, owner: str | None, response: dict, input_items: list) -> None:
        data = record(response, input_items, self.config.max_stored_response)
        await self.bus.put_stored(key_of(owner, response["id"]), data)

    def put_soon(self, owner: str | None, response: dict, input_items: list) -> None:
        """`put`, under way from now; a failure is logged (the answer was the client's already)."""
        key = key_of(owner, response["id"])
        task = asyncio.get_running_loop().create_task(self.put(owner, response, input_items))
        self.pending[key] = task

        def landed(t: asyncio.Task) -> None:
            if self.pending.get(key) is t:
                del self.pending[key]
            if not t.cancelled() and t.exception() is not None:
                log.warning("storing response %s failed: %s", response.get("id"), t.exception())

        task.add_done_callback(landed)

    async def _read(self, key: str) -> bytes | None:
        """The record under `key`: after this gateway's own put of it, if one is under way; looked for
        again, while `stored_miss_wait` lasts, if it is not there (another gateway's put landing)."""
        under_way = self.pending.get(key)
        if under_way is not None:
            await asyncio.wait([under_way])
        deadline = time.monotonic() + self.config.stored_miss_wait
        pause = 0.01
        while True:
            data = await self.bus.get_stored(key)
            if data is not None or time.monotonic() + pause > deadline:
                return data
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.1)

    async def delete(self, owner: str | None, rid: str) -> None:
        """Gone for good: a marker in its place (the bucket keeps no history)."""
        await self.bus.put_stored(key_of(owner, rid), json.dumps({"v": VERSION, "at": time.time(), "deleted": True}).encode())

    async def get(self, owner: str | None, rid: str, param: str | None = "previous_response_id") -> dict:
        """The record of `rid` for `owner`; BadRequest (404) when there is none for it."""
        if not valid_id(rid):
            raise not_found(rid, param)
        data = await self._read(key_of(owner, rid))
        if data is None:
            raise not_found(rid, param)
        try:
            rec = json.loads(data)
        except ValueError:
            raise not_found(rid, param) from None
        if rec.get("deleted") or time.time() - rec.get("at", 0) > self.config.stored_response_ttl:
            raise not_found(rid, param)
        if "too_large" in rec:
            raise BadRequest(
                f"Response '{rid}' was not stored: its {rec['too_large']} bytes are more than this gateway's "
                f"max_stored_response ({self.config.max_stored_response})", param, "response_not_stored",
            )  # fmt: skip
        return rec

    async def history(self, owner: str | None, rid: str) -> list[dict]:
        """The items of the chain ending at `rid`, oldest first: each response's input, then its output."""
        turns: list[list[dict]] = []
        seen = set()
        while rid:
            if len(turns) >= self.config.max_response_chain or rid in seen:
                raise BadRequest(
                    f"previous_response_id reaches back more than {self.config.max_response_chain} responses "
                    "(this gateway's max_response_chain)", "previous_response_id", "response_chain_too_long",
                )  # fmt: skip
            seen.add(rid)
            rec = await self.get(owner, rid)
            response = rec["response"]
            turns.append(list(rec.get("input") or []) + list(response.get("output") or []))
            rid = response.get("previous_response_id") or ""
        return [item for turn in reversed(turns) for item in turn]
