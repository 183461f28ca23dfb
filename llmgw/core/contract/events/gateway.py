"""What a gateway says (on `llmgw.gw.<gateway>.>`, for itself only): a
model's load and where it sent requests, and usage by key and owner."""

from __future__ import annotations

from .. import bounds as b
from .base import Event, Struct


# Why a gateway sent a request where it did (gateway/choose.Reason's values).
ROUTE_REASONS = ("warm", "hashed", "overflow", "session", "least_load", "round_robin")


class RouteCount(Struct):
    """Requests one gateway sent one replica for one reason (gateway/choose.py:
    warm, hashed, overflow, session, least_load, round_robin) since its
    previous report, with their prompt tokens, the part of them the engine
    had in its cache, and the answers that were prefix hits."""

    replica: b.ReplicaRef
    reason: b.Word
    requests: b.Counter = 0
    prompt_tokens: b.Counter = 0
    cached_tokens: b.Counter = 0
    hits: b.Counter = 0


class UsageRow(Struct):
    """What one key (of one owner) asked of one model at one gateway since
    its previous report: requests answered, their prompt and answer tokens,
    and requests refused past a limit."""

    model: b.ModelRef
    key: b.KeyName = ""  # "" : a gateway without API keys
    owner: b.OwnerName = ""
    requests: b.Counter = 0
    tokens_in: b.Counter = 0
    tokens_out: b.Counter = 0
    refused: b.Counter = 0


class UsageReported(Event, tag="usage.reported"):
    """One gateway's usage, coalesced per key, owner and model over an
    interval (GatewayConfig.usage_interval, gateway/usage.py): the sum over
    the log is the whole usage (`llmgw ctl get usage`). Not folded: the
    control plane decides nothing on it."""

    gateway: b.GatewayRef
    since: b.Time = 0.0  # the interval's start (`at` its end)
    rows: b.many(UsageRow, b.MAX_USAGE_ROWS) = []


class ModelLoad(Event, tag="model.load"):
    """One gateway's load on one model, coalesced: published when it changes,
    at most every second or so, and once more when it falls to nothing.

    What the reconciler scales on. A request waiting for a model with no
    ready replica counts as queued, which is how an on-demand model is woken.
    `last_used` is when this gateway last sent the model a request."""

    gateway: b.GatewayRef
    model: b.ModelRef
    in_flight: b.Counter = 0
    queued: b.Counter = 0
    last_used: b.Time = 0.0
    # Usage: the prompt and completion tokens this gateway counted for the
    # model since its previous report (so the sum over the log is the total).
    tokens_in: b.Counter = 0
    tokens_out: b.Counter = 0
    # For the console's plots (issue 34), over the same window: the requests
    # this gateway finished for the model, the prompt tokens the engines said
    # they took from their prefix cache (usage.prompt_tokens_details
    # .cached_tokens, llama.cpp's timings.cache_n), and the median and 90th
    # percentile of the time to the answer's first byte (a stream's first
    # token), 0 when no request was answered.
    requests: b.Counter = 0
    tokens_cached: b.Counter = 0
    ttft_p50: b.Duration = 0.0
    ttft_p90: b.Duration = 0.0
    # Where its requests went and why, since its previous report (issue 30).
    routes: b.many(RouteCount, b.MAX_ROUTE_ROWS) = []
