"""The bus: how the shell reaches the log, the agents' commands and heartbeats.

`Bus` is the interface; `NatsBus` is JetStream, `MemoryBus` an in-process
stand-in with the same semantics (deduplication by message id, fencing on the
control plane's subjects) for unit tests of the shell. Nothing in the pure
core imports this package.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Protocol, TypeVar

T = TypeVar("T")

STREAM = "LLMGW"
# Who speaks is in the subject: agents under their node, operators under ctl,
# gateways under gw, the control plane's decisions under control.
SUBJECTS = ["llmgw.agent.>", "llmgw.ctl.>", "llmgw.gw.>", "llmgw.control.>"]
# The control plane fences on its own subjects only: agents publish all the
# time, so a stream-wide expected sequence would refuse almost every decision.
CONTROL_SUBJECTS = "llmgw.control.>"

# Where each gateway says where it sent each prompt (gateway/hints.py): core
# NATS, not the log (soft state: lost when no one listens, never replayed);
# gateway G publishes on HINTS_PREFIX.G only, gateways alone read them.
HINTS_PREFIX = "llmgw.hint"

COMMAND_STREAM = "LLMGW_CMD"
COMMAND_PREFIX = "llmgw.cmd"
HEARTBEAT_BUCKET = "llmgw-heartbeats"
# The control planes' lease (leader election): a KV bucket with a TTL. The
# leader holds LEASE_KEY (created to campaign, updated with its last
# revision to renew); each standby keeps `standby.<id>` saying how far it has
# folded. Only control planes write it; `llmgw ctl get leader` reads it.
LEADER_BUCKET = "LLMGW_LEADER"
LEASE_KEY = "leader"

# Each engine's key (engines.py), put by its node's agent, read by gateways:
# the only ones who may read it (NATS permissions: the agent of node N may put
# and delete keys under `N.`; gateways may read), never in the log.
ENGINE_KEYS_BUCKET = "LLMGW_ENGINE_KEYS"
# Stored responses of the Responses API (`store`, `previous_response_id`:
# gateway/stored.py): written and read by gateways only (NATS permissions),
# each under its owner's prefix, gone after STORED_RESPONSES_TTL_S (the
# bucket's age limit; a gateway may keep them shorter, GatewayConfig).
RESPONSES_BUCKET = "LLMGW_RESPONSES"
STORED_RESPONSES_TTL_S = 30 * 24 * 3600.0  # OpenAI keeps a stored response 30 days
# The limits every gateway holds together (gateway/shared_limits.py): one
# counter a key, written and read by gateways only (NATS permissions), each
# changed by compare-and-set. A counter not written for QUOTAS_TTL_S is gone,
# which is right for all of them: a rate's bucket is full again, a day's or
# a month's window is over.
QUOTAS_BUCKET = "LLMGW_QUOTAS"
QUOTAS_TTL_S = 35 * 24 * 3600.0


class Conflict(Exception):
    """A compare-and-set lost: the value moved since it was read."""
_KEY_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def engine_key_name(node: str, shard: str, generation: int) -> str:
    """The bucket's key for the engine of `shard` at `generation` on `node`:
    `<node>.<shard>.<generation>`, the shard with every byte outside
    `A-Za-z0-9-_` written `=XX` (a KV key allows only `-/_=.a-zA-Z0-9`,
    shard ids may hold `:` and `.`), so exactly three tokens, one per part."""
    return f"{node}.{kv_token(shard)}.{generation}"


def kv_token(text: str) -> str:
    """`text` as one token of a KV key: every byte outside `A-Za-z0-9-_` written `=XX`."""
    return "".join(c if c in _KEY_SAFE else "".join(f"={b:02X}" for b in c.encode()) for c in text)


OnMessage = Callable[[int, str, bytes], None]
OnCommand = Callable[[bytes], None]


class Fenced(Exception):
    """A decision was refused: the control subjects moved past what it was decided on.

    Another writer published, or this one had not folded its own last
    decision yet. Either way: fold what was missed and decide again.
    """


class BusUnavailable(TimeoutError):
    """NATS did not answer in time, or JetStream had no leader for a stream
    (an election): the bus is in trouble, which says nothing about whether
    the streams exist."""


class LeaseTaken(Exception):
    """A lease write refused: the key is held by another (create), or is no
    longer at the revision we wrote (update: taken over, or expired)."""


class Lease(Protocol):
    """Keys that live `ttl` seconds after their last write (LEADER_BUCKET)."""

    async def create(self, key: str, value: bytes) -> int:
        """Write `key` if nobody holds it; its revision. LeaseTaken if held."""

    async def update(self, key: str, value: bytes, last: int) -> int:
        """Write `key` if it is still at revision `last`; LeaseTaken if not."""

    async def put(self, key: str, value: bytes) -> int: ...

    async def delete(self, key: str, last: int) -> None:
        """Let go of `key` if it is still at revision `last`."""

    async def entries(self) -> dict[str, bytes]:
        """Every live key and its value."""


class Follower(Protocol):
    async def stop(self) -> None: ...


class Bus(Protocol):
    async def ensure_streams(self) -> None:
        """Create the streams and buckets, or leave them as they are (idempotent)."""

    async def publish(self, subject: str, data: bytes, *, msg_id: str, expect_control_seq: int | None = None) -> int:
        """Append to the log; returns the sequence. With `expect_control_seq`,
        refused with `Fenced` unless that is the last sequence on the control
        subjects. A retried `msg_id` is not a second event."""

    async def last_seq(self) -> int: ...

    async def log_id(self) -> str:
        """What identifies this log: a stream deleted and created again under
        the same name is another log, and a snapshot of the old one is void."""

    async def follow(self, start_seq: int, on_message: OnMessage) -> Follower:
        """Call `on_message(seq, subject, data)` for every message from
        `start_seq` on, in order, then for each new one, until stopped."""

    async def read_matching(self, subjects: str) -> list[tuple[int, str, bytes]]:
        """Every message so far on the subjects matching a filter (e.g.
        `llmgw.ctl.>`), in order: what a few kinds of events say, without
        reading the whole log."""

    async def send_command(self, node: str, data: bytes) -> None: ...

    async def follow_commands(self, node: str, on_command: OnCommand) -> Follower: ...

    async def beat(self, node: str, data: bytes) -> None:
        """Record a node's heartbeat; only the latest per node is kept."""

    async def follow_heartbeats(self, on_beat: Callable[[str], None]) -> Follower: ...

    async def lease(self, ttl: float) -> Lease:
        """The control planes' lease bucket, made if missing."""

    async def put_engine_key(self, name: str, key: str) -> None:
        """Keep an engine's key under `name` (engine_key_name) in ENGINE_KEYS_BUCKET."""

    async def engine_key(self, name: str) -> str | None:
        """The engine key under `name`; None when there is none (raises when the bucket cannot be reached)."""

    async def delete_engine_key(self, name: str) -> None: ...

    async def put_stored(self, key: str, value: bytes) -> None:
        """Keep a stored response under `key` in RESPONSES_BUCKET."""

    async def get_stored(self, key: str) -> bytes | None:
        """The stored response under `key`; None when there is none (expired, never stored)."""

    async def quota_get(self, key: str) -> tuple[bytes | None, int]:
        """A counter of QUOTAS_BUCKET and its revision (None, 0 when there is none)."""

    async def quota_swap(self, key: str, value: bytes, revision: int) -> int:
        """Write a counter if still at `revision` (0: if there is none): its new revision, or Conflict."""

    async def close(self) -> None: ...


async def until_taken(what: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """Run `attempt` until the bus takes it (NATS down, it waits), warning
    `what` failed each time; its result."""
    import asyncio
    import logging

    delay = 0.1
    while True:
        try:
            return await attempt()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            logging.getLogger("llmgw.bus").warning("%s failed (%s); retrying", what, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def publish_fact(bus: Bus, event, msg_id: str) -> int:
    """Publish a fact an agent saw, retrying with the same Msg-Id until the
    bus takes it (a fact is never dropped: NATS down, it waits; a retry of
    one that landed is not a second event). Returns its sequence."""
    from ..core.contract import events as ev

    subject, data = ev.subject_for(event), ev.encode(event)
    return await until_taken(f"publishing {ev.tag_of(type(event))}", lambda: bus.publish(subject, data, msg_id=msg_id))


async def read_log(bus: Bus, start_seq: int = 1) -> list[tuple[int, str, bytes]]:
    """Every message of the log from `start_seq` to its end as of now."""
    import asyncio

    last = await bus.last_seq()
    records: list[tuple[int, str, bytes]] = []
    if last < start_seq:
        return records
    done = asyncio.Event()

    def on_message(seq: int, subject: str, data: bytes) -> None:
        if seq <= last:
            records.append((seq, subject, data))
        if seq >= last:
            done.set()

    follower = await bus.follow(start_seq, on_message)
    try:
        await done.wait()
    finally:
        await follower.stop()
    return records
