"""Usage per key, owner and model: coalesced at a gateway (gateway/usage.py),
reported on the log, summed with spend by `ctl get usage` (ctl/usage.py)."""

from __future__ import annotations

import asyncio
import calendar

import pytest

from llmgw.bus.memory import MemoryBus
from llmgw.core.contract import events as ev
from llmgw.ctl import usage as ctl_usage
from llmgw.gateway.usage import Usage, report

from .conftest import sample


def test_usage_is_coalesced_per_key_owner_and_model_and_totalled_for_prometheus():
    u = Usage(100.0)
    u.count("k1", "org/a", "m", 1, 10, 5)
    u.count("k1", "org/a", "m", 1, 20, 5)
    u.count("k2", "org/b", "m", refused=1)
    since, rows = u.take(160.0)
    assert since == 100.0 and u.since == 160.0 and not u.rows
    assert rows == [
        ev.UsageRow(model="m", key="k1", owner="org/a", requests=2, tokens_in=30, tokens_out=10),
        ev.UsageRow(model="m", key="k2", owner="org/b", refused=1),
    ]
    u.count("k1", "org/a", "m", 1, 1, 1)
    text = u.render().decode()
    assert sample(text, "llmgw_gateway_usage_requests_total", key="k1", owner="org/a", model="m") == 3
    assert sample(text, "llmgw_gateway_usage_tokens_total", key="k1", owner="org/a", model="m", kind="in") == 31
    assert sample(text, "llmgw_gateway_usage_refused_total", key="k2", owner="org/b", model="m") == 1
    assert u.render(models={"other"}).decode().count("llmgw_gateway_usage_requests_total{") == 0


async def test_usage_is_reported_on_the_log_each_interval_and_at_the_end():
    bus, u, stop = MemoryBus(), Usage(0.0), asyncio.Event()
    task = asyncio.get_running_loop().create_task(report(bus, "gw1", "i", u, 0.05, stop))
    u.count("k", "org", "m", 1, 3, 4)
    await asyncio.sleep(0.15)
    u.count("k", "org", "m", 1, 1, 1)
    stop.set()
    await task
    events = [ev.decode(d) for s, d in bus.log]
    assert [s for s, _ in bus.log] == ["llmgw.gw.gw1.usage.reported"] * 2
    assert [(e.rows[0].requests, e.rows[0].tokens_in) for e in events] == [(1, 3), (1, 1)]


def test_get_usage_sums_reports_with_spend_and_filters():
    def rep(at, *rows):
        return ev.UsageReported(at=at, gateway="g", since=at - 60, rows=list(rows))

    reports = [
        rep(1000.0, ev.UsageRow(model="m", key="k1", owner="org/a", requests=2, tokens_in=2000, tokens_out=1000)),
        rep(2000.0, ev.UsageRow(model="m", key="k1", owner="org/a", requests=1, tokens_in=1000, tokens_out=0),
            ev.UsageRow(model="free", key="k2", owner="org/b", requests=1, tokens_in=5, refused=3),
            ev.UsageRow(model="m", key="k3", owner="other", requests=1)),
    ]  # fmt: skip
    prices = {"m": (0.5, 2.0)}
    rows = ctl_usage.rows(reports, prices, owner="org")
    assert [(r["key"], r["requests"], r["tokens_in"], r["refused"], r["spend"], r["priced"]) for r in rows] == [
        ("k1", 3, 3000, 0, 3000 / 1000 * 0.5 + 1000 / 1000 * 2.0, True),
        ("k2", 1, 5, 3, 0.0, False),
    ]
    assert [r["requests"] for r in ctl_usage.rows(reports, prices, key="k1", since=1500.0)] == [1]
    assert [r["key"] for r in ctl_usage.rows(reports, prices, model="free")] == ["k2"]


def test_since_takes_durations_dates_and_seconds():
    now = calendar.timegm((2026, 12, 5, 12, 0, 0))
    assert ctl_usage.parse_since("30m", now) == now - 1800
    assert ctl_usage.parse_since("7d", now) == now - 7 * 86400
    assert ctl_usage.parse_since("2026-12-05", now) == calendar.timegm((2026, 12, 5, 0, 0, 0))
    assert ctl_usage.parse_since("2026-12-05T10:00", now) == now - 7200
    assert ctl_usage.parse_since("12345", now) == 12345.0
    with pytest.raises(ValueError, match="is not a time"):
        ctl_usage.parse_since("yesterday", now)
