"""The streams and buckets on NATS: the log's stream (history, never
dropped), the commands' stream (kept a while), the heartbeat bucket (in
memory), the engine keys', stored responses' and shared limits' buckets; made by the
control plane, waited for by everyone else.

A mixin of nats.NatsBus, which owns the attributes it reads.
"""

from __future__ import annotations

import asyncio
import logging

from nats.js.api import DiscardPolicy, KeyValueConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError

from . import (
    COMMAND_PREFIX,
    COMMAND_STREAM,
    ENGINE_KEYS_BUCKET,
    HEARTBEAT_BUCKET,
    QUOTAS_BUCKET,
    QUOTAS_TTL_S,
    RESPONSES_BUCKET,
    STORED_RESPONSES_TTL_S,
    STREAM,
    SUBJECTS,
    BusUnavailable,
    buckets,
)
from .nats_trouble import describe_trouble, stream_missing

log = logging.getLogger("llmgw.bus")

# History is never dropped to make room: no age or count limit, and discard
# "new", so a full stream (at max_bytes, or when the server's JetStream
# storage is exhausted) refuses new writes, loudly, instead of deleting old
# ones. An operator sets a size (`max_bytes`) to be refused before the disk is.
DEFAULT_MAX_BYTES = -1
DUPLICATE_WINDOW_S = 120.0


def log_stream_config(max_bytes: int = DEFAULT_MAX_BYTES, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=STREAM,
        description="llmgw: every fact and decision, forever",
        subjects=SUBJECTS,
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_msgs=-1,
        max_bytes=max_bytes,
        max_age=0,
        discard=DiscardPolicy.NEW,
        duplicate_window=DUPLICATE_WINDOW_S,
        deny_delete=True,
        deny_purge=True,
        num_replicas=replicas,
        max_msg_size=-1,
    )


def command_stream_config(replicas: int = 1) -> StreamConfig:
    # Commands are not history: they follow from the log and are re-sent when
    # outstanding, so they are kept only a while.
    return StreamConfig(
        name=COMMAND_STREAM,
        subjects=[f"{COMMAND_PREFIX}.>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=600.0,
        discard=DiscardPolicy.OLD,
        duplicate_window=DUPLICATE_WINDOW_S,
        num_replicas=replicas,
    )


class Streams:
    """Making the streams and buckets, or waiting for them."""

    async def ensure_streams(self) -> None:
        """Create the streams and buckets, or leave them as they are. A
        process that runs forever tries again, without end, while the bus is
        in trouble (an election, a server away): it says so, never exits."""
        await self._retrying("about the streams", self._ensure_streams_once)

    async def _ensure_streams_once(self) -> None:
        if self.identity is not None and self.identity.role != "control":
            # Only the control plane may make streams; an agent may not even
            # look (it publishes facts, retried until the streams exist).
            if self.identity.role in ("agent", "fleet"):  # (a fleet simulator: many agents' facts)
                self._kv = self._bucket(HEARTBEAT_BUCKET)
            else:
                await self.wait_for_streams()
            return
        await self._ensure(log_stream_config(replicas=self.replicas))
        await self._ensure(command_stream_config(self.replicas))
        self._kv = await self._make_heartbeat_bucket()
        # Direct gets: a read names the key in its subject
        # ($JS.API.DIRECT.GET.KV_LLMGW_ENGINE_KEYS.$KV.LLMGW_ENGINE_KEYS.<key>), so permissions can say who reads what.
        self._keys = await self._make_bucket(
            KeyValueConfig(bucket=ENGINE_KEYS_BUCKET, history=1, storage=StorageType.FILE, replicas=self.replicas, direct=True)
        )
        # Stored responses (gateway/stored.py): on disk, each gone after the TTL; read by key, direct.
        await self._make_bucket(
            KeyValueConfig(bucket=RESPONSES_BUCKET, history=1, ttl=STORED_RESPONSES_TTL_S, storage=StorageType.FILE,
                           replicas=self.replicas, direct=True)
        )  # fmt: skip
        # The gateways' shared limits (gateway/shared_limits.py): on disk (a
        # month's budget outlives a restart), read by key, direct.
        await self._make_bucket(
            KeyValueConfig(bucket=QUOTAS_BUCKET, history=1, ttl=QUOTAS_TTL_S, storage=StorageType.FILE,
                           replicas=self.replicas, direct=True)
        )  # fmt: skip
        for bucket in (HEARTBEAT_BUCKET, ENGINE_KEYS_BUCKET, RESPONSES_BUCKET, QUOTAS_BUCKET):
            await buckets.harden(self.js, bucket)  # one made by an older llmgw

    def _heartbeat_config(self) -> KeyValueConfig:
        """Heartbeats live in memory: they are not history (only each node's
        latest says anything, and the log has every fact a decision read), and
        on disk 2,000 nodes beating every second asked for 2,000 fsynced
        stores a second, under which beats came late and nodes were declared
        lost that were not (benchmarks/fleet.py). A memory bucket does not
        outlive a lone server's restart: `heartbeats_readable` makes it again."""
        return KeyValueConfig(bucket=HEARTBEAT_BUCKET, history=1, storage=StorageType.MEMORY, replicas=self.replicas)

    async def _make_heartbeat_bucket(self):
        kv = await self._make_bucket(self._heartbeat_config())
        info = await self.js.stream_info(f"KV_{HEARTBEAT_BUCKET}")
        if info.config.storage != StorageType.MEMORY:
            # Made on disk by an older llmgw: made again in memory. Nothing of
            # worth is lost (the next beats say it all again); a control plane
            # reading it meanwhile sees the bucket not answer, and declares
            # no node lost while it does not (heartbeats_readable).
            log.info("the heartbeat bucket is on disk: making it again in memory")
            try:
                await self.js.delete_stream(f"KV_{HEARTBEAT_BUCKET}")
            except NotFoundError:
                pass  # another control plane did it first
            kv = await self._make_bucket(self._heartbeat_config())
        return kv

    async def _make_bucket(self, config: KeyValueConfig):
        """A KV bucket, made as `config` says if missing (left as it is if there),
        with no rollups or purges (bus/buckets.py)."""
        return await buckets.make(self.js, config)

    def _bucket(self, bucket: str, direct: bool = False):
        """A handle on a bucket without asking the server about it (`direct`:
        gets by subject, for a bucket made with direct access)."""
        from nats.js.kv import KeyValue

        return KeyValue(name=bucket, stream=f"KV_{bucket}", pre=f"$KV.{bucket}.", js=self.js, direct=direct)

    async def _ensure(self, config: StreamConfig) -> None:
        try:
            await self.js.stream_info(config.name)
            return  # exists: leave its limits as an operator may have grown them
        except NotFoundError:
            pass
        try:
            await self.js.add_stream(config)
        except APIError as e:
            if e.err_code != 10058:  # created meanwhile by another process
                raise

    async def wait_for_streams(self, timeout: float = 30.0) -> None:
        """For processes that do not own the streams: wait until they exist.

        Tried again until `timeout` whatever the answer; then the error says
        what the last answer was: the streams missing (no control plane has
        made them), or the bus in trouble (electing a stream leader, or
        unreachable), which says nothing about whether they exist."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                await self.js.stream_info(STREAM)
                await self.js.stream_info(COMMAND_STREAM)
                self._kv = await self.js.key_value(HEARTBEAT_BUCKET)
                return
            except Exception as e:
                if asyncio.get_running_loop().time() > deadline and self.forever:
                    # A component waits for the control plane as long as it takes.
                    log.warning("still waiting for the llmgw streams (%s)", describe_trouble(e))
                    deadline += timeout
                elif asyncio.get_running_loop().time() > deadline:
                    if stream_missing(e):
                        raise TimeoutError("the llmgw streams do not exist: is the control plane running?") from None
                    raise BusUnavailable(
                        f"NATS did not answer about the llmgw streams in {timeout:g}s ({describe_trouble(e)}): "
                        "the bus is electing a stream leader, or is unreachable"
                    ) from None
                await asyncio.sleep(0.2)
