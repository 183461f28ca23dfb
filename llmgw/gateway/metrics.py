"""The gateway's metrics in Prometheus' text format (version 0.0.4). Pure:
the counters are plain numbers the shell adds to, and `render` writes them.

    llmgw_gateway_requests_total{model,replica,code}       requests answered
    llmgw_gateway_request_seconds{model,replica}           latency, received to last byte
    llmgw_gateway_time_to_first_token_seconds{model,replica}  streamed answers: to the first chunk
    llmgw_gateway_tokens_total{model,replica,kind}         kind: prompt | completion
    llmgw_gateway_retries_total{model}                     attempts on another replica
    llmgw_gateway_in_flight{model}, llmgw_gateway_queued{model}
    llmgw_gateway_replica_outstanding{model,replica}, llmgw_gateway_breaker_open{model,replica}
    llmgw_gateway_connections                              open client connections
    llmgw_gateway_edge_refused_total{why}                  connections cut by a limit of the HTTP edge
                                                           (why: its name in config.py, or malformed)

A request answered by no replica (refused, unknown model, limited) has replica "".
A key's view (`models` given) has only those models' rows and no edge figures.
"""

from __future__ import annotations

from bisect import bisect_left

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


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple) -> str:
    return ",".join(f'{n}="{_escape(str(v))}"' for n, v in zip(names, values))


class Metrics:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = {}
        self.latency: dict[tuple[str, str], Histogram] = {}
        self.ttft: dict[tuple[str, str], Histogram] = {}
        self.tokens: dict[tuple[str, str, str], int] = {}
        self.retries: dict[str, int] = {}
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

    def used(self, model: str, replica: str, prompt: int, completion: int) -> None:
        if prompt:
            k = (model, replica, "prompt")
            self.tokens[k] = self.tokens.get(k, 0) + prompt
        if completion:
            k = (model, replica, "completion")
            self.tokens[k] = self.tokens.get(k, 0) + completion

    def retried(self, model: str) -> None:
        self.retries[model] = self.retries.get(model, 0) + 1

    def render(
        self,
        loads: dict[str, tuple[int, int]] | None = None,
        backends: list[tuple[str, str, int, bool]] | None = None,
        models: set[str] | None = None,
        connections: int | None = None,
    ) -> bytes:
        """The text format; `loads` is model -> (in flight, queued), `backends`
        (model, replica, outstanding, breaker open) for each routable replica;
        only the rows of `models` when given."""
        keep = (lambda m: True) if models is None else models.__contains__
        out: list[str] = []
        p = "llmgw_gateway_"
        out.append(f"# HELP {p}requests_total Requests answered, by model, replica and HTTP status.")
        out.append(f"# TYPE {p}requests_total counter")
        for (m, r, c), n in sorted(self.requests.items()):
            if not keep(m):
                continue
            out.append(f"{p}requests_total{{{_labels(('model', 'replica', 'code'), (m, r, c))}}} {n}")
        for name, what, hists in (
            ("request_seconds", "From the request received to its answer's last byte.", self.latency),
            ("time_to_first_token_seconds", "Streamed answers: from the request received to the first chunk.", self.ttft),
        ):
            out.append(f"# HELP {p}{name} {what}")
            out.append(f"# TYPE {p}{name} histogram")
            for (m, r), h in sorted(hists.items()):
                if not keep(m):
                    continue
                labels = _labels(("model", "replica"), (m, r))
                total = 0
                for bound, n in zip(LATENCY_BUCKETS, h.counts):
                    total += n
                    out.append(f'{p}{name}_bucket{{{labels},le="{bound:g}"}} {total}')
                out.append(f'{p}{name}_bucket{{{labels},le="+Inf"}} {h.count}')
                out.append(f"{p}{name}_sum{{{labels}}} {h.sum:.6f}")
                out.append(f"{p}{name}_count{{{labels}}} {h.count}")
        out.append(f"# HELP {p}tokens_total Tokens of the answered requests: prompt and completion.")
        out.append(f"# TYPE {p}tokens_total counter")
        for (m, r, k), n in sorted(self.tokens.items()):
            if not keep(m):
                continue
            out.append(f"{p}tokens_total{{{_labels(('model', 'replica', 'kind'), (m, r, k))}}} {n}")
        out.append(f"# HELP {p}retries_total Requests tried again on another replica (a failure before the first byte).")
        out.append(f"# TYPE {p}retries_total counter")
        for m, n in sorted(self.retries.items()):
            if not keep(m):
                continue
            out.append(f'{p}retries_total{{model="{_escape(m)}"}} {n}')
        if loads is not None:
            loads = {m: v for m, v in loads.items() if keep(m)}
            out.append(f"# HELP {p}in_flight Requests sent to a replica and not yet answered.")
            out.append(f"# TYPE {p}in_flight gauge")
            for m, (f, _) in sorted(loads.items()):
                out.append(f'{p}in_flight{{model="{_escape(m)}"}} {f}')
            out.append(f"# HELP {p}queued Requests waiting for a ready replica.")
            out.append(f"# TYPE {p}queued gauge")
            for m, (_, q) in sorted(loads.items()):
                out.append(f'{p}queued{{model="{_escape(m)}"}} {q}')
        if backends is not None:
            backends = [b for b in backends if keep(b[0])]
            out.append(f"# HELP {p}replica_outstanding Requests in flight to each routable replica from this gateway.")
            out.append(f"# TYPE {p}replica_outstanding gauge")
            for m, r, n, _ in sorted(backends):
                out.append(f"{p}replica_outstanding{{{_labels(('model', 'replica'), (m, r))}}} {n}")
            out.append(f"# HELP {p}breaker_open 1 while the replica's breaker keeps requests from it.")
            out.append(f"# TYPE {p}breaker_open gauge")
            for m, r, _, is_open in sorted(backends):
                out.append(f"{p}breaker_open{{{_labels(('model', 'replica'), (m, r))}}} {int(is_open)}")
        if connections is not None:
            out.append(f"# HELP {p}connections Open client connections.")
            out.append(f"# TYPE {p}connections gauge")
            out.append(f"{p}connections {connections}")
            out.append(f"# HELP {p}edge_refused_total Connections cut by a limit of the HTTP edge, by the limit.")
            out.append(f"# TYPE {p}edge_refused_total counter")
            for why, n in sorted(self.refused.items()):
                out.append(f'{p}edge_refused_total{{why="{_escape(why)}"}} {n}')
        return ("\n".join(out) + "\n").encode()
