"""A gateway's usage per key, owner and model: coalesced into a UsageReported
every `usage_interval` (GatewayConfig), so that the log holds a row per key
and model per interval and gateway, not an event per request; and kept as
totals since the gateway started, for Prometheus.

What is counted: the requests a key sent a model (answered or not, once they
passed its limits), their prompt and answer tokens as the engine said (or,
for a stream cut before its usage, its prompt's estimate and one token an
event: server.py), and the requests refused past a limit. `llmgw ctl get
usage` sums the rows over the log (ctl/usage.py), with spend at the
catalog's prices.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..bus.msgids import fresh as fresh_msg_id
from ..core.contract import events as ev
from ..core.contract.bounds import MAX_USAGE_ROWS

log = logging.getLogger("llmgw.gateway")

_Key = tuple[str, str, str]  # (key, owner, model)
REQUESTS, TOKENS_IN, TOKENS_OUT, REFUSED = range(4)


class Usage:
    def __init__(self, now: float) -> None:
        self.since = now
        self.rows: dict[_Key, list[int]] = {}  # since the last report
        self.totals: dict[_Key, list[int]] = {}  # since the start

    def count(self, key: str, owner: str, model: str, requests: int = 0, tokens_in: int = 0, tokens_out: int = 0, refused: int = 0) -> None:
        k = (key, owner, model)
        for table in (self.rows, self.totals):
            row = table.get(k)
            if row is None:
                row = table[k] = [0, 0, 0, 0]
            row[REQUESTS] += requests
            row[TOKENS_IN] += tokens_in
            row[TOKENS_OUT] += tokens_out
            row[REFUSED] += refused

    def take(self, now: float) -> tuple[float, list[ev.UsageRow]]:
        """The interval's start and its rows (at most MAX_USAGE_ROWS: the rest in the next)."""
        since, self.since = self.since, now
        keys = list(self.rows)[:MAX_USAGE_ROWS]
        out = []
        for k in keys:
            r = self.rows.pop(k)
            out.append(ev.UsageRow(model=k[2], key=k[0], owner=k[1], requests=r[0], tokens_in=r[1], tokens_out=r[2], refused=r[3]))
        return since, out

    def render(self, models: set[str] | None = None) -> bytes:
        """Prometheus' text of the totals (`models`: only these models' rows).

            llmgw_gateway_usage_requests_total{key,owner,model}
            llmgw_gateway_usage_tokens_total{key,owner,model,kind}   kind: in (prompt) | out (answer)
            llmgw_gateway_usage_refused_total{key,owner,model}       refused past a limit
        """
        from prometheus_client import generate_latest
        from prometheus_client.core import CounterMetricFamily

        p, labels = "llmgw_gateway_usage_", ["key", "owner", "model"]
        requests = CounterMetricFamily(f"{p}requests", "Requests per API key, owner and model, past the key's limits.", labels=labels)
        tokens = CounterMetricFamily(f"{p}tokens", "Tokens per API key, owner and model: prompt (in), answer (out).", labels=[*labels, "kind"])
        refused = CounterMetricFamily(f"{p}refused", "Requests refused past a limit, per API key, owner and model.", labels=labels)
        for (k, o, m), v in sorted(self.totals.items()):
            if models is None or m in models:
                requests.add_metric([k, o, m], v[REQUESTS])
                tokens.add_metric([k, o, m, "in"], v[TOKENS_IN])
                tokens.add_metric([k, o, m, "out"], v[TOKENS_OUT])
                refused.add_metric([k, o, m], v[REFUSED])

        class _Scrape:
            def collect(self):
                return [requests, tokens, refused]

        return generate_latest(_Scrape())


async def report(bus, gateway: str, instance: str, usage: Usage, interval: float, stop: asyncio.Event) -> None:
    """Every `interval`, the rows since the last, on the log; once more at `stop`."""
    n = 0
    while True:
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except asyncio.TimeoutError:
            pass
        while usage.rows:
            since, rows = usage.take(time.time())
            n += 1
            event = ev.UsageReported(at=time.time(), gateway=gateway, since=since, rows=rows)
            try:
                await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=fresh_msg_id(f"gw-{gateway}-{instance}-u{n}"))
            except Exception as e:  # counted again in the next: never lost while the gateway lives
                log.warning("cannot publish the usage of this gateway: %s", e)
                for r in rows:
                    usage.count(r.key, r.owner, r.model, r.requests, r.tokens_in, r.tokens_out, r.refused)
                    t = usage.totals[(r.key, r.owner, r.model)]  # (counted twice in the totals: undone)
                    t[REQUESTS] -= r.requests
                    t[TOKENS_IN] -= r.tokens_in
                    t[TOKENS_OUT] -= r.tokens_out
                    t[REFUSED] -= r.refused
                break
        if stop.is_set():
            return
