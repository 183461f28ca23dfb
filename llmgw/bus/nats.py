"""The bus on NATS JetStream.

Facts learned on this stack (nats-py 2.16, nats-server 2.15), each the reason
for a choice below:
- The log is read through an ordered push consumer (~160k msgs/s here);
  pull `fetch` managed ~23k/s.
- Decisions go out with plain `js.publish`: `publish_async` never resolves a
  publish refused for its expected sequence (nats.py#985).
- A publish that timed out may still have been stored, so it is retried with
  the same Nats-Msg-Id. A retry that carries an expected sequence is refused
  (10071) even when the first attempt landed, so a refused retry is resolved
  by comparing the Msg-Id of the last control message with ours.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Callable

import nats
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import (
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, KeyNotFoundError, NotFoundError

from . import catchup
from . import (
    COMMAND_PREFIX,
    COMMAND_STREAM,
    CONTROL_SUBJECTS,
    ENGINE_KEYS_BUCKET,
    HEARTBEAT_BUCKET,
    STREAM,
    SUBJECTS,
    Fenced,
    OnCommand,
    OnMessage,
)

log = logging.getLogger("llmgw.bus")

WRONG_LAST_SEQUENCE = 10071
# History is never dropped to make room: no age or count limit, and discard
# "new", so a full stream (at max_bytes, or when the server's JetStream
# storage is exhausted) refuses new writes, loudly, instead of deleting old
# ones. An operator sets a size (`max_bytes`) to be refused before the disk is.
DEFAULT_MAX_BYTES = -1
DUPLICATE_WINDOW_S = 120.0
PUBLISH_TRIES = 5
# Below this many messages, the fast reader's consumer set-up is not worth it.
CATCHUP_MIN = 1000


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


class _Sub:
    def __init__(self, sub) -> None:
        self._sub = sub

    async def stop(self) -> None:
        try:
            await self._sub.unsubscribe()
        except Exception:  # the connection may be gone already
            pass


class _Task:
    def __init__(self, task: asyncio.Task, watcher=None) -> None:
        self._task, self._watcher = task, watcher

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
        if self._watcher is not None:
            try:
                await self._watcher.stop()
            except Exception:
                pass


class NatsBus:
    def __init__(self, nc: nats.NATS, replicas: int = 1) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=5.0)
        self.replicas = replicas
        self._kv = None
        self._keys = None  # the engine keys bucket, once opened
        self._instance = uuid.uuid4().hex[:12]
        self.reconnected_at = 0.0  # wall clock of the last reconnect
        self.on_reconnect: list = []  # async callables run after a reconnect
        self._commands_sent = 0

    @classmethod
    async def connect(cls, url: str, *, name: str = "llmgw", forever: bool = False, replicas: int = 1) -> "NatsBus":
        """Connect; `forever` keeps reconnecting (agents and control planes),
        otherwise a clear error when nothing answers (the CLI)."""
        opts: dict = dict(servers=url.split(","), name=name)
        if forever:
            opts.update(max_reconnect_attempts=-1, reconnect_time_wait=0.5, allow_reconnect=True)
        else:
            opts.update(max_reconnect_attempts=1, reconnect_time_wait=0.25, connect_timeout=2, allow_reconnect=True)

        async def error_cb(e: Exception) -> None:
            log.debug("nats: %s", e)

        bus: NatsBus | None = None

        async def reconnected_cb() -> None:
            log.info("reconnected to NATS")
            if bus is not None:
                bus.reconnected_at = time.time()
                for hook in bus.on_reconnect:
                    await hook()

        try:
            nc = await nats.connect(error_cb=error_cb, reconnected_cb=reconnected_cb, **opts)
        except Exception as e:
            raise ConnectionError(f"cannot reach NATS at {url}: {e or type(e).__name__}") from None
        bus = cls(nc, replicas)
        return bus

    # ----------------------------------------------------------------- streams

    async def ensure_streams(self) -> None:
        await self._ensure(log_stream_config(replicas=self.replicas))
        await self._ensure(command_stream_config(self.replicas))
        try:
            self._kv = await self.js.key_value(HEARTBEAT_BUCKET)
        except Exception:
            self._kv = await self.js.create_key_value(
                KeyValueConfig(bucket=HEARTBEAT_BUCKET, history=1, storage=StorageType.FILE, replicas=self.replicas)
            )
        try:
            self._keys = await self.js.key_value(ENGINE_KEYS_BUCKET)
        except Exception:
            # Direct gets: a read names the key in its subject
            # ($JS.API.DIRECT.GET.KV_LLMGW_ENGINE_KEYS.$KV.LLMGW_ENGINE_KEYS.<key>), so permissions can say who reads what.
            self._keys = await self.js.create_key_value(
                KeyValueConfig(
                    bucket=ENGINE_KEYS_BUCKET, history=1, storage=StorageType.FILE, replicas=self.replicas, direct=True
                )
            )

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
        """For processes that do not own the streams: wait until they exist."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                await self.js.stream_info(STREAM)
                await self.js.stream_info(COMMAND_STREAM)
                self._kv = await self.js.key_value(HEARTBEAT_BUCKET)
                return
            except Exception:
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError("the llmgw streams do not exist: is the control plane running?")
                await asyncio.sleep(0.2)

    # ----------------------------------------------------------------- the log

    async def publish(self, subject: str, data: bytes, *, msg_id: str, expect_control_seq: int | None = None) -> int:
        headers = {"Nats-Msg-Id": msg_id}
        if expect_control_seq is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expect_control_seq)
            headers["Nats-Expected-Last-Subject-Sequence-Subject"] = CONTROL_SUBJECTS
        timed_out = False
        for attempt in range(PUBLISH_TRIES):
            try:
                ack = await self.js.publish(subject, data, stream=STREAM, headers=headers)
                return ack.seq
            except APIError as e:
                if e.err_code != WRONG_LAST_SEQUENCE:
                    raise
                if timed_out:
                    seq = await self._landed(msg_id)
                    if seq:
                        return seq
                raise Fenced(e.description or "wrong last sequence") from None
            except (NatsTimeout, asyncio.TimeoutError):
                timed_out = True
                await asyncio.sleep(0.2 * (attempt + 1))
        raise TimeoutError(f"publish to {subject} timed out {PUBLISH_TRIES} times")

    async def _landed(self, msg_id: str) -> int:
        """The sequence of the last control message if it carries `msg_id`."""
        try:
            msg = await self.js.get_last_msg(STREAM, CONTROL_SUBJECTS)
        except NotFoundError:
            return 0
        return msg.seq if (msg.headers or {}).get("Nats-Msg-Id") == msg_id else 0

    async def last_seq(self) -> int:
        try:
            info = await self.js.stream_info(STREAM)
        except NotFoundError:
            raise LookupError(f"there is no {STREAM} stream on this NATS: has a control plane run against it?") from None
        return info.state.last_seq

    async def log_id(self) -> str:
        info = await self.js.stream_info(STREAM)
        return f"{STREAM}@{info.created}"

    async def follow(self, start_seq: int, on_message: OnMessage) -> _Sub:
        # A long stretch is read by the fast reader first; nats-py's ordered
        # consumer then follows from where it stopped.
        last = await self.last_seq()
        if last - start_seq >= CATCHUP_MIN and self.nc.connected_url is not None:
            url = self.nc.connected_url.geturl()
            try:
                start_seq = await catchup.read_range(url, STREAM, max(start_seq, 1), last, on_message) + 1
            except catchup.Unsupported as e:
                log.debug("fast catch-up not possible here: %s", e)
            except catchup.Interrupted as e:
                log.warning("fast catch-up stopped at %d (%s); the client reads the rest", e.delivered, e)
                start_seq = e.delivered + 1
            except (OSError, asyncio.TimeoutError) as e:  # before anything was read
                log.warning("fast catch-up not possible (%s); the client reads it all", e)
        return await self._follow_with_client(start_seq, on_message)

    async def _follow_with_client(self, start_seq: int, on_message: OnMessage) -> _Sub:
        if start_seq <= 1:
            config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
        else:
            config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq)

        async def cb(msg) -> None:
            # The stream sequence is the 6th token of a v1 ack subject
            # ($JS.ACK.<stream>.<consumer>.<delivered>.<sseq>...) and the 8th
            # of a v2 one; parsing it here is cheaper than msg.metadata.
            tokens = msg.reply.split(".")
            seq = int(tokens[5] if len(tokens) == 9 else tokens[7])
            on_message(seq, msg.subject, msg.data)

        sub = await self.js.subscribe(
            "llmgw.>", stream=STREAM, ordered_consumer=True, config=config, cb=cb, pending_msgs_limit=-1
        )
        return _Sub(sub)

    async def read_matching(self, subjects: str) -> list[tuple[int, str, bytes]]:
        # The server counts the matching messages, so the read knows where it
        # ends (and an empty answer costs no consumer at all).
        try:
            info = await self.js.stream_info(STREAM, subjects_filter=subjects)
        except NotFoundError:
            raise LookupError(f"there is no {STREAM} stream on this NATS: has a control plane run against it?") from None
        want = sum((info.state.subjects or {}).values())
        records: list[tuple[int, str, bytes]] = []
        if not want:
            return records
        done = asyncio.Event()

        async def cb(msg) -> None:
            meta = msg.metadata
            records.append((meta.sequence.stream, msg.subject, msg.data))
            if meta.num_pending == 0 or len(records) >= want:
                done.set()

        sub = await self.js.subscribe(
            subjects, stream=STREAM, ordered_consumer=True, cb=cb, pending_msgs_limit=-1,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        )
        try:
            await done.wait()
        finally:
            await sub.unsubscribe()
        return records

    # ----------------------------------------------------------------- commands

    async def send_command(self, node: str, data: bytes) -> None:
        # A fresh id per send: a re-send is meant to arrive again (agents
        # dedupe by shard and generation), a retried publish is not.
        self._commands_sent += 1
        msg_id = f"cmd-{self._instance}-{self._commands_sent}"
        await self.js.publish(f"{COMMAND_PREFIX}.{node}", data, stream=COMMAND_STREAM, headers={"Nats-Msg-Id": msg_id})

    async def follow_commands(self, node: str, on_command: OnCommand) -> _Sub:
        async def cb(msg) -> None:
            on_command(msg.data)

        sub = await self.js.subscribe(
            f"{COMMAND_PREFIX}.{node}",
            stream=COMMAND_STREAM,
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW),
            cb=cb,
        )
        return _Sub(sub)

    # ----------------------------------------------------------------- heartbeats

    async def beat(self, node: str, data: bytes) -> None:
        if self._kv is None:
            self._kv = await self.js.key_value(HEARTBEAT_BUCKET)
        await self._kv.put(node, data)

    async def follow_heartbeats(self, on_beat: Callable[[str], None]) -> _Task:
        if self._kv is None:
            self._kv = await self.js.key_value(HEARTBEAT_BUCKET)
        watcher = await self._kv.watchall()

        async def run() -> None:
            async for entry in watcher:
                if entry is not None and entry.key:
                    on_beat(entry.key)

        return _Task(asyncio.create_task(run()), watcher)

    # ----------------------------------------------------------------- engine keys

    async def _engine_keys(self):
        if self._keys is None:
            self._keys = await self.js.key_value(ENGINE_KEYS_BUCKET)
        return self._keys

    async def put_engine_key(self, name: str, key: str) -> None:
        await (await self._engine_keys()).put(name, key.encode())

    async def engine_key(self, name: str) -> str | None:
        try:
            entry = await (await self._engine_keys()).get(name)
        except KeyNotFoundError:
            return None
        return entry.value.decode() if entry.value else None

    async def delete_engine_key(self, name: str) -> None:
        await (await self._engine_keys()).delete(name)

    async def close(self) -> None:
        """Drain what is pending; with the server gone, just let go."""
        try:
            await asyncio.wait_for(self.nc.drain(), 5.0)
        except Exception:
            try:
                await self.nc.close()
            except Exception:
                pass
