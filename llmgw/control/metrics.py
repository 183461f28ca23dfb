"""The control plane's own metrics: Prometheus `/metrics`, with prometheus_client.

What the plane does (its passes, the decisions it published) is counted
as it happens; what the fleet is (nodes, replicas, GPUs, waiting models) is
read from the folded state at scrape time, so a scrape always agrees with
the state and nothing is kept twice. The registry is the plane's own, not
the process-wide one: control planes in one process (tests) do not share
series.

    llmgw_control_pass_seconds                  histogram: decide() of one pass
    llmgw_control_decisions_total{kind}         actions published (place, stop, wait, scale, preempt ...)
    llmgw_control_stops_total{kind}             replicas and strays stopped, by why (core/contract/reasons.py's kinds)
    llmgw_control_restarts_total{kind}          restarts begun or refused, by why (reasons.py's kinds)
    llmgw_control_voided_decisions_total        actions voided at fold time (the log's count)
    llmgw_control_quarantined_events_total      malformed events kept aside (the log's count)
    llmgw_control_fenced_total                  decisions refused by the server's fence
    llmgw_control_commands_sent_total           commands sent to agents
    llmgw_control_log_position                  the last sequence folded
    llmgw_control_log_lag_events                how far the fold is behind the log's end (as last probed)
    llmgw_control_snapshot_age_seconds          since the snapshot on disk was written (-1: none)
    llmgw_control_snapshot_behind_events        events folded since the last snapshot
    llmgw_control_leading                       1 while this control plane leads
    llmgw_control_term                          the leader's term, as folded
    llmgw_control_nodes{state}                  ready | lost
    llmgw_control_replicas{state}               placing | starting | loading | ready | stopping | failed
    llmgw_control_gpus{state}                   used | free (of ready nodes)
    llmgw_control_models                        models in the catalog
    llmgw_control_models_waiting{kind}          models short of replicas, by why (core/rules/waits.py's kinds)

It is served on `--metrics-listen` (config.METRICS_LISTEN) by a small HTTP
server in the plane's own event loop: a scrape reads the state between two
folds, never while one mutates it (prometheus_client's own server is a
thread, which would read the dicts as the fold changes them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..core.contract import events as ev
from ..core.simulation.history import action_about
from ..core.contract.reasons import CauseKind, kind_of
from ..core.rules.waits import DECIDED, model_kind

if TYPE_CHECKING:
    from .plane import ControlPlane

log = logging.getLogger("llmgw.control")
# A `_created` series per counter doubles what a scrape carries and no
# dashboard here reads it.
disable_created_metrics()

PASS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
NODE_STATES = ("ready", "lost")
REPLICA_STATES = ("placing", "starting", "loading", "ready", "stopping", "failed")
# Why a model waits: the kinds decide says with each reason (core/rules/waits.py), and "other".
WAITING_KINDS = tuple(k.value for k in DECIDED) + ("other",)
MAX_REQUEST_HEAD = 8 * 1024
# Why a replica stopped or restarted: a cause's kind (reasons.py), read as a
# field, never from the words; "other" for one recorded without a cause or
# of a kind this code does not know (the labels stay a known, bounded set).
CAUSE_KINDS = frozenset(k.value for k in CauseKind)
_STOPS = (ev.StopReplica, ev.StopStray)
_RESTARTS = (ev.RestartReplica, ev.RefuseRestart)


class ControlMetrics:
    """The plane's registry: counters it adds to, and the state read at scrape time."""

    def __init__(self, plane: "ControlPlane") -> None:
        self.plane = plane
        self.registry = CollectorRegistry(auto_describe=False)
        self.pass_seconds = Histogram(
            "llmgw_control_pass_seconds", "Seconds decide() took for one pass (liveness and publishing not counted).",
            buckets=PASS_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.decisions = Counter(
            "llmgw_control_decisions", "Actions this control plane published, by kind.", ["kind"], registry=self.registry
        )
        self.stops = Counter(
            "llmgw_control_stops", "Replicas and strays this control plane stopped, by why (a cause's kind).", ["kind"],
            registry=self.registry,
        )
        self.restarts = Counter(
            "llmgw_control_restarts", "Restarts this control plane began or refused, by why (a cause's kind).", ["kind"],
            registry=self.registry,
        )
        self.log_last = 0  # the log's last sequence, as last probed (plane._probe_loop)
        self.registry.register(_StateCollector(plane, self))

    def landed(self, actions) -> None:
        for a in actions:
            self.decisions.labels(action_about(a)[0]).inc()
            counter = self.stops if isinstance(a, _STOPS) else self.restarts if isinstance(a, _RESTARTS) else None
            if counter is not None:
                kind = kind_of(a)
                counter.labels(kind if kind in CAUSE_KINDS else "other").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def serve(self, host: str, port: int) -> asyncio.AbstractServer:
        """GET /metrics on host:port, in this event loop."""
        return await asyncio.start_server(self._serve, host, port, limit=MAX_REQUEST_HEAD)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
            method, path, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            if method == "GET" and path.split("?", 1)[0] == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, self.render()
            else:
                status, ctype, body = "404 Not Found", "text/plain; charset=utf-8", b"/metrics only\n"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()


class _StateCollector:
    """The gauges of the folded state, computed when scraped."""

    def __init__(self, plane: "ControlPlane", metrics: ControlMetrics) -> None:
        self.plane, self.metrics = plane, metrics

    def collect(self):
        plane, state = self.plane, self.plane.state
        p = "llmgw_control_"
        yield CounterMetricFamily(f"{p}voided_decisions", "Actions voided when folded: they no longer held.", value=state.voided_count)
        yield CounterMetricFamily(f"{p}quarantined_events", "Malformed events kept aside by the fold.", value=state.quarantine_count)
        yield CounterMetricFamily(f"{p}fenced", "Decisions the server refused (another writer, or not yet folded).", value=plane.fenced)
        yield CounterMetricFamily(f"{p}commands_sent", "Commands sent to agents.", value=plane.commands_sent)
        yield GaugeMetricFamily(f"{p}log_position", "The last stream sequence folded.", value=state.seq)
        last = max(self.metrics.log_last, state.seq)
        yield GaugeMetricFamily(f"{p}log_lag_events", "Events in the log not yet folded (the log's end as last probed).", value=last - state.seq)
        age = -1.0
        if plane.snapshots is not None:
            try:
                age = max(0.0, time.time() - plane.snapshots.path.stat().st_mtime)
            except OSError:
                pass
        yield GaugeMetricFamily(f"{p}snapshot_age_seconds", "Seconds since the snapshot on disk was written (-1: none).", value=age)
        yield GaugeMetricFamily(
            f"{p}snapshot_behind_events", "Events folded since the last snapshot.", value=max(0, state.seq - plane.snapshot_seq)
        )
        yield GaugeMetricFamily(f"{p}leading", "1 while this control plane leads.", value=1 if plane.leading() else 0)
        yield GaugeMetricFamily(f"{p}term", "The leader's term, as folded.", value=state.term)

        nodes = dict.fromkeys(NODE_STATES, 0)
        used = free = 0
        for n in state.nodes.values():
            nodes[n.state] = nodes.get(n.state, 0) + 1
            if n.state == "ready":
                u = len(n.used)
                used += u
                free += len(n.gpus) - u
        yield _by("nodes", "Nodes by state.", "state", nodes)
        yield _by("gpus", "GPUs of ready nodes: used or free.", "state", {"used": used, "free": free})
        replicas = dict.fromkeys(REPLICA_STATES, 0)
        for r in state.replicas.values():
            replicas[r.state] = replicas.get(r.state, 0) + 1
        yield _by("replicas", "Replicas by state.", "state", replicas)
        yield GaugeMetricFamily(f"{p}models", "Models in the catalog.", value=len(state.models))
        waiting = dict.fromkeys(WAITING_KINDS, 0)
        for m in state.models.values():
            kind = model_kind(m)
            if kind:
                waiting[kind] = waiting.get(kind, 0) + 1
        yield _by("models_waiting", "Models short of the replicas they want, by why.", "kind", waiting)


def _by(name: str, what: str, label: str, counts: dict[str, int]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(f"llmgw_control_{name}", what, labels=[label])
    for key, n in counts.items():
        g.add_metric([key], n)
    return g
