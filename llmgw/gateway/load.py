"""A gateway's load and usage per model, coalesced into `ModelLoad` reports.
Pure: time is the `now` each call is given (Unix seconds, as events carry).

What is reported for a model is its requests in flight (sent to a replica)
and queued (waiting for one: no replica is ready, which is how an on-demand
model is woken), each the larger of the count now and the mean over the time
since the previous report, rounded up: a burst between two reports is not
lost, and a single request counts as one. With them, when the model was last
sent a request, and the prompt and completion tokens counted since the
previous report; where its requests went and why (per replica and reason:
requests, prompt and cached tokens, prefix hits; at most MAX_ROUTE_ROWS rows
a report, the rest in the next); and, for the console's plots, the requests
finished, the prompt tokens the engines took from their prefix cache, and
the median and 90th percentile of the time to first byte over the same
window (kept from at most TTFT_SAMPLES requests a window: a percentile of a
window that busy is as good from its first few hundred as from all).

A report goes out when what it would say changed, at most every
MIN_INTERVAL_S per model; a load that is not zero is repeated at least every
REPEAT_S (the reconciler forgets a gateway it has not heard for the core's
load_fresh_s, core/contract/limits.py); and a load that falls to zero is
reported once more, as zero, since that is a change too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.contract.bounds import MAX_ROUTE_ROWS
from ..core.contract.limits import LIMITS

MIN_INTERVAL_S = 1.0
TTFT_SAMPLES = 512  # times to first byte kept a window, for its percentiles
REPEAT_S = LIMITS.load_repeat_s * 0.8  # a margin under the reconciler's expectation


@dataclass(frozen=True, slots=True)
class Report:
    model: str
    in_flight: int
    queued: int
    last_used: float
    tokens_in: int
    tokens_out: int
    requests: int = 0
    tokens_cached: int = 0
    ttft_p50: float = 0.0
    ttft_p90: float = 0.0
    routes: list[tuple[str, str, int, int, int, int]] = ()  # (replica, reason, requests, prompt, cached, hits)


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values` by the nearest rank; 0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class Meter:
    """One model's load at this gateway, and what was last reported of it."""

    __slots__ = (
        "in_flight", "queued", "changed_at", "since", "area_flight", "area_queued",
        "last_used", "tokens_in", "tokens_out", "reported", "reported_at", "requests", "tokens_cached", "ttft",
        "routes",
    )  # fmt: skip

    def __init__(self, now: float) -> None:
        self.in_flight = 0
        self.queued = 0
        self.changed_at = now
        self.since = now  # the start of the window since the previous report
        self.area_flight = 0.0  # request-seconds in flight within the window
        self.area_queued = 0.0
        self.last_used = 0.0
        self.tokens_in = 0
        self.tokens_out = 0
        self.requests = 0  # finished since the previous report
        self.tokens_cached = 0
        self.ttft: list[float] = []  # seconds to the first byte, of requests answered since the previous report
        self.reported = (0, 0)
        self.reported_at = -math.inf
        self.routes: dict[tuple[str, str], list[int]] = {}  # (replica, reason) -> [requests, prompt, cached, hits]

    def routed(self, replica: str, reason: str, prompt: int, cached: int, hit: bool) -> None:
        row = self.routes.get((replica, reason))
        if row is None:
            row = self.routes[(replica, reason)] = [0, 0, 0, 0]
        row[0] += 1
        row[1] += prompt
        row[2] += cached
        row[3] += hit

    def _advance(self, now: float) -> None:
        dt = now - self.changed_at
        if dt > 0:
            self.area_flight += self.in_flight * dt
            self.area_queued += self.queued * dt
            self.changed_at = now

    def change(self, now: float, in_flight: int = 0, queued: int = 0) -> None:
        self._advance(now)
        self.in_flight += in_flight
        self.queued += queued

    def finished(self, ttft: float | None = None) -> None:
        """A request is done; `ttft`: seconds to its answer's first byte, when it had one."""
        self.requests += 1
        if ttft is not None and len(self.ttft) < TTFT_SAMPLES:
            self.ttft.append(ttft)

    def counted(self) -> bool:
        """Whether it counted anything since the previous report."""
        return bool(self.tokens_in or self.tokens_out or self.requests or self.routes)

    def busy(self) -> bool:
        return bool(self.in_flight or self.queued)

    def value(self, now: float) -> tuple[int, int]:
        """What a report would say now."""
        self._advance(now)
        span = now - self.since
        if span <= 0:
            return self.in_flight, self.queued
        mean_f = math.ceil(self.area_flight / span - 1e-9)
        mean_q = math.ceil(self.area_queued / span - 1e-9)
        return max(self.in_flight, mean_f), max(self.queued, mean_q)

    def due(self, now: float) -> bool:
        since_report = now - self.reported_at
        if since_report < MIN_INTERVAL_S:
            return False
        value = self.value(now)
        if value != self.reported or self.counted():
            return True
        return value != (0, 0) and since_report >= REPEAT_S

    def take(self, model: str, now: float) -> Report:
        """The report, and a new window from now."""
        in_flight, queued = self.value(now)
        routes = []
        for key in list(self.routes)[:MAX_ROUTE_ROWS]:
            routes.append((*key, *self.routes.pop(key)))
        report = Report(model, in_flight, queued, self.last_used, self.tokens_in, self.tokens_out, self.requests,
                        self.tokens_cached, percentile(self.ttft, 0.5), percentile(self.ttft, 0.9), routes)
        self.reported, self.reported_at = (in_flight, queued), now
        self.since, self.area_flight, self.area_queued = now, 0.0, 0.0
        self.tokens_in = self.tokens_out = self.requests = self.tokens_cached = 0
        self.ttft = []
        return report


class Loads:
    """Every model's meter at this gateway."""

    def __init__(self) -> None:
        self.meters: dict[str, Meter] = {}

    def meter(self, model: str, now: float) -> Meter:
        m = self.meters.get(model)
        if m is None:
            m = self.meters[model] = Meter(now)
        return m

    def due(self, now: float) -> list[Report]:
        """The reports to publish now; meters with nothing more to say are dropped."""
        out = []
        for model, m in list(self.meters.items()):
            if m.due(now):
                out.append(m.take(model, now))
            elif m.reported == (0, 0) and not m.busy() and not m.counted() and now - m.reported_at >= MIN_INTERVAL_S:
                if m.value(now) == (0, 0):
                    del self.meters[model]  # said all it had to say: zero
        return out
