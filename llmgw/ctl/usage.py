"""`llmgw ctl get usage`: the gateways' usage reports (UsageReported, one
per gateway and interval, gateway/usage.py) summed per key, owner and model,
with spend at the catalog's prices. Pure: the reports and prices are given.

`--owner O` keeps O's keys and those of every owner under it (a team's
usage is its organisation's too); `--since T` keeps the reports whose
interval ended at or after T (a report is the unit: its rows are not split
by time). Spend is at each model's price now (`price_in_per_1k`,
`price_out_per_1k` in the catalog): a price changed since is not applied to
the past at the old rate.
"""

from __future__ import annotations

import calendar
import re
import time

from ..core.contract import events as ev

_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_FORMATS = ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d")


def parse_since(text: str, now: float) -> float:
    """A time: `90s`, `30m`, `24h`, `7d`, `2w` ago; an ISO date or time (UTC); Unix seconds."""
    text = text.strip()
    m = _AGO.match(text)
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    for f in _FORMATS:
        try:
            return float(calendar.timegm(time.strptime(text, f)))
        except ValueError:
            pass
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"--since: {text!r} is not a time: give 30m, 24h, 7d (ago), 2026-12-05, 2026-12-05T10:00 (UTC) or Unix seconds") from None


def under(owner: str, wanted: str) -> bool:
    return owner == wanted or owner.startswith(wanted + "/")


def rows(
    reports: list[ev.UsageReported], prices: dict[str, tuple[float, float]], *,
    owner: str = "", key: str = "", model: str = "", since: float = 0.0,
) -> list[dict]:  # fmt: skip
    """One row per (key, owner, model): requests, tokens in and out, refused, spend."""
    sums: dict[tuple[str, str, str], list[int]] = {}
    first: dict[tuple[str, str, str], float] = {}
    for report in reports:
        if report.at < since:
            continue
        for r in report.rows:
            if (owner and not under(r.owner, owner)) or (key and r.key != key) or (model and r.model != model):
                continue
            k = (r.key, r.owner, r.model)
            s = sums.get(k)
            if s is None:
                s = sums[k] = [0, 0, 0, 0]
                first[k] = report.since
            s[0] += r.requests
            s[1] += r.tokens_in
            s[2] += r.tokens_out
            s[3] += r.refused
            first[k] = min(first[k], report.since)
    out = []
    for (k, o, m), (n, tin, tout, refused) in sorted(sums.items()):
        pin, pout = prices.get(m, (0.0, 0.0))
        out.append({
            "id": f"{k or '-'}/{m}", "key": k, "owner": o, "model": m, "requests": n, "tokens_in": tin,
            "tokens_out": tout, "refused": refused, "spend": round(tin / 1000 * pin + tout / 1000 * pout, 6),
            "priced": bool(pin or pout), "since": first[(k, o, m)],
        })  # fmt: skip
    return out


def prices_of(state) -> dict[str, tuple[float, float]]:
    return {name: (m.spec.price_in_per_1k, m.spec.price_out_per_1k) for name, m in state.models.items()}
