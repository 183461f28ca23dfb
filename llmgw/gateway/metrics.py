"""The gateway's metrics in Prometheus' text format. The counters are plain
numbers the shell adds to on every request (no lock, no object per series:
the hot path), and `render` has prometheus_client write them, as the
control plane's are (llmgw/control/metrics.py): one way of doing metrics.

    llmgw_gateway_requests_total{model,replica,code}       requests answered
    llmgw_gateway_request_seconds{model,replica}           latency, received to last byte
    llmgw_gateway_time_to_first_token_seconds{model,replica}  streamed answers: to the first chunk
    llmgw_gateway_tokens_total{model,replica,kind}         kind: prompt | completion | cached (of the prompt's)
    llmgw_gateway_retries_total{model}                     attempts on another replica
    llmgw_gateway_routed_total{model,replica,reason}       why each answered request went where it did
                                                           (choose.Reason: warm, hashed, overflow, session,
                                                           least_load, round_robin)
    llmgw_gateway_prefix_hits_total{model,replica}         answers with at least half their prompt cached
    llmgw_gateway_cached_tokens_total{model,replica}       prompt tokens the engine had in its cache
    llmgw_gateway_cached_token_ratio{model,replica}        those over the prompt tokens (tokens_total{kind=prompt})
    llmgw_gateway_in_flight{model}, llmgw_gateway_queued{model}
    llmgw_gateway_replica_outstanding{model,replica}, llmgw_gateway_breaker_open{model,replica}
    llmgw_gateway_connections                              open client connections
    llmgw_gateway_prefix_index_blocks                      blocks the prefix index holds (prefix.py)
    llmgw_gateway_prefix_hint_messages_told_total, llmgw_gateway_prefix_hints_total{outcome}
                                                           prefix hints told, and heard or dropped (hints.py)
    llmgw_gateway_edge_refused_total{why}                  connections cut, or requests refused, by a limit of
                                                           the HTTP edge (why: its name in config.py, or
                                                           malformed, or internal_error: a bug answered 500)

A request answered by no replica (refused, unknown model, limited) has replica "".
A key's view (`models` given) has only those models' rows and no edge figures.
"""

from __future__ import annotations

from bisect import bisect_left
from enum import Enum

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Histogram:
    __slots__ = ("counts", "sum", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, v)] += 1
        self.sum += v
        self.count += 1


class Metrics:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = {}
        self.latency: dict[tuple[str, str], Histogram] = {}
        self.ttft: dict[tuple[str, str], Histogram] = {}
        self.tokens: dict[tuple[str, str, str], int] = {}
        self.retries: dict[str, int] = {}
        self.routes: dict[tuple[str, str, Enum], int] = {}
        self.hits: dict[tuple[str, str], int] = {}
        self.cached_tokens: dict[tuple[str, str], int] = {}
        self.refused: dict[str, int] = {}

    def edge(self, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1

    def answered(self, model: str, replica: str, code: int, seconds: float) -> None:
        key = (model, replica, code)
        self.requests[key] = self.requests.get(key, 0) + 1
        h = self.latency.get((model, replica))
        if h is None:
            h = self.latency[(model, replica)] = Histogram()
        h.observe(seconds)

    def first_token(self, model: str, replica: str, seconds: float) -> None:
        h = self.ttft.get((model, replica))
        if h is None:
            h = self.ttft[(model, replica)] = Histogram()
        h.observe(seconds)

    def used(self, model: str, replica: str, prompt: int, completion: int, cached: int = 0) -> None:
        if cached:  # of the prompt's, counted in it too
            k = (model, replica, "cached")
            self.tokens[k] = self.tokens.get(k, 0) + cached
        if prompt:
            k = (model, replica, "prompt")
            self.tokens[k] = self.tokens.get(k, 0) + prompt
        if completion:
            k = (model, replica, "completion")
            self.tokens[k] = self.tokens.get(k, 0) + completion

    def routed(self, model: str, replica: str, reason: Enum) -> None:
        k = (model, replica, reason)
        self.routes[k] = self.routes.get(k, 0) + 1

    def cached(self, model: str, replica: str, cached: int, hit: bool) -> None:
        k = (model, replica)
        self.cached_tokens[k] = self.cached_tokens.get(k, 0) + cached
        if hit:
            self.hits[k] = self.hits.get(k, 0) + 1

    def retried(self, model: str) -> None:
        self.retries[model] = self.retries.get(model, 0) + 1

    def render(
        self,
        loads: dict[str, tuple[int, int]] | None = None,
        backends: list[tuple[str, str, int, bool]] | None = None,
        models: set[str] | None = None,
        connections: int | None = None,
        index_blocks: int | None = None,
        hints: tuple[int, int, int] | None = None,
    ) -> bytes:
        """The text format, written by prometheus_client; `loads` is model ->
        (in flight, queued), `backends` (model, replica, outstanding, breaker
        open) for each routable replica, `hints` (messages of prefix hints told,
        hints heard, hints dropped: hints.py); only the rows of `models` when given."""
        return generate_latest(_Scrape(self, loads, backends, models, connections, index_blocks, hints))

    def families(self, loads, backends, models, connections, index_blocks=None, hints=None):
        keep = (lambda m: True) if models is None else models.__contains__
        p = "llmgw_gateway_"
        requests = CounterMetricFamily(f"{p}requests", "Requests answered, by model, replica and HTTP status.", labels=["model", "replica", "code"])
        for (m, r, c), n in sorted(self.requests.items()):
            if keep(m):
                requests.add_metric([m, r, str(c)], n)
        yield requests
        for name, what, hists in (
            ("request_seconds", "From the request received to its answer's last byte.", self.latency),
            ("time_to_first_token_seconds", "Streamed answers: from the request received to the first chunk.", self.ttft),
        ):
            family = HistogramMetricFamily(f"{p}{name}", what, labels=["model", "replica"])
            for (m, r), h in sorted(hists.items()):
                if not keep(m):
                    continue
                buckets, total = [], 0
                for bound, n in zip(LATENCY_BUCKETS, h.counts):
                    total += n
                    buckets.append((f"{bound:g}", total))
                buckets.append(("+Inf", h.count))
                family.add_metric([m, r], buckets, sum_value=h.sum)
            yield family
        tokens = CounterMetricFamily(f"{p}tokens", "Tokens of the answered requests: prompt and completion, and the prompt's cached (counted in prompt too).", labels=["model", "replica", "kind"])
        for (m, r, k), n in sorted(self.tokens.items()):
            if keep(m):
                tokens.add_metric([m, r, k], n)
        yield tokens
        retries = CounterMetricFamily(
            f"{p}retries", "Requests tried again on another replica (a failure before the first byte).", labels=["model"]
        )
        for m, n in sorted(self.retries.items()):
            if keep(m):
                retries.add_metric([m], n)
        yield retries
        yield from self._routing(keep, p)
        if loads is not None:
            in_flight = GaugeMetricFamily(f"{p}in_flight", "Requests sent to a replica and not yet answered.", labels=["model"])
            queued = GaugeMetricFamily(f"{p}queued", "Requests waiting for a ready replica.", labels=["model"])
            for m, (f, q) in sorted(loads.items()):
                if keep(m):
                    in_flight.add_metric([m], f)
                    queued.add_metric([m], q)
            yield in_flight
            yield queued
        if backends is not None:
            outstanding = GaugeMetricFamily(
                f"{p}replica_outstanding", "Requests in flight to each routable replica from this gateway.", labels=["model", "replica"]
            )
            breaker = GaugeMetricFamily(f"{p}breaker_open", "1 while the replica's breaker keeps requests from it.", labels=["model", "replica"])
            for m, r, n, is_open in sorted(backends):
                if keep(m):
                    outstanding.add_metric([m, r], n)
                    breaker.add_metric([m, r], int(is_open))
            yield outstanding
            yield breaker
        if connections is not None:
            yield GaugeMetricFamily(f"{p}connections", "Open client connections.", value=connections)
            if index_blocks is not None:
                yield GaugeMetricFamily(f"{p}prefix_index_blocks", "Blocks the prefix index holds (an LRU, bounded).", value=index_blocks)
            if hints is not None:
                told, heard, dropped = hints
                yield CounterMetricFamily(f"{p}prefix_hint_messages_told", "Messages of prefix hints told to the other gateways (hints.py).", value=told)
                family = CounterMetricFamily(
                    f"{p}prefix_hints", "Prefix hints of the other gateways: heard (learned), or dropped (malformed, or a replica the table does not list).",
                    labels=["outcome"],
                )  # fmt: skip
                family.add_metric(["heard"], heard)
                family.add_metric(["dropped"], dropped)
                yield family
            refused = CounterMetricFamily(f"{p}edge_refused", "Connections cut by a limit of the HTTP edge, by the limit.", labels=["why"])
            for why, n in sorted(self.refused.items()):
                refused.add_metric([why], n)
            yield refused


    def _routing(self, keep, p: str):
        routed = CounterMetricFamily(
            f"{p}routed", "Answered requests by why their replica was chosen (warm, hashed, overflow, session, least_load, round_robin).",
            labels=["model", "replica", "reason"],
        )  # fmt: skip
        for (m, r, why), n in sorted(self.routes.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2].value)):
            if keep(m):
                routed.add_metric([m, r, why.value], n)
        yield routed
        hits = CounterMetricFamily(f"{p}prefix_hits", "Answers with at least half their prompt in the engine's cache.", labels=["model", "replica"])
        cached = CounterMetricFamily(f"{p}cached_tokens", "Prompt tokens the engine had in its cache.", labels=["model", "replica"])
        ratio = GaugeMetricFamily(f"{p}cached_token_ratio", "Cached prompt tokens over prompt tokens.", labels=["model", "replica"])
        for (m, r), n in sorted(self.cached_tokens.items()):
            if keep(m):
                hits.add_metric([m, r], self.hits.get((m, r), 0))
                cached.add_metric([m, r], n)
                prompt = self.tokens.get((m, r, "prompt"), 0)
                ratio.add_metric([m, r], n / prompt if prompt else 0.0)
        yield hits
        yield cached
        yield ratio


class _Scrape:
    """One scrape's figures, as prometheus_client's exposition reads a registry."""

    def __init__(self, metrics: Metrics, *args) -> None:
        self.metrics, self.args = metrics, args

    def collect(self):
        return self.metrics.families(*self.args)
