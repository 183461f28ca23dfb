"""Per-key limits: requests and tokens per minute. Pure: time is `now`.

Each limit is a bucket that holds a minute's worth and refills evenly over
the minute, so a burst of up to the whole minute's allowance goes through at
once and then the rate holds. A request takes one from the requests bucket.
Tokens are known only once the answer is in, so a request is let in while
the tokens bucket is not empty and its tokens (prompt and completion) are
taken afterwards, which may leave the bucket in debt: later requests wait
until it has refilled past zero. A refused request is told how long to wait
(Retry-After, whole seconds, at least one).

The limits hold per gateway process: with N gateways behind a balancer a key
may get up to N times its allowance.
"""

from __future__ import annotations

import math


class Bucket:
    __slots__ = ("per_minute", "level", "rate", "at")

    def __init__(self, per_minute: int, now: float) -> None:
        self.per_minute = per_minute
        self.level = float(per_minute)
        self.rate = per_minute / 60.0
        self.at = now

    def _refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.per_minute, self.level + (now - self.at) * self.rate)
        self.at = now

    def take(self, n: float, now: float) -> float:
        """Take `n` if there are; else take nothing and say how long until there are."""
        self._refill(now)
        if self.level >= n:
            self.level -= n
            return 0.0
        return (n - self.level) / self.rate

    def wait(self, now: float) -> float:
        """0 while the bucket is not empty (not in debt); else how long until it is."""
        self._refill(now)
        if self.level > 0:
            return 0.0
        return (1e-9 - self.level) / self.rate + 1e-9

    def charge(self, n: float, now: float) -> None:
        """Take `n` even if it leaves a debt (at most a minute's worth)."""
        self._refill(now)
        self.level = max(self.level - n, -float(self.per_minute))


class KeyLimits:
    """The limits of one key; 0 means no limit."""

    __slots__ = ("requests", "tokens")

    def __init__(self, requests_per_minute: int, tokens_per_minute: int, now: float) -> None:
        self.requests = Bucket(requests_per_minute, now) if requests_per_minute > 0 else None
        self.tokens = Bucket(tokens_per_minute, now) if tokens_per_minute > 0 else None

    def same(self, requests_per_minute: int, tokens_per_minute: int) -> bool:
        return (self.requests.per_minute if self.requests else 0) == requests_per_minute and (
            self.tokens.per_minute if self.tokens else 0
        ) == tokens_per_minute

    def admit(self, now: float) -> tuple[float, str]:
        """(0, "") to let a request in; else (seconds to wait, which limit)."""
        if self.tokens is not None:
            wait = self.tokens.wait(now)
            if wait > 0:
                return wait, "tokens"
        if self.requests is not None:
            wait = self.requests.take(1, now)
            if wait > 0:
                return wait, "requests"
        return 0.0, ""

    def used(self, tokens: int, now: float) -> None:
        if self.tokens is not None and tokens > 0:
            self.tokens.charge(tokens, now)


def retry_after(wait_s: float) -> int:
    """Whole seconds for a Retry-After header: at least 1."""
    return max(1, math.ceil(wait_s))
