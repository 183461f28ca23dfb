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
import os
import ssl
import time
import uuid
from typing import Callable

import nats
from nats.errors import NoRespondersError
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
from nats.js.errors import (
    APIError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoKeysError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)

from . import accounts, auth, buckets, catchup, msgids
from . import (
    COMMAND_PREFIX,
    COMMAND_STREAM,
    CONTROL_SUBJECTS,
    ENGINE_KEYS_BUCKET,
    HEARTBEAT_BUCKET,
    LEADER_BUCKET,
    QUOTAS_BUCKET,
    QUOTAS_TTL_S,
    RESPONSES_BUCKET,
    STORED_RESPONSES_TTL_S,
    STREAM,
    SUBJECTS,
    BusUnavailable,
    Conflict,
    Fenced,
    LeaseTaken,
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
# Trying NATS again at start (and the streams, for a process that runs
# forever): from the first pause, doubled up to the longest, without end.
FOLLOW_CHECK_S = 2.0
STALL_PROBES = 3  # heartbeats_readable: probes in a row with nothing delivered before it is trouble  # how often a follower looks whether its consumer stalled (_Kept)
RETRY_FIRST_S = 0.5
RETRY_LONGEST_S = 5.0
STREAM_NOT_FOUND = 10059
# What a bus in trouble answers (no stream leader during an election, a
# server gone): worth trying again, and never a sign that a stream is missing.
TROUBLE = (NatsTimeout, asyncio.TimeoutError, NoRespondersError, NoStreamResponseError, ServiceUnavailableError)


def is_trouble(e: BaseException) -> bool:
    """Whether an error is the bus in trouble (try again) rather than an answer."""
    if isinstance(e, TROUBLE):
        return True
    # 503 and "JetStream system temporarily unavailable" (10008) mid-election;
    # "no suitable peers for placement" (10005) while a server of the cluster
    # is down (a bucket made then: a gateway exited on it when the stream
    # leader was killed). 429 "too many requests": the JetStream API busy
    # under a flood (a `ctl apply` died of it with a traceback: issue 35).
    return isinstance(e, APIError) and (e.code in (503, 429) or e.err_code in (10008, 10005))


def stream_missing(e: BaseException) -> bool:
    return isinstance(e, NotFoundError) and (e.err_code in (STREAM_NOT_FOUND, None) or "not found" in str(e.description))


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
    """A plain subscription (an agent's commands: see follow_commands)."""

    def __init__(self, sub) -> None:
        self._sub = sub

    async def stop(self) -> None:
        try:
            await self._sub.unsubscribe()
        except Exception:  # the connection may be gone already
            pass


class _Kept:
    """An ordered consumer kept alive by us as well as by nats-py.

    nats-py resets an ordered consumer after two missed idle heartbeats
    (10 s), once: when its stream had no leader then (the stream leader's
    server killed, an election under way) the new consumer is not made, and
    the follower stays silent for good while the stream moves on. So every
    FOLLOW_CHECK_S this asks where the stream stands; when it is past what
    was delivered and nothing came since the last look, the consumer is made
    again from the next sequence. Messages are handed on once each, in
    order: a sequence at or below the last delivered is dropped (the two
    resets may overlap).
    """

    def __init__(self, bus: "NatsBus", what: str, subscribe, last_seq, on_msg, start_seq: int) -> None:
        self.bus, self.what = bus, what
        self._subscribe, self._last_seq, self._on_msg = subscribe, last_seq, on_msg
        self.delivered = start_seq - 1  # the last sequence handed on
        self._sub = None
        self._task: asyncio.Task | None = None
        self.restarts = 0

    async def start(self) -> "_Kept":
        self._sub = await self._subscribe(self.delivered + 1, self._deliver)
        self._task = asyncio.create_task(self._watch())
        return self

    def _deliver(self, seq: int, msg) -> None:
        if seq <= self.delivered:
            return
        self.delivered = seq
        self._on_msg(seq, msg)

    async def _watch(self) -> None:
        seen = self.delivered
        while True:
            await asyncio.sleep(FOLLOW_CHECK_S)
            if self.delivered != seen:
                seen = self.delivered
                continue
            try:
                last = await asyncio.wait_for(self._last_seq(), FOLLOW_CHECK_S)
            except Exception:
                continue  # the bus in trouble: look again later
            if last <= self.delivered:
                continue
            log.warning(
                "%s: nothing delivered past %d while the stream is at %d; following again from %d",
                self.what, self.delivered, last, self.delivered + 1,
            )  # fmt: skip
            await self._follow_again()

    async def _follow_again(self) -> None:
        old, self._sub = self._sub, None
        try:
            await old.unsubscribe()
        except Exception:
            pass
        try:
            self._sub = await self._subscribe(self.delivered + 1, self._deliver)
            self.restarts += 1
        except Exception as e:
            log.warning("%s: could not follow again yet (%s)", self.what, describe_trouble(e))
            self._sub = old  # try again at the next look

    async def follow_anew(self) -> None:
        """Its stream was made again (a memory bucket after its server's
        restart): its sequences begin again at 1, so all are followed from
        there, where the old last delivered would drop every one as seen."""
        self.delivered = 0
        await self._follow_again()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:
                pass


def _from(start_seq: int) -> ConsumerConfig:
    if start_seq <= 1:
        return ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    return ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq)


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


class NatsBus:
    def __init__(self, nc: nats.NATS, replicas: int = 1, identity: "auth.Identity | None" = None) -> None:
        self.nc = nc
        self.identity = identity  # who the server knows us as (None: no auth, or a credential llmgw did not issue)
        self.creds = None  # the .creds file connected with
        self.js = nc.jetstream(timeout=5.0)
        self.replicas = replicas
        self._kv = None
        self._keys = None  # the engine keys bucket, once opened
        self._responses = None  # the stored responses bucket, once opened
        self._quotas = None  # the shared limits' bucket, once opened
        self._instance = uuid.uuid4().hex[:12]
        self.reconnected_at = 0.0  # wall clock of the last reconnect
        self.on_reconnect: list = []  # async callables run after a reconnect
        self._commands_sent = 0
        self.forever = False
        self.beat_revision = 0  # the heartbeat bucket's last revision the watcher delivered
        self._beat_probe = (0, 0)  # (bucket's last revision, watcher's) when the watcher last delivered
        self._beat_stalls = 0  # probes since, the bucket moving
        self._beats: _Kept | None = None  # the heartbeat watcher, once following
        self._beats_created = None  # when the bucket it follows was made (another time: made again)
        self._closing = False
        # close() drains what is pending first (up to 5 s). Not the CLI: it has nothing pending by then, and
        # nats-py's drain of a frozen NATS neither ends nor heeds a cancel (a `ctl apply --timeout 5` hung on it).
        self.drain_at_close = True
        self._commands_opts: dict = {}  # how _commander connects (as _connect_once did, but the credential)
        self._commands_nc = None  # the control plane's connection in NODES, once opened

    @classmethod
    async def connect(
        cls, url: str, *, name: str = "llmgw", forever: bool = False, replicas: int = 1, creds: str | None = None,
        stop: asyncio.Event | None = None,
    ) -> "NatsBus":
        """Connect; `forever` (every component: agents, control planes,
        gateways, the projector) tries at start until NATS answers, with a
        growing pause, saying so each time, and keeps reconnecting after;
        otherwise a clear error when nothing answers (the CLI). With `stop`
        set while it waits, ConnectionError.

        `creds`: a NATS .creds file (llmgw/bus/auth.py); the connection then
        speaks as that user, its replies under its own inbox prefix. A
        credential the server refuses raises `auth.CredentialRefused` at once,
        `forever` or not (trying again changes nothing); for a connection that
        had been accepted (revoked since), it stops this process the way
        SIGTERM does and `auth.refused()` says why."""
        delay = RETRY_FIRST_S
        while True:
            try:
                bus = await cls._connect_once(url, name=name, forever=forever, replicas=replicas, creds=creds)
                bus.forever = forever
                return bus
            except auth.CredentialRefused:
                raise
            except ConnectionError as e:
                if not forever:
                    raise
                log.warning("%s; trying again in %gs", e, delay)
                if stop is None:
                    await asyncio.sleep(delay)
                else:
                    try:
                        await asyncio.wait_for(stop.wait(), delay)
                        raise
                    except asyncio.TimeoutError:
                        pass
                delay = min(delay * 2, RETRY_LONGEST_S)

    @classmethod
    async def _connect_once(cls, url: str, *, name: str, forever: bool, replicas: int, creds: str | None) -> "NatsBus":
        who = auth.identity(creds, foreign_ok=True) if creds else None
        opts: dict = dict(servers=url.split(","), name=name)
        if creds:
            opts.update(user_credentials=str(creds))
        if who is not None:
            opts.update(inbox_prefix=who.inbox_prefix)
        ca = os.environ.get(auth.CA_ENV)
        if ca:  # the fleet's own CA (deploy/nats/README.md): servers at tls:// URLs
            opts.update(tls=ssl.create_default_context(cafile=ca))
        if forever:
            opts.update(max_reconnect_attempts=-1, reconnect_time_wait=0.5, allow_reconnect=True)
        else:
            opts.update(max_reconnect_attempts=1, reconnect_time_wait=0.25, connect_timeout=2, allow_reconnect=True)

        bus: NatsBus | None = None
        refused: list[Exception] = []
        refused_now = asyncio.Event()

        async def error_cb(e: Exception) -> None:
            log.debug("nats: %s", e)
            if auth.is_auth_error(e) or isinstance(e, ssl.SSLCertVerificationError):
                if bus is None:  # while connecting: give up at once, even with `forever`
                    refused.append(e)
                    refused_now.set()
                else:  # accepted before, refused now (revoked): the process stops
                    auth.note_refused(auth.refused_message(who, creds, e))

        async def reconnected_cb() -> None:
            log.info("reconnected to NATS")
            if bus is not None:
                bus.reconnected_at = time.time()
                for hook in bus.on_reconnect:
                    await hook()

        async def closed_cb() -> None:
            # nats-py closes for good, without error_cb, on a server's -ERR
            # (a credential revoked while connected is one).
            if bus is not None and not bus._closing:
                err = bus.nc.last_error
                if err is not None and auth.is_auth_error(err):
                    auth.note_refused(auth.refused_message(who, creds, err))

        connecting = asyncio.ensure_future(
            nats.connect(error_cb=error_cb, reconnected_cb=reconnected_cb, closed_cb=closed_cb, **opts)
        )
        watching = asyncio.ensure_future(refused_now.wait())
        try:
            await asyncio.wait({connecting, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
        if not connecting.done():
            connecting.cancel()
            try:
                await connecting
            except (asyncio.CancelledError, Exception):
                pass
        try:
            if refused:
                raise refused[0]
            nc = connecting.result()
        except Exception as e:
            if auth.is_auth_error(e):
                raise auth.CredentialRefused(auth.refused_message(who, creds, e)) from None
            if isinstance(e, ssl.SSLCertVerificationError):
                raise ConnectionError(
                    f"cannot reach NATS at {url}: its TLS certificate is not trusted ({e.verify_message}): "
                    f"give the CA that signed it with ${auth.CA_ENV}"
                ) from None
            raise ConnectionError(f"cannot reach NATS at {url}: {e or type(e).__name__}") from None
        bus = cls(nc, replicas, who)
        bus.creds = creds
        bus._commands_opts = {**opts, "name": f"{name}-commands"}
        return bus

    # ----------------------------------------------------------------- streams

    async def ensure_streams(self) -> None:
        """Create the streams and buckets, or leave them as they are. A
        process that runs forever tries again, without end, while the bus is
        in trouble (an election, a server away): it says so, never exits."""
        await self._retrying("about the streams", self._ensure_streams_once)

    async def _retrying(self, what: str, call):
        """`call()`; in a process that runs forever, tried again while the bus
        is in trouble, with a growing pause, saying so. Otherwise the trouble
        is a BusUnavailable that says what it is."""
        delay = RETRY_FIRST_S
        while True:
            try:
                return await call()
            except Exception as e:
                if not is_trouble(e):
                    raise
                if not self.forever:
                    raise BusUnavailable(
                        f"NATS did not answer {what} ({describe_trouble(e)}): the bus is electing a stream leader, or is unreachable"
                    ) from None
                log.warning("NATS did not answer %s (%s); trying again in %gs", what, describe_trouble(e), delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_LONGEST_S)

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

    # ----------------------------------------------------------------- the log

    async def publish(self, subject: str, data: bytes, *, msg_id: str, expect_control_seq: int | None = None) -> int:
        self._may_publish(subject)
        headers = {"Nats-Msg-Id": msg_id}
        if expect_control_seq is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expect_control_seq)
            headers["Nats-Expected-Last-Subject-Sequence-Subject"] = CONTROL_SUBJECTS
        timed_out = False
        last: BaseException | None = None
        for attempt in range(PUBLISH_TRIES):
            try:
                ack = await self.js.publish(subject, data, stream=STREAM, headers=headers)
                if ack.duplicate and not await self._is_ours(ack.seq, subject, data):
                    # Someone published first under our id (issue 35, finding 3):
                    # what it points at is not ours, so ours has not landed.
                    log.warning(
                        "a publish to %s was acked as a duplicate of message %d, which is not ours: "
                        "its id %s was claimed by another publisher; publishing again under a fresh id",
                        subject, ack.seq, msg_id,
                    )  # fmt: skip
                    msg_id = msgids.fresh(msg_id)
                    headers["Nats-Msg-Id"] = msg_id
                    continue
                return ack.seq
            except Exception as e:
                if isinstance(e, APIError) and e.err_code == WRONG_LAST_SEQUENCE:
                    if timed_out:
                        seq = await self._landed(msg_id)
                        if seq:
                            return seq
                    raise Fenced(e.description or "wrong last sequence") from None
                if not is_trouble(e):
                    raise
                timed_out = True
                last = e
                await asyncio.sleep(0.2 * (attempt + 1))
        raise BusUnavailable(
            f"NATS did not take a publish to {subject} in {PUBLISH_TRIES} tries ({describe_trouble(last)}): "
            "the bus is electing a stream leader, or is unreachable"
        )

    def _may_publish(self, subject: str) -> None:
        # The server refuses it anyway (a permissions violation, seen here as
        # a timeout); this says why, at once.
        if self.identity is not None and not auth.may_publish(self.identity.permissions, subject):
            raise PermissionError(f"the credential of {self.identity.describe()} may not publish on {subject}")

    async def _is_ours(self, seq: int, subject: str, data: bytes) -> bool:
        """Whether the log's message `seq` is the one we published (same
        subject, same bytes): what a duplicate ack must point at to count as
        landed. A credential that may not read the log (an agent's, a fleet
        simulator's) takes the ack at its word: its ids are random per
        message (bus/msgids.py), so no one can claim them first."""
        if self.identity is not None and not auth.may_publish(self.identity.permissions, f"$JS.API.STREAM.MSG.GET.{STREAM}"):
            return True
        try:
            msg = await self._retrying("whether a publish landed", lambda: self.js.get_msg(STREAM, seq))
        except NotFoundError:
            return False
        return msg.subject == subject and msg.data == data

    async def _landed(self, msg_id: str) -> int:
        """The sequence of the last control message if it carries `msg_id`."""
        try:
            msg = await self._retrying("whether a publish landed", lambda: self.js.get_last_msg(STREAM, CONTROL_SUBJECTS))
        except NotFoundError:
            return 0
        return msg.seq if (msg.headers or {}).get("Nats-Msg-Id") == msg_id else 0

    async def last_seq(self) -> int:
        try:
            info = await self._retrying("about the log", lambda: self.js.stream_info(STREAM))
        except NotFoundError:
            raise LookupError(f"there is no {STREAM} stream on this NATS: has a control plane run against it?") from None
        return info.state.last_seq

    async def log_id(self) -> str:
        info = await self.js.stream_info(STREAM)
        return f"{STREAM}@{info.created}"

    async def follow(self, start_seq: int, on_message: OnMessage) -> _Kept:
        # A long stretch is read by the fast reader first; nats-py's ordered
        # consumer then follows from where it stopped.
        last = await self.last_seq()
        if last - start_seq >= CATCHUP_MIN and self.nc.connected_url is not None:
            url = self.nc.connected_url.geturl()
            try:
                start_seq = await catchup.read_range(
                    url, STREAM, max(start_seq, 1), last, on_message,
                    creds=self.creds,
                    inbox=self.identity.inbox_prefix if self.identity else "_INBOX",
                ) + 1  # fmt: skip
            except catchup.Unsupported as e:
                log.debug("fast catch-up not possible here: %s", e)
            except catchup.Interrupted as e:
                log.warning("fast catch-up stopped at %d (%s); the client reads the rest", e.delivered, e)
                start_seq = e.delivered + 1
            except (OSError, asyncio.TimeoutError) as e:  # before anything was read
                log.warning("fast catch-up not possible (%s); the client reads it all", e)
        return await self._follow_with_client(start_seq, on_message)

    async def _follow_with_client(self, start_seq: int, on_message: OnMessage) -> _Kept:
        async def subscribe(start: int, deliver):
            async def cb(msg) -> None:
                # The stream sequence is the 6th token of a v1 ack subject
                # ($JS.ACK.<stream>.<consumer>.<delivered>.<sseq>...) and the 8th
                # of a v2 one; parsing it here is cheaper than msg.metadata.
                tokens = msg.reply.split(".")
                deliver(int(tokens[5] if len(tokens) == 9 else tokens[7]), msg)

            return await self.js.subscribe(
                "llmgw.>", stream=STREAM, ordered_consumer=True, config=_from(start), cb=cb, pending_msgs_limit=-1
            )

        async def last() -> int:
            return (await self.js.stream_info(STREAM)).state.last_seq

        def on_msg(seq: int, msg) -> None:
            on_message(seq, msg.subject, msg.data)

        return await _Kept(self, "the log", subscribe, last, on_msg, start_seq).start()

    async def read_matching(self, subjects: str) -> list[tuple[int, str, bytes]]:
        # The server counts the matching messages, so the read knows where it
        # ends (and an empty answer costs no consumer at all).
        try:
            info = await self._retrying("about the log", lambda: self.js.stream_info(STREAM, subjects_filter=subjects))
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

        sub = await self._retrying("a read of the log", lambda: self.js.subscribe(
            subjects, stream=STREAM, ordered_consumer=True, cb=cb, pending_msgs_limit=-1,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        ))  # fmt: skip
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
        msg_id = msgids.fresh(f"cmd-{self._instance}-{self._commands_sent}")
        subject, headers = f"{COMMAND_PREFIX}.{node}", {"Nats-Msg-Id": msg_id}
        commander = await self._commander()
        if commander is None:  # one account (no auth): the command stream acks it
            await self.js.publish(subject, data, stream=COMMAND_STREAM, headers=headers)
            return
        # In NODES, where nothing has JetStream: a core publish, flushed so
        # that a connection gone is an error here; the llmgw account's
        # command stream keeps a copy (bus/accounts.py).
        await commander.publish(subject, data, headers=headers)
        await commander.flush(timeout=auth.DEFAULTS.command_flush_timeout_s)

    async def _commander(self):
        """The connection commands go out on when the agents are in an
        account of their own: the credential beside ours (bus/accounts.py).
        None without one."""
        if self._commands_nc is None:
            self._commands_nc = await accounts.connect_commands(self.creds, self.identity, self._commands_opts)
        return self._commands_nc

    async def follow_commands(self, node: str, on_command: OnCommand) -> _Sub:
        # A plain subscription on the node's own subject, not a JetStream
        # consumer: that is all an agent's credential allows (a consumer is
        # created through an API subject whose filter the permission could not
        # bind to its node). Commands sent while it was away are not lost:
        # every reconnect re-registers the node, and the control plane re-sends
        # what is outstanding for a node that registers.
        async def cb(msg) -> None:
            on_command(msg.data)

        sub = await self.nc.subscribe(f"{COMMAND_PREFIX}.{node}", cb=cb)
        return _Sub(sub)

    # ----------------------------------------------------------------- heartbeats

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
    # own keys and a gateway only read them (bus/auth.py), by subject.

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

    async def close(self) -> None:
        """Drain what is pending; with the server gone, just let go."""
        self._closing = True
        if self._commands_nc is not None:
            try:
                await asyncio.wait_for(self._commands_nc.drain(), 5.0)
            except Exception:
                pass
        try:
            if not self.drain_at_close:
                raise TimeoutError  # closed at once, below
            await asyncio.wait_for(self.nc.drain(), 5.0)
        except Exception:
            try:
                await self.nc.close()
            except Exception:
                pass


def describe_trouble(e: BaseException | None) -> str:
    if e is None:
        return "no answer"
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text and text != type(e).__name__ else type(e).__name__
