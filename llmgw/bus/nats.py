"""The bus on NATS JetStream: one class, NatsBus, made of its jobs, each in
a module of its own: nats_streams.py (the streams and buckets made or
waited for), nats_log.py (the log published, followed, read; the facts
learned on this stack that chose how), nats_commands.py (the agents'
commands), nats_kv.py (heartbeats, the lease, engine keys, stored
responses), nats_hints.py (the gateways' prefix hints), nats_consumers.py (a follower kept alive), nats_trouble.py
(what the bus in trouble looks like). Here: the connection, tried again
while NATS does not answer, and closed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
import uuid

import nats

from . import BusUnavailable, auth, credentials
from .nats_commands import Commands
from .nats_consumers import _Kept
from .nats_hints import Hints
from .nats_kv import Buckets
from .nats_log import Log
from .nats_streams import Streams
from .nats_trouble import RETRY_FIRST_S, RETRY_LONGEST_S, describe_trouble, is_trouble

log = logging.getLogger("llmgw.bus")


class NatsBus(Streams, Log, Commands, Buckets, Hints):
    def __init__(self, nc: nats.NATS, replicas: int = 1, identity: "credentials.Identity | None" = None) -> None:
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
        who = credentials.identity(creds, foreign_ok=True) if creds else None
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

