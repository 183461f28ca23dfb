"""How many replicas a model should run, and when a failing one may try again.

All of it pure arithmetic on the state and `now`, shared by the fold (which
notes what the load asked for, `wants`) and `decide` (which turns it into a
desired count, `desired`).

Scaling follows the load the gateways report: requests in flight and queued,
summed over gateways, divided by the model's `target_load` per replica and
rounded up, between min_replicas and max_replicas. Up at once; down only
once no report within `scale_down_delay_s` asked for more, so a dip between
two bursts does not stop what the second one needs. A gateway that stops
reporting (it died) stops counting after `load_fresh_s`: gateways repeat a
load that is not zero at least every `load_repeat_s` (contract/limits.py).

An on-demand model runs nothing until a request asks for it (a queued
request is how a gateway wakes it), then at least one, and nothing again
once no request came for `idle_s`.
"""

from __future__ import annotations

import math

from ..contract import limits
from ..contract.bounds import MAX_COUNTER
from ..contract.catalog import max_replicas
from ..contract.events import ModelSpec, Scale
from ..contract.policy import DEFAULT, Policy
from ..contract.reasons import ScaleWhy
from ..folding.state import Model, Peak

# Back-off after replicas fail to start: 5 s after the first failure,
# doubling, at most 5 minutes; after PARK_AFTER in a row the model is parked
# until an operator retries it. A broken definition (a missing model file, a
# bad argument) fails every time: trying it for ever only fills the log.
# (The defaults of state.policy's backoff_first_s, backoff_max_s, park_after.)
BACKOFF_FIRST_S = DEFAULT.backoff_first_s
BACKOFF_MAX_S = DEFAULT.backoff_max_s
PARK_AFTER = DEFAULT.park_after


def current_load(model: Model, now: float) -> int:
    """Requests in flight and queued, over the gateways heard lately."""
    total = 0
    fresh_s = limits.LIMITS.load_fresh_s
    for load in model.load.values():
        if now - load.at <= fresh_s:
            total += load.in_flight + load.queued
    return total


def wants(spec: ModelSpec, load: int) -> int:
    """Replicas this load asks for at the model's target per replica (0 without one)."""
    if spec.target_load <= 0:
        return 0
    return math.ceil(load / spec.target_load)


def bounds(spec: ModelSpec) -> tuple[int, int]:
    """(least, most) replicas while the model is wanted at all."""
    least = max(spec.min_replicas, 1) if spec.on_demand else spec.min_replicas
    return least, max(max_replicas(spec), least)


def desired(model: Model, now: float) -> int:
    """How many replicas the model should run now (`why_desired` says why)."""
    spec = model.spec
    load = current_load(model, now)
    if spec.on_demand and load == 0 and (not model.last_used or now - model.last_used >= spec.idle_s):
        return 0
    least, most = bounds(spec)
    if spec.target_load <= 0:
        return least
    return min(max(wants(spec, load), _recent(model, now), least), most)


def _recent(model: Model, now: float) -> int:
    """The most the load asked for within the scale-down delay."""
    for p in model.peaks:
        if now - p.at <= model.spec.scale_down_delay_s:
            return p.wants  # the first one inside the window asks for the most
    return 0


def why_desired(model: Model, now: float) -> Scale:
    """Why `desired` is what it is, as data (reasons.scale_words says it)."""
    spec = model.spec
    load = current_load(model, now)
    if spec.on_demand and load == 0:
        if not model.last_used:
            return Scale(why=ScaleWhy.UNUSED.value)
        idle = now - model.last_used
        if idle >= spec.idle_s:
            return Scale(why=ScaleWhy.IDLE.value, idle_s=idle, idle_after_s=spec.idle_s)
    least, most = bounds(spec)
    if spec.target_load <= 0:
        return Scale(why=ScaleWhy.ASKED.value) if spec.on_demand else Scale(why=ScaleWhy.MIN.value, least=spec.min_replicas)
    # The counts within the contract's bound (a sum over gateways may pass
    # it, a count past 2**53 is not exact anyway): said as its most.
    return Scale(
        why=ScaleWhy.LOAD.value, load=min(load, MAX_COUNTER), per=spec.target_load,
        wants=min(wants(spec, load), MAX_COUNTER), recent=min(_recent(model, now), MAX_COUNTER),
        delay_s=spec.scale_down_delay_s, least=least, most=most,
    )


def decided(model: Model) -> int:
    """The count last decided for the model (ScaleModel), or the catalog's
    least when none was: what a change is measured against."""
    return model.desired if model.desired >= 0 else bounds(model.spec)[0]


def note_peak(model: Model, at: float, asked: int) -> None:
    """Keep what the load asked for at `at` (see Model.peaks): entries that
    ask for no more than this one can never be the most again, and those
    older than the delay have no say."""
    peaks = model.peaks
    delay = model.spec.scale_down_delay_s
    while peaks and (peaks[-1].wants <= asked):
        peaks.pop()
    while peaks and at - peaks[0].at > delay:
        peaks.pop(0)
    peaks.append(Peak(at=at, wants=asked))


def backoff_until(model: Model, policy: Policy = DEFAULT) -> float:
    """When a model whose replicas failed to start may be tried again (0: now)."""
    n = model.start_failures
    if n <= 0:
        return 0.0
    return model.failed_at + min(policy.backoff_first_s * 2 ** (n - 1), policy.backoff_max_s)
