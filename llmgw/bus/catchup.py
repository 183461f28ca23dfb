"""Reading a long stretch of the log fast: a minimal JetStream reader.

Why it exists: replaying the log is how a control plane starts, how the
replay tool and the CLI read the fleet, and a log of a million events must
fold in seconds. nats-py delivers each message through several Python
layers (parser, header parsing, a Msg object, a queue, the ordered-consumer
checks): about 70-80k messages/s on this machine before any folding, where
the goal is 120k/s folded. This reader speaks the NATS protocol for one job
only: it creates an ephemeral push consumer (no acks, flow control,
heartbeats) and slices the messages straight out of the socket buffer, at
about 350k/s. Everything else, and the live tail of the log after a
catch-up, stays with nats-py (`NatsBus.follow`), which also takes over when
this reader cannot be used (TLS) or fails half-way.
"""

from __future__ import annotations

import asyncio
import json
import os
from urllib.parse import urlparse

from . import OnMessage

READ_SIZE = 1 << 20
IDLE_HEARTBEAT_NS = 2_000_000_000
INACTIVE_THRESHOLD_NS = 30_000_000_000


class Unsupported(Exception):
    """This server URL needs what this reader does not speak (TLS, auth)."""


class Interrupted(ConnectionError):
    """The reader stopped half-way; `delivered` is the last sequence it handed on."""

    def __init__(self, why: str, delivered: int) -> None:
        super().__init__(why)
        self.delivered = delivered


async def read_range(
    url: str, stream: str, start_seq: int, last_seq: int, on_message: OnMessage, timeout: float = 30.0,
    *, creds=None, inbox: str = "_INBOX",
) -> int:  # fmt: skip
    """Call `on_message(seq, subject, data)` for every message from
    `start_seq` to `last_seq` of `stream`, in order, and return `last_seq`.
    Stopped half-way, it raises `Interrupted` saying where to resume."""
    parsed = urlparse(url if "://" in url else f"nats://{url}")
    if parsed.scheme not in ("nats", "") or parsed.username or parsed.password:
        raise Unsupported(f"{parsed.scheme}:// with credentials or TLS")
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(parsed.hostname or "127.0.0.1", parsed.port or 4222, limit=READ_SIZE * 4), timeout
    )
    delivered = start_seq - 1
    try:
        info = json.loads((await asyncio.wait_for(reader.readline(), timeout))[5:])
        if info.get("tls_required"):
            raise Unsupported("the server asks for TLS")
        connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True, "protocol": 1, "name": "llmgw-catchup"}
        if info.get("auth_required"):
            if creds is None or not info.get("nonce"):
                raise Unsupported("the server asks for a credential this reader was not given")
            from . import credentials

            jwt, seed = credentials.read_creds(creds)
            connect.update(jwt=jwt, sig=credentials.sign_nonce(seed, info["nonce"]))
        # Under the connection's own inbox prefix: all its credential may subscribe to.
        inbox = f"{inbox}.catchup{os.urandom(8).hex()}"
        config = {
            "stream_name": stream,
            "config": {
                "deliver_subject": inbox,
                "deliver_policy": "by_start_sequence",
                "opt_start_seq": start_seq,
                "ack_policy": "none",
                "flow_control": True,
                "idle_heartbeat": IDLE_HEARTBEAT_NS,
                "inactive_threshold": INACTIVE_THRESHOLD_NS,
                "mem_storage": True,
                "num_replicas": 1,
            },
        }
        body = json.dumps(config).encode()
        writer.write(
            b"CONNECT " + json.dumps(connect).encode() + b"\r\n"
            + f"SUB {inbox} 1\r\nSUB {inbox}.api 2\r\n".encode()
            + b"PUB $JS.API.CONSUMER.CREATE.%s %s.api %d\r\n%s\r\n" % (stream.encode(), inbox.encode(), len(body), body)
        )
        await writer.drain()
        progress = [delivered]
        try:
            await _deliver(reader, writer, progress, last_seq, on_message, timeout)
        except (OSError, ConnectionError, asyncio.TimeoutError, ValueError) as e:
            raise Interrupted(f"{type(e).__name__}: {e}", progress[0]) from e
    finally:
        writer.close()
    return last_seq


async def _deliver(reader, writer, progress: list[int], last_seq: int, on_message: OnMessage, timeout: float) -> None:
    """The protocol loop. `progress[0]` is kept at the last sequence handed on."""
    delivered = progress[0]
    buf = b""
    pos = 0
    while delivered < last_seq:
        chunk = await asyncio.wait_for(reader.read(READ_SIZE), timeout)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf = buf[pos:] + chunk
        pos = 0
        size = len(buf)
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            line = buf[pos:eol]
            if line[:5] == b"HMSG ":
                # HMSG <subject> <sid> [reply] <header bytes> <total bytes>
                parts = line.split(b" ")
                end = eol + 2 + int(parts[-1])
                if end + 2 > size:
                    break  # the rest of this message is still on its way
                reply = parts[3] if len(parts) == 6 else b""
                if reply[:8] == b"$JS.ACK.":
                    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>... (v1), or
                    # with domain and account hash first (v2)
                    tokens = reply.split(b".")
                    seq = int(tokens[5] if len(tokens) == 9 else tokens[7])
                    if seq != delivered + 1:
                        raise ConnectionError(f"a gap in the delivery: {delivered} then {seq}")
                    on_message(seq, parts[1].decode(), buf[eol + 2 + int(parts[-2]) : end])
                    delivered = progress[0] = seq
                else:
                    headers = buf[eol + 2 : eol + 2 + int(parts[-2])]
                    if reply:  # flow control: answering lets the server send more
                        writer.write(b"PUB %s 0\r\n\r\n" % reply)
                    stalled = headers.find(b"Nats-Consumer-Stalled:")
                    if stalled >= 0:
                        to = headers[stalled + 22 : headers.find(b"\r\n", stalled)].strip()
                        writer.write(b"PUB %s 0\r\n\r\n" % to)
                pos = end + 2
            elif line[:4] == b"MSG ":
                # Only the consumer-create answer comes as a plain MSG.
                parts = line.split(b" ")
                end = eol + 2 + int(parts[-1])
                if end + 2 > size:
                    break
                answer = json.loads(buf[eol + 2 : end] or b"{}")
                if "error" in answer:
                    raise ConnectionError(f"the server refused the consumer: {answer['error'].get('description')}")
                pos = end + 2
            elif line == b"PING":
                writer.write(b"PONG\r\n")
                pos = eol + 2
            elif line[:4] == b"-ERR":
                raise ConnectionError(line.decode(errors="replace"))
            else:  # +OK, PONG, INFO updates
                pos = eol + 2
