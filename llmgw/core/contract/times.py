"""A time of the log as text, for reasons that name a moment.

The core may read no clock, and `datetime` can; this is the one conversion
it needs (Unix seconds to a UTC date and time), done by arithmetic. A reason
names a moment rather than counting down to it: a waiting reason is
published each time it changes, and one that counted seconds was a new
decision every pass.
"""

from __future__ import annotations


def utc(at: float) -> str:
    """`at` (Unix seconds) as "YYYY-MM-DDTHH:MM:SSZ", rounded down to the second."""
    secs = int(at // 1)
    days, rest = divmod(secs, 86400)
    # Days since 1970-01-01 to a civil date (proleptic Gregorian), by eras of 400 years.
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{year:04d}-{month:02d}-{day:02d}T{h:02d}:{m:02d}:{s:02d}Z"
