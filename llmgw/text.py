"""Text for people: aligned tables and times, shared by `llmgw ctl` and `llmgw replay`."""

from __future__ import annotations

import datetime as dt


def when(at: float) -> str:
    """A time of the log (Unix seconds) in UTC, to the millisecond."""
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def table(rows: list[list[str]], header: list[str]) -> str:
    """Columns padded to their widest cell, the header first."""
    cells = [header] + rows
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)
