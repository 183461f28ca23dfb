"""The key-value buckets on NATS: the nodes' heartbeats (beaten,
followed, and whether they can be read now), the control planes' lease, the
engines' keys, the gateways' stored responses and their shared limits.

A mixin of nats.NatsBus, which owns the attributes it reads.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from nats.js.api import ConsumerConfig, DeliverPolicy, KeyValueConfig, StorageType
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError, NotFoundError

from . import ENGINE_KEYS_BUCKET, HEARTBEAT_BUCKET, LEADER_BUCKET, QUOTAS_BUCKET, RESPONSES_BUCKET, Conflict, LeaseTaken, buckets
from .nats_consumers import _Kept
from .nats_trouble import describe_trouble

STALL_PROBES = 3  # heartbeats_readable: probes in a row with nothing delivered before it is trouble


class _NatsLease:
    """The NATS docs' pattern: `create` to campaign (refused while the key
    lives), `update` with the last revision to renew (refused once another
    holds it, or it expired), the bucket's TTL to let a dead holder go."""

    def __init__(self, kv, ttl: float) -> None:
        self.kv = kv
        self.ttl = ttl  # the bucket's, whoever made it

    async def create(self, key: str, value: bytes) -> int:
        try:
            return await self.kv.create(key, value)
        except KeyWrongLastSequenceError as e:
            raise LeaseTaken(str(e)) from None

    async def update(self, key: str, value: bytes, last: int) -> int:
        try:
            return await self.kv.update(key, value, last=last)
        except KeyWrongLastSequenceError as e:
            raise LeaseTaken(str(e)) from None

    async def put(self, key: str, value: bytes) -> int:
        return await self.kv.put(key, value)

    async def delete(self, key: str, last: int) -> None:
        try:
            await self.kv.delete(key, last=last)
        except KeyWrongLastSequenceError:
            pass  # not ours any more: nothing to let go of

    async def entries(self) -> dict[str, bytes]:
        out = {}
        try:
            keys = await self.kv.keys()
        except NoKeysError:
            return out
        for key in keys:
            try:
                out[key] = (await self.kv.get(key)).value
            except KeyNotFoundError:  # expired meanwhile
                pass
        return out



class Buckets:
    """Heartbeats, the lease, engine keys, stored responses."""

    async def beat(self, node: str, data: bytes) -> None:
        if self._kv is None:
            self._kv = self._bucket(HEARTBEAT_BUCKET)
        await self._kv.put(node, data)

    async def beat_unacked(self, node: str, data: bytes) -> None:
        """A heartbeat without waiting for the bucket's ack: the same message
        on the same subject as `beat`, for a fleet simulator sending thousands
        a second on one connection, where awaiting each ack timed them out
        (a lost beat is what the grace is for)."""
        await self.nc.publish(f"$KV.{HEARTBEAT_BUCKET}.{node}", data)

    async def follow_heartbeats(self, on_beat: Callable[[str], None]) -> _Kept:
        if self._kv is None:
            self._kv = await self.js.key_value(HEARTBEAT_BUCKET)
        stream = f"KV_{HEARTBEAT_BUCKET}"
        prefix = len(f"$KV.{HEARTBEAT_BUCKET}.")

        async def last() -> int:
            return (await self.js.stream_info(stream)).state.last_seq

        async def subscribe(start: int, deliver):
            # The latest of each node first (as a KV watcher starts), then every beat;
            # following again after a stall too: only each node's latest beat
            # says anything, and re-reading every beat since the stall (70,000
            # of them behind 2,000 nodes) never caught up with a bucket moving
            # faster than it was read (benchmarks/fleet.py).
            config = ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)

            async def cb(msg) -> None:
                deliver(msg.metadata.sequence.stream, msg)

            return await self.js.subscribe(
                f"$KV.{HEARTBEAT_BUCKET}.>", stream=stream, ordered_consumer=True, config=config, cb=cb
            )

        def on_msg(seq: int, msg) -> None:
            self.beat_revision = max(self.beat_revision, seq)
            if not (msg.headers or {}).get("KV-Operation"):
                on_beat(msg.subject[prefix:])

        self._beats_created = (await self.js.stream_info(stream)).created
        self._beats = await _Kept(self, "the heartbeats", subscribe, last, on_msg, 1).start()
        return self._beats

    async def heartbeats_readable(self, timeout: float = 2.0) -> str:
        """"" when the heartbeats can be read now; else why not: our
        connection down, the bucket not answering (no stream leader), or the
        watcher delivering nothing while the bucket moved on."""
        if not self.nc.is_connected:
            return "our connection to NATS is down"
        try:
            info = await asyncio.wait_for(self.js.stream_info(f"KV_{HEARTBEAT_BUCKET}"), timeout)
        except NotFoundError:
            # A memory bucket is gone with its lone server's restart: made
            # again by a control plane (agents may not), its beats then
            # followed from its start at the next probe.
            if self.identity is None or self.identity.role == "control":
                try:
                    await asyncio.wait_for(self._make_bucket(self._heartbeat_config()), timeout)
                except Exception as e:
                    return f"the heartbeat bucket is missing and could not be made again ({describe_trouble(e)})"
                return "the heartbeat bucket was missing (its server restarted): made it again"
            return "the heartbeat bucket is missing"
        except Exception as e:
            return f"the heartbeat bucket does not answer ({describe_trouble(e)})"
        if self._beats is not None and info.created != self._beats_created:
            # Made again since we followed it (by us or another control
            # plane): what we knew of its sequences says nothing now.
            self._beats_created = info.created
            self.beat_revision, self._beat_probe, self._beat_stalls = 0, (0, 0), 0
            await self._beats.follow_anew()
            return "the heartbeat bucket was made again: following it from its start"
        last, (probed_last, probed_seen) = info.state.last_seq, self._beat_probe
        if probed_last == 0 or self.beat_revision != probed_seen or self.beat_revision >= last:
            self._beat_probe = (last, self.beat_revision)  # the watcher delivered: a new window
            self._beat_stalls = 0
            return ""
        # Nothing delivered since the window began while the bucket moved:
        # trouble only once that lasted STALL_PROBES probes. Judged on one, a
        # busy event loop (a long pass over 2,000 nodes, their 2,000 beats a
        # second queued behind it) read as a dead watcher every few seconds,
        # every node's grace began again each time, and a silent node took
        # 70 s to be declared lost instead of 10 (benchmarks/fleet.py).
        self._beat_stalls += 1
        if last > probed_last and self._beat_stalls >= STALL_PROBES:
            return f"the heartbeat watcher delivered nothing while the bucket moved from {probed_last} to {last}"
        return ""

    async def lease(self, ttl: float) -> "_NatsLease":
        """The control planes' lease bucket (LEADER_BUCKET), made if missing:
        every key in it lives `ttl` seconds after its last write."""
        kv = await buckets.make(
            self.js, KeyValueConfig(bucket=LEADER_BUCKET, history=1, ttl=ttl, storage=StorageType.FILE, replicas=self.replicas)
        )
        await buckets.harden(self.js, LEADER_BUCKET)  # one made by an older llmgw
        return _NatsLease(kv, (await kv.status()).ttl or ttl)

    async def read_lease(self) -> dict[str, bytes]:
        """The lease bucket's keys as they are, without making it: LookupError
        when no control plane ever campaigned on this NATS."""
        try:
            kv = await self._retrying("about the lease", lambda: self.js.key_value(LEADER_BUCKET))
        except NotFoundError:
            raise LookupError(f"there is no {LEADER_BUCKET} bucket: no control plane has run against this NATS") from None
        return await self._retrying("about the lease", _NatsLease(kv, 0.0).entries)

    # ----------------------------------------------------------------- engine keys

    # Without asking the server about the bucket: an agent may only put its
    # own keys and a gateway only read them (bus/roles.py), by subject.

    def _engine_keys(self):
        if self._keys is None:
            self._keys = self._bucket(ENGINE_KEYS_BUCKET, direct=True)
        return self._keys

    async def put_engine_key(self, name: str, key: str) -> None:
        await self._engine_keys().put(name, key.encode())

    async def engine_key(self, name: str) -> str | None:
        try:
            entry = await self._engine_keys().get(name)
        except KeyNotFoundError:
            return None
        return entry.value.decode() if entry.value else None

    async def delete_engine_key(self, name: str) -> None:
        await self._engine_keys().delete(name)

    # ----------------------------------------------------------------- stored responses

    def _stored(self):
        if self._responses is None:
            self._responses = self._bucket(RESPONSES_BUCKET, direct=True)
        return self._responses

    async def put_stored(self, key: str, value: bytes) -> None:
        await self._stored().put(key, value)

    async def get_stored(self, key: str) -> bytes | None:
        try:
            entry = await self._stored().get(key)
        except KeyNotFoundError:
            return None
        return entry.value or None

    # ----------------------------------------------------------------- shared limits

    def _quotas_bucket(self):
        if self._quotas is None:
            self._quotas = self._bucket(QUOTAS_BUCKET, direct=True)
        return self._quotas

    async def quota_get(self, key: str) -> tuple[bytes | None, int]:
        try:
            entry = await self._quotas_bucket().get(key)
        except KeyNotFoundError:
            return None, 0
        return entry.value, entry.revision or 0

    async def quota_swap(self, key: str, value: bytes, revision: int) -> int:
        kv = self._quotas_bucket()
        try:
            return await (kv.update(key, value, last=revision) if revision else kv.create(key, value))
        except KeyWrongLastSequenceError:
            raise Conflict(key) from None
