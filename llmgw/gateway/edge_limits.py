"""The HTTP edge against one client: how deep a request's JSON may nest, how
many connections one address may hold, how many wrong API keys it may try.
Pure (time is `now`); the shell (edge.py, connection.py) asks.

Issue 35, finding 7, tried as an attacker would against a real gateway:
JSON nested 1,000 deep raised a RecursionError in the JSON decoder that
nothing caught, so the request was never answered and its connection never
freed (4,100 of them from one key left every client with 503); one client's
4,300 idle connections took every slot; 500 wrong keys at 8,590/s never met
a 429. Each limit here is a field of GatewayConfig, with a flag.
"""

from __future__ import annotations

import ipaddress
import re
from functools import lru_cache

# --------------------------------------------------------------------------- JSON depth

_KEPT = b'"[]{}'
_NOT_KEPT = bytes(c for c in range(256) if c not in _KEPT)
_BRACES_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")


@lru_cache(maxsize=4)
def _nested_at_most(limit: int) -> re.Pattern:
    """A regular expression that matches strings and brackets, the brackets
    balanced and at most `limit` deep. Written out level by level (no recursion
    in it or in matching it); possessive, so the matcher never backtracks: one
    pass, whatever the input."""
    pattern = rb'(?:"[^"]*+")*+'
    for _ in range(limit):
        pattern = rb'(?:"[^"]*+"|\[' + pattern + rb"\])*+"
    return re.compile(pattern)


def nests_deeper(body: bytes, limit: int) -> bool:
    """Whether a JSON text nests arrays and objects more than `limit` deep (or
    its brackets do not match: not JSON either way), found without recursion
    and without decoding it: brackets inside strings do not count.

    Most requests have fewer brackets in all than the limit, which two counts
    show. Otherwise the text is cut to its structure, each step a pass in C:
    escapes dropped (a quote or backslash in a string), then every byte but
    quotes and brackets, then the strings left empty; when no string is left,
    the empty pairs too (each deepest point is in one, so what is left is
    exactly one level less deep); then one match. On a loaded 2-core machine: a 23 kB conversation
    of 100 messages ~0.15 ms; 32 MiB crafted to be slow about a second, and
    only for a request whose key was good (max_body bounds it).
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    structure = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(_BRACES_AS_BRACKETS, _NOT_KEPT)
    structure = structure.replace(b'""', b"")
    if b'"' in structure:  # strings with brackets in them: the match skips them
        return _nested_at_most(limit).fullmatch(structure) is None
    return _nested_at_most(limit - 1).fullmatch(structure.replace(b"[]", b"")) is None


# --------------------------------------------------------------------------- who a client is


def client_of(host: str) -> str:
    """The address a client's limits count against: its IPv4 address, or its
    IPv6 /64 (one host is commonly given a whole /64: counted per address, one
    machine would have 2^64 allowances)."""
    if ":" not in host:
        return host
    try:
        ip = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((ip, 64), strict=False).network_address) + "/64"


# --------------------------------------------------------------------------- connections


class Connections:
    """Open connections by client address (client_of)."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open: dict[str, int] = {}

    def opened(self, client: str) -> int:
        """Count one more; how many that client now holds."""
        n = self.open.get(client, 0) + 1
        self.open[client] = n
        return n

    def closed(self, client: str) -> None:
        n = self.open.get(client, 0) - 1
        if n > 0:
            self.open[client] = n
        else:
            self.open.pop(client, None)


# --------------------------------------------------------------------------- wrong keys


class KeyFailures:
    """Wrong API keys by client address: `allowed` of them per `window`
    seconds, as a bucket that refills evenly (a burst of `allowed`, then one
    every window/allowed seconds). An address whose bucket is empty is
    refused (429) before its key is looked at, so guessing keys runs at that
    rate whatever the client sends. The table forgets an address once its
    bucket is full again, and is swept when it has doubled since the last
    sweep: a client with many addresses costs memory only while it fails."""

    __slots__ = ("allowed", "window", "rate", "levels", "_swept_at")

    def __init__(self, allowed: int, window: float) -> None:
        self.allowed = allowed
        self.window = window
        self.rate = allowed / window if window > 0 else 0.0
        self.levels: dict[str, tuple[float, float]] = {}  # client -> (failures left, when)
        self._swept_at = 64

    def _level(self, client: str, now: float) -> float:
        found = self.levels.get(client)
        if found is None:
            return float(self.allowed)
        level, at = found
        return min(float(self.allowed), level + (now - at) * self.rate)

    def wait(self, client: str, now: float) -> float:
        """0 while `client` may have a key checked; else seconds until it may."""
        if self.allowed <= 0 or self.rate <= 0:
            return 0.0  # no limit
        level = self._level(client, now)
        return 0.0 if level >= 1.0 else (1.0 - level) / self.rate

    def failed(self, client: str, now: float) -> None:
        if self.allowed <= 0 or self.rate <= 0:
            return
        self.levels[client] = (max(self._level(client, now) - 1.0, 0.0), now)
        if len(self.levels) >= 2 * self._swept_at:
            self.sweep(now)

    def sweep(self, now: float) -> None:
        full = float(self.allowed)
        self.levels = {c: v for c, v in self.levels.items() if v[0] + (now - v[1]) * self.rate < full}
        self._swept_at = max(64, len(self.levels))
