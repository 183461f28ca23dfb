"""An in-process bus with JetStream's semantics, for unit tests of the shell."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from . import CONTROL_SUBJECTS, Conflict, Fenced, LeaseTaken, OnCommand, OnMessage

_CONTROL_PREFIX = CONTROL_SUBJECTS[:-1]


class _Follower:
    def __init__(self, task: asyncio.Task) -> None:
        self._task = task

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


class MemoryLease:
    """Keys with a TTL, as a KV bucket with `ttl` keeps them (monotonic clock)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._keys: dict[str, tuple[int, bytes, float]] = {}  # key -> (revision, value, written at)
        self._revision = 0

    def _live(self, key: str) -> tuple[int, bytes, float] | None:
        got = self._keys.get(key)
        if got is not None and time.monotonic() - got[2] >= self.ttl:
            del self._keys[key]
            return None
        return got

    def _write(self, key: str, value: bytes) -> int:
        self._revision += 1
        self._keys[key] = (self._revision, value, time.monotonic())
        return self._revision

    async def create(self, key: str, value: bytes) -> int:
        if self._live(key) is not None:
            raise LeaseTaken(f"{key} is held")
        return self._write(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        got = self._live(key)
        if got is None or got[0] != last:
            raise LeaseTaken(f"{key} is not at revision {last}")
        return self._write(key, value)

    async def put(self, key: str, value: bytes) -> int:
        return self._write(key, value)

    async def delete(self, key: str, last: int) -> None:
        got = self._live(key)
        if got is not None and got[0] == last:
            del self._keys[key]

    async def entries(self) -> dict[str, bytes]:
        return {k: v[1] for k in list(self._keys) if (v := self._live(k)) is not None}


class _Unlisten:
    def __init__(self, listeners: list, listener) -> None:
        self.listeners, self.listener = listeners, listener

    async def unsubscribe(self) -> None:
        if self.listener in self.listeners:
            self.listeners.remove(self.listener)


class MemoryBus:
    def __init__(self) -> None:
        self.log: list[tuple[str, bytes]] = []  # index i holds sequence i + 1
        self._log_id = f"memory-{id(self)}"
        self._ids: dict[str, int] = {}
        self._control_seq = 0
        self._changed = asyncio.Condition()
        self._commands: dict[str, list[bytes]] = {}
        self.heartbeats: dict[str, bytes] = {}
        self._beat_log: list[str] = []
        self._lease: MemoryLease | None = None
        self.engine_keys: dict[str, str] = {}  # ENGINE_KEYS_BUCKET
        self.engine_keys_down = False  # a test's unreachable bucket
        self.stored: dict[str, bytes] = {}  # RESPONSES_BUCKET
        self.quotas: dict[str, tuple[bytes, int]] = {}  # QUOTAS_BUCKET: key -> (value, revision)
        self.quotas_down = False  # a test's unreachable bucket
        self._quota_revision = 0
        self._hint_listeners: list[Callable[[str, bytes], None]] = []

    async def ensure_streams(self) -> None:
        pass

    async def publish(self, subject: str, data: bytes, *, msg_id: str, expect_control_seq: int | None = None) -> int:
        while msg_id in self._ids:
            seq = self._ids[msg_id]
            if self.log[seq - 1] == (subject, data):
                return seq
            # Claimed by another publisher: as NatsBus, ours goes out under another id.
            msg_id += "-again"
        if expect_control_seq is not None and expect_control_seq != self._control_seq:
            raise Fenced(f"wrong last sequence: {self._control_seq}")
        self.log.append((subject, data))
        seq = len(self.log)
        self._ids[msg_id] = seq
        if subject.startswith(_CONTROL_PREFIX):
            self._control_seq = seq
        async with self._changed:
            self._changed.notify_all()
        return seq

    async def last_seq(self) -> int:
        return len(self.log)

    async def log_id(self) -> str:
        return self._log_id

    async def read_matching(self, subjects: str) -> list[tuple[int, str, bytes]]:
        prefix = subjects.removesuffix(">")
        return [(i, s, d) for i, (s, d) in enumerate(self.log, 1) if s.startswith(prefix)]

    async def follow(self, start_seq: int, on_message: OnMessage) -> _Follower:
        async def run() -> None:
            seq = max(start_seq, 1)
            while True:
                while seq <= len(self.log):
                    subject, data = self.log[seq - 1]
                    on_message(seq, subject, data)
                    seq += 1
                async with self._changed:
                    await self._changed.wait_for(lambda: seq <= len(self.log))

        return _Follower(asyncio.create_task(run()))

    async def send_command(self, node: str, data: bytes) -> None:
        self._commands.setdefault(node, []).append(data)
        async with self._changed:
            self._changed.notify_all()

    async def follow_commands(self, node: str, on_command: OnCommand) -> _Follower:
        start = len(self._commands.get(node, []))

        async def run() -> None:
            i = start
            while True:
                queue = self._commands.setdefault(node, [])
                while i < len(queue):
                    on_command(queue[i])
                    i += 1
                async with self._changed:
                    await self._changed.wait_for(lambda: i < len(self._commands.get(node, [])))

        return _Follower(asyncio.create_task(run()))

    async def beat(self, node: str, data: bytes) -> None:
        self.heartbeats[node] = data
        self._beat_log.append(node)
        async with self._changed:
            self._changed.notify_all()

    async def follow_heartbeats(self, on_beat: Callable[[str], None]) -> _Follower:
        async def run() -> None:
            i = 0
            while True:
                while i < len(self._beat_log):
                    on_beat(self._beat_log[i])
                    i += 1
                async with self._changed:
                    await self._changed.wait_for(lambda: i < len(self._beat_log))

        return _Follower(asyncio.create_task(run()))

    async def hint(self, gateway: str, data: bytes) -> None:
        for on_hint in list(self._hint_listeners):
            on_hint(gateway, data)

    async def follow_hints(self, on_hint: Callable[[str, bytes], None]):
        self._hint_listeners.append(on_hint)
        return _Unlisten(self._hint_listeners, on_hint)

    async def lease(self, ttl: float) -> MemoryLease:
        if self._lease is None:
            self._lease = MemoryLease(ttl)
        return self._lease

    async def put_engine_key(self, name: str, key: str) -> None:
        self._keys_reachable()
        self.engine_keys[name] = key

    async def engine_key(self, name: str) -> str | None:
        self._keys_reachable()
        return self.engine_keys.get(name)

    async def delete_engine_key(self, name: str) -> None:
        self._keys_reachable()
        self.engine_keys.pop(name, None)

    async def put_stored(self, key: str, value: bytes) -> None:
        self.stored[key] = value

    async def get_stored(self, key: str) -> bytes | None:
        return self.stored.get(key)

    async def quota_get(self, key: str) -> tuple[bytes | None, int]:
        if self.quotas_down:
            raise ConnectionError("the quotas bucket cannot be reached")
        return self.quotas.get(key, (None, 0))

    async def quota_swap(self, key: str, value: bytes, revision: int) -> int:
        if self.quotas_down:
            raise ConnectionError("the quotas bucket cannot be reached")
        if self.quotas.get(key, (None, 0))[1] != revision:
            raise Conflict(key)
        self._quota_revision += 1
        self.quotas[key] = (value, self._quota_revision)
        return self._quota_revision

    def _keys_reachable(self) -> None:
        if self.engine_keys_down:
            raise ConnectionError("the engine keys bucket cannot be reached")

    async def close(self) -> None:
        pass
