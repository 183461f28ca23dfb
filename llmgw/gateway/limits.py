"""A token bucket for a rate per minute, and Retry-After. Pure: time is `now`.

What one gateway counts of a rate on its own: the limits every gateway
holds together are leases of shared counters (quota.py, shared_limits.py);
this bucket is what a gateway falls back to while NATS does not answer
(GatewayConfig.quota_failure `open`).

A bucket that holds a minute's worth and refills evenly over
the minute, so a burst of up to the whole minute's allowance goes through at
once and then the rate holds. A refused request is told how long to wait
(Retry-After, whole seconds, at least one).
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


def retry_after(wait_s: float) -> int:
    """Whole seconds for a Retry-After header: at least 1."""
    return max(1, math.ceil(wait_s))
