"""The gateway's addresses, limits and timeouts: one frozen object with named
defaults (as httpx's Limits and Timeout), given to `Gateway(config=...)`.
Every field is a flag of `llmgw gateway` (`--` and the name with dashes,
unless it says otherwise): `add_arguments` makes them, `from_args` reads them.

What a client past a limit of the HTTP edge gets:

    max_request_line   414, closed       the URL, counted as it arrives (never buffered past it)
    max_header_bytes   431, closed       request line and headers, counted as they arrive
    max_body           413, closed       checked against Content-Length before any byte of the
                                         body is read (before a 100 Continue); a chunked body is
                                         counted as it arrives
    header_timeout     408, closed       a request's head (request line and headers) must be in
                                         within this from its first byte; a new connection's
                                         first one within this from the connection (one that
                                         sent nothing is closed without an answer)
    body_timeout       408, closed       its body within this from the end of its head
    keepalive_timeout  closed            a connection idle between requests (no answer owed, no
                                         byte of a next request)
    max_connections    503, closed       open connections; one past it is answered 503 with
                                         Retry-After and closed (an HTTP client, the openai SDK,
                                         retries that with backoff, where it could not tell a
                                         reset from a crash); past it by an eighth more, a new
                                         connection is closed at once, unanswered, so that a
                                         flood holds nothing
    linger_timeout     -                 after any of these answers the connection still reads,
                                         and drops, what the client sends, up to this long (or
                                         its end), so that the client reads the answer rather
                                         than a reset

Against one client (edge_limits.py; issue 35, finding 7: one client locked
the edge for every other):

    max_connections_per_client
                       429, closed       open connections of one client address (an IPv6
                                         client's /64), answered 429 with Retry-After; past it by
                                         an eighth more, closed at once, unanswered. 256: what
                                         one engine batches at once (vLLM's max_num_seqs) and
                                         2.5 times the keep-alive pool of the openai SDK (100),
                                         while sixteen addresses are needed to fill the 4096
    max_json_depth     400               how deep a request's JSON may nest, checked without
                                         recursion before it is decoded (1,000 deep raised a
                                         RecursionError that left the request unanswered); 64
                                         is far past any OpenAI request (tool schemas nest ~10)
    request_timeout    504 / error event a request's whole handling, from its last byte in to its
                                         answer's last byte out (the wait for a replica, every
                                         attempt, the stream): past it, 504 if nothing was sent,
                                         else a stream ends with an error event (another answer
                                         is cut off), and the connection is closed. An hour: a
                                         long generation streams for many minutes
    max_key_failures   429               wrong API keys one client address may try in
                                         key_failure_window (a bucket: then one every
                                         window/N); past it, 429 with Retry-After and the key
                                         is not even looked up (0: no limit)

Timeouts are kept to about a quarter of the shortest (at most 1 s): a
sweep, not a timer per request (request_timeout too).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from ..bus import STORED_RESPONSES_TTL_S

KIB = 1024
MIB = 1024 * KIB


def _f(default, help: str, flag: str = "", type=None, metavar: str = ""):
    return field(default=default, metadata={"help": help, "flag": flag, "type": type, "metavar": metavar})


def address(text: str) -> tuple[str, int]:
    """"ADDR:PORT" (an IPv6 address in brackets) -> (addr, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"an address is ADDR:PORT, not {text!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class GatewayConfig:
    # Where.
    listen: str = _f("127.0.0.1", "the address the OpenAI API listens on; nothing the catalog says changes it")
    port: int = _f(8080, "the port of the OpenAI API (0: any free one)")
    metrics_listen: str = _f(
        "", "ADDR:PORT: serve /metrics (every model, no key) there, and not on the API port "
        "(default: on the API port, where with API keys it needs one and shows that key's models)",
    )  # fmt: skip
    # The HTTP edge.
    max_request_line: int = _f(8 * KIB, "bytes of a request's URL (414 past it)")
    max_header_bytes: int = _f(32 * KIB, "bytes of a request's line and headers (431 past it)")
    max_body: int = _f(32 * MIB, "bytes of a request's body (413 past it)")
    header_timeout: float = _f(10.0, "seconds for a request's head to arrive (408 and closed past it)")
    body_timeout: float = _f(60.0, "seconds for a request's body to arrive after its head (408 and closed past it)")
    keepalive_timeout: float = _f(75.0, "seconds a connection may stay idle between requests")
    max_connections: int = _f(4096, "open client connections (503 and closed past it)")
    linger_timeout: float = _f(2.0, "seconds a refused connection still reads (and drops) before it is closed")
    # Against one client (edge_limits.py).
    max_connections_per_client: int = _f(256, "open connections of one client address, an IPv6 client's /64 (429 and closed past it)")
    max_json_depth: int = _f(64, "how deep a request's JSON may nest (400 past it)")
    request_timeout: float = _f(
        3600.0, "seconds a request may take, from its last byte in to its answer's last byte out "
        "(504, or a stream's error event, and closed past it)",
    )  # fmt: skip
    max_key_failures: int = _f(20, "wrong API keys one client address may try per --key-failure-window (429 past it; 0: no limit)")
    key_failure_window: float = _f(60.0, "seconds in which --max-key-failures wrong keys are allowed")
    # Upstream.
    wait_timeout: float = _f(
        300.0, "seconds a request waits for a replica on its way (placing, loading, an on-demand model waking) "
        "before 503; a model that cannot be served now (no room, over a limit, parked) is refused at once",
    )  # fmt: skip
    # A model the control plane says cannot be served now (core/rules/waits.py):
    # nothing changes that before an operator or a node does, so a client is
    # told to come back later than after a wait that ran out (5 s), yet
    # within the minute the openai SDK honours a Retry-After for.
    unavailable_retry_after: int = _f(
        10, "seconds in the Retry-After of a 503 for a model that cannot be served now (no room, over a limit, parked)"
    )
    upstream_timeout: float = _f(600.0, "seconds to wait for an engine's first byte")
    connect_timeout: float = _f(3.0, "seconds to connect to an engine")
    key_timeout: float = _f(3.0, "seconds to read an engine's key from the engine keys bucket, the first time it is reached")
    failover_timeout: float = _f(5.0, "after the replicas tried failed, seconds to wait for the log to say another is coming")
    # Stored responses of /v1/responses (stored.py).
    stored_response_ttl: float = _f(
        STORED_RESPONSES_TTL_S, "seconds a stored response (store: true) may be found by previous_response_id; at most "
        "the bucket's own age limit (30 days), which drops it from NATS",
    )  # fmt: skip
    max_stored_response: int = _f(
        60 * KIB, "bytes of one stored response (its input and output): past it the answer is served but not stored, "
        "and a later previous_response_id to it is refused saying so. At most the gateway's NATS payload limit (64 KiB)",
    )  # fmt: skip
    max_response_chain: int = _f(256, "responses a previous_response_id chain may reach back (400 past it)")
    stored_miss_wait: float = _f(
        0.5, "seconds a gateway looks again for a stored response it does not find (another gateway's put may be "
        "landing: puts are not awaited by the answers they store) before its 404",
    )  # fmt: skip
    # Cache-aware routing (choose.py, prefix.py): a model's `routing: prefix`.
    prefix_hash_kib: int = _f(64, "KiB of a prompt hashed to match it to a warm replica: what a huge prompt costs the router (0: off)")
    prefix_index_mib: int = _f(64, "MiB the prefix index may hold (an LRU: a flood of unique prompts evicts the oldest)")
    prefix_epsilon: float = _f(
        0.25, "bounded load: a replica is saturated past (1 + this) times the model's mean outstanding per unit of weight",
        metavar="RATIO",
    )  # fmt: skip
    prefix_floor: float = _f(
        8.0, "bounded load: nor is one saturated below this many outstanding per unit of weight (a warm queue beats a cold prefill)",
        metavar="N",
    )  # fmt: skip
    prefix_sessions: int = _f(100_000, "sessions (a request's user or X-Session-Id) remembered, each on its replica (an LRU)")
    # Fair queuing when a model's replicas are saturated (fairqueue.py, waiting.py).
    replica_slots: int = _f(
        64, "requests outstanding per replica (per unit of its weight) past which it is saturated: more wait at the "
        "gateway, in a queue per model fair between owners, rather than in the engine's arrival order (0: never)",
    )  # fmt: skip
    max_queue: int = _f(1024, "requests that may wait for a saturated model at this gateway (429 with Retry-After past it)")
    max_queue_wait: float = _f(30.0, "seconds a request may wait for a saturated model (503 with Retry-After past it)")
    queue_retry_after: int = _f(2, "seconds in the Retry-After of a request refused by a saturated model's queue")
    # Limits every gateway holds together (quota.py, shared_limits.py: leases of counters in NATS KV).
    quota_failure: str = _f(
        "open", "when NATS does not answer about the shared limits: `open` lets requests in under this gateway's own "
        "count of each limit (so N gateways may let in up to N times it meanwhile; the usage is counted when NATS is "
        "back), `closed` answers 503 with Retry-After", metavar="open|closed",
    )  # fmt: skip
    quota_timeout: float = _f(0.5, "seconds NATS may take to answer about a shared limit before --quota-failure applies")
    quota_retry: float = _f(2.0, "seconds after NATS failed to answer before it is asked again (--quota-failure meanwhile)")
    quota_lease: float = _f(
        0.01, "the share of a limit one gateway takes from NATS at once and serves from memory (a NATS round trip "
        "every this-share of the limit, not every request)", metavar="RATIO",
    )  # fmt: skip
    quota_lease_idle: float = _f(2.0, "seconds a gateway keeps a leased share unused before giving it back to the others")
    usage_interval: float = _f(60.0, "seconds of usage (per key, owner and model) coalesced into one report on the log")
    default_completion: int = _f(
        256, "tokens reserved for the answer of a request without max_tokens (at most the key's smallest token limit; "
        "an answer past it is charged as it ran)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                raise ValueError(f"{f.name} must not be negative, not {v}")
        for f in (
            "max_request_line", "max_header_bytes", "max_connections", "header_timeout", "body_timeout", "keepalive_timeout",
            "max_connections_per_client", "max_json_depth", "request_timeout", "key_failure_window",
            "max_response_chain", "max_queue", "max_queue_wait", "queue_retry_after",
        ):  # fmt: skip
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive")
        if self.metrics_listen:
            address(self.metrics_listen)
        if self.quota_failure not in ("open", "closed"):
            raise ValueError(f"quota_failure is open or closed, not {self.quota_failure!r}")
        if not 0 < self.quota_lease <= 1:
            raise ValueError("quota_lease is a share of a limit: above 0, at most 1")
        for f in ("quota_timeout", "quota_retry", "quota_lease_idle", "usage_interval"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive")

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        return address(self.metrics_listen) if self.metrics_listen else None

    @property
    def tick(self) -> float:
        """How often the timeouts are looked at."""
        return max(0.02, min(1.0, min(self.header_timeout, self.body_timeout, self.keepalive_timeout, self.linger_timeout or 1.0, self.request_timeout) / 4))


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """A flag for each field of GatewayConfig, its default the field's."""
    for f in dataclasses.fields(GatewayConfig):
        kind = f.metadata.get("type") or type(f.default)
        shown = f"{f.default / MIB:g} MiB" if kind is int and f.default >= MIB else (f"{f.default}" if f.default != "" else "none")
        metavar = f.metadata.get("metavar") or ("ADDR:PORT" if f.name == "metrics_listen" else {int: "N", float: "SECONDS", str: "ADDR"}[kind])
        parser.add_argument(
            _flag(f), dest=f"gw_{f.name}", type=kind, default=f.default, metavar=metavar, help=f"{f.metadata['help']} (default {shown})"
        )


def from_args(args: argparse.Namespace) -> GatewayConfig:
    return GatewayConfig(**{f.name: getattr(args, f"gw_{f.name}") for f in dataclasses.fields(GatewayConfig)})
