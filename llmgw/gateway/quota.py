"""The arithmetic of the limits every gateway holds together (issue 32). Pure:
time is `now` (seconds since the epoch, UTC), given by the caller.

What is limited, for a key and for its owner and every owner above it (a
team's requests count for its organisation too), each 0 for no limit:

    requests_per_minute   a token bucket holding a minute's worth, refilled evenly
    tokens_per_minute     (so a burst of a whole minute's allowance, then the rate)
    tokens_per_day        a budget per UTC day
    tokens_per_month      a budget per UTC calendar month
    spend_per_day         budgets in the catalog's currency: tokens at the model's
    spend_per_month       price (price_in_per_1k, price_out_per_1k; a model with
                          no price costs nothing), counted in millionths

A rate is kept as GCRA's one number, the time its bucket is full again
(`tat`): taking n moves it n intervals on, and is refused where that would
put it more than a minute ahead of now. One number is what makes a rate
shareable: a compare-and-set on it is a take (shared_limits.py). A budget
is a count of tokens used in its window, under a key named by the window
("2026-12-05", "2026-12"), so a new day starts at zero and nothing needs
resetting.

A request's tokens are reserved before it is let in: its prompt's estimate
(the body's bytes, less ENVELOPE_BYTES, over BYTES_PER_TOKEN: about
right for English, settled when the answer says) plus its `max_tokens` (or `max_completion_tokens`);
without either, `default_completion` of the config, the whole reservation
at most the smallest token limit's amount, so that the answer may then run
past it (a debt its key pays by waiting). A request whose prompt and
max_tokens exceed a token limit's amount can never pass: it is refused as
too large (429 without Retry-After, as OpenAI's "Request too large").
"""

from __future__ import annotations

import calendar
import enum
import math
import time
from dataclasses import dataclass, field

import msgspec

from ..bus import kv_token

MINUTE = 60.0
MICRO = 1_000_000  # a spend is counted in millionths of the catalog's currency
BYTES_PER_TOKEN = 4  # a prompt's estimate: its body's bytes over this (settled later)
ENVELOPE_BYTES = 64  # ... less these, the JSON around a prompt (model, role, keys): not prompt tokens
MAX_DEBT_MINUTES = 1.0  # a rate's debt (an answer past its reservation) is at most a minute's worth
SLACK_S = 1e-3  # a time of ~1.8e9 s is exact to ~1e-7 s: sums of intervals are compared with this slack


class Kind(enum.Enum):
    REQUESTS_PER_MINUTE = "requests_per_minute"
    TOKENS_PER_MINUTE = "tokens_per_minute"
    TOKENS_PER_DAY = "tokens_per_day"
    TOKENS_PER_MONTH = "tokens_per_month"
    SPEND_PER_DAY = "spend_per_day"  # counted in millionths of the catalog's currency
    SPEND_PER_MONTH = "spend_per_month"

    @property
    def tokens(self) -> bool:
        return self in (Kind.TOKENS_PER_MINUTE, Kind.TOKENS_PER_DAY, Kind.TOKENS_PER_MONTH)

    @property
    def spend(self) -> bool:
        return self in (Kind.SPEND_PER_DAY, Kind.SPEND_PER_MONTH)

    @property
    def rate(self) -> bool:
        return self in (Kind.REQUESTS_PER_MINUTE, Kind.TOKENS_PER_MINUTE)

    @property
    def daily(self) -> bool:
        return self in (Kind.TOKENS_PER_DAY, Kind.SPEND_PER_DAY)

    @property
    def words(self) -> str:
        return self.value.replace("_", " ")


KINDS = tuple(Kind)


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit of one key or owner: `scope` "key" or "owner". What every
    request reads of it is worked out once (the hot path: benchmarks/gateway.py --limits)."""

    scope: str
    name: str
    kind: Kind
    amount: int
    base: str = field(default="", compare=False)  # its key in the quotas bucket, less a budget's window
    tokens: bool = field(default=False, compare=False)
    spend: bool = field(default=False, compare=False)
    rate: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", f"{self.scope}.{kv_token(self.name)}.{self.kind.value}")
        object.__setattr__(self, "tokens", self.kind.tokens)
        object.__setattr__(self, "spend", self.kind.spend)
        object.__setattr__(self, "rate", self.kind.rate)

    def counter(self, now: float) -> str:
        """Its key in the quotas bucket: a rate's one key, a budget's per window."""
        return self.base if self.rate else f"{self.base}.{window(self.kind, now)[0]}"

    def describe(self) -> str:
        amount = f"{self.amount / MICRO:.2f}" if self.spend else str(self.amount)
        return f"{self.kind.words} of {'this API key' if self.scope == 'key' else 'owner ' + self.name} ({amount})"


def _amounts(of) -> list[tuple[Kind, int]]:
    """A key's or owner's limits: (kind, amount), a spend in millionths."""
    out = []
    for k in KINDS:
        v = getattr(of, k.value, 0) or 0
        amount = round(v * MICRO) if k.spend else int(v)
        if amount > 0:
            out.append((k, amount))
    return out


def limits_of(key_name: str, key, owners: dict) -> tuple[Limit, ...]:
    """Every limit a request of the key meets: the key's, then its owner's and each one's above it."""
    out = [Limit("key", key_name, k, a) for k, a in _amounts(key)]
    path = key.owner
    while path:
        owner = owners.get(path)
        if owner is not None:
            out.extend(Limit("owner", path, k, a) for k, a in _amounts(owner))
        path = path.rpartition("/")[0]
    return tuple(out)


def cost(prompt: int, completion: int, price: tuple[float, float]) -> int:
    """What tokens cost at a model's price (per 1,000 in and out), in millionths, rounded up."""
    return math.ceil(prompt * price[0] * 1000 + completion * price[1] * 1000) if price[0] or price[1] else 0


_windows: dict[tuple[Kind, int], tuple[str, float]] = {}  # by UTC day (Unix days are 86,400 s exactly)


def window(kind: Kind, now: float) -> tuple[str, float]:
    """A budget's window at `now` and when it ends ("", 0 for a rate)."""
    if kind.rate:
        return "", 0.0
    day = int(now // 86400)
    got = _windows.get((kind, day))
    if got is None:
        if len(_windows) > 64:
            _windows.clear()
        got = _windows[(kind, day)] = _window(kind, day * 86400.0)
    return got


def _window(kind: Kind, now: float) -> tuple[str, float]:
    t = time.gmtime(now)
    if kind.daily:
        start = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
        return f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}", start + 86400.0
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return f"{t.tm_year:04d}-{t.tm_mon:02d}", float(calendar.timegm((year, month, 1, 0, 0, 0)))


# --------------------------------------------------------------------- rates (GCRA)


def interval(amount: int) -> float:
    return MINUTE / amount


def rate_take(tat: float, n: int, amount: int, now: float) -> float | None:
    """The new `tat` with `n` taken, or None where they do not fit now."""
    new = max(tat, now) + n * interval(amount)
    return new if new - now <= MINUTE + SLACK_S else None


def rate_wait(tat: float, n: int, amount: int, now: float) -> float:
    """Seconds until `n` fit (0: they do now)."""
    return max(0.0, max(tat, now) + n * interval(amount) - now - MINUTE)


def rate_charge(tat: float, n: int, amount: int, now: float) -> float:
    """`n` taken whether they fit or not: a debt, at most MAX_DEBT_MINUTES past full."""
    return min(max(tat, now) + n * interval(amount), now + MINUTE * (1 + MAX_DEBT_MINUTES))


def rate_give(tat: float, n: int, amount: int, now: float) -> float:
    """`n` given back (leased and not used): the bucket is no fuller than full."""
    return max(now, tat - n * interval(amount))


# --------------------------------------------------------------------- budgets


def budget_take(used: int, n: int, amount: int) -> int | None:
    return used + n if used + n <= amount else None


def budget_wait(kind: Kind, now: float) -> float:
    """A spent budget comes back with its next window."""
    return max(1.0, window(kind, now)[1] - now)


def take(kind: Kind, value: float, n: int, amount: int, now: float) -> float | None:
    """A counter's new value with `n` taken, or None where they do not fit."""
    if kind.rate:
        return rate_take(value, n, amount, now)
    got = budget_take(int(value), n, amount)
    return None if got is None else float(got)


def charge(kind: Kind, value: float, n: int, amount: int, now: float) -> float:
    """`n` taken whether they fit or not (usage past a reservation, or while partitioned)."""
    return rate_charge(value, n, amount, now) if kind.rate else float(int(value) + n)


def give(kind: Kind, value: float, n: int, amount: int, now: float) -> float:
    return rate_give(value, n, amount, now) if kind.rate else float(max(0, int(value) - n))


def wait(kind: Kind, value: float, n: int, amount: int, now: float) -> float:
    return rate_wait(value, n, amount, now) if kind.rate else budget_wait(kind, now)


def encode(value: float) -> bytes:
    return repr(float(value)).encode()


def decode(data: bytes | None) -> float:
    """A counter's value; one missing or unreadable is an empty one (0)."""
    if not data:
        return 0.0
    try:
        v = float(data)
    except ValueError:
        return 0.0
    return v if math.isfinite(v) and v >= 0 else 0.0


# --------------------------------------------------------------------- reservations


class _Asked(msgspec.Struct):
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    max_output_tokens: int | None = None  # the Responses API's, where a body is that


_asked = msgspec.json.Decoder(_Asked)


def estimate_prompt(body: bytes) -> int:
    return -(-max(0, len(body) - ENVELOPE_BYTES) // BYTES_PER_TOKEN)


def reservation(body: bytes, default_completion: int, limits: tuple[Limit, ...]) -> tuple[int, int, bool]:
    """(the prompt's estimate, the tokens to reserve, whether max_tokens was given)."""
    prompt = estimate_prompt(body)
    try:
        a = _asked.decode(body)
        asked = a.max_completion_tokens or a.max_tokens or a.max_output_tokens
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        asked = None
    if asked is not None and asked > 0:
        return prompt, prompt + asked, True
    smallest = min((l.amount for l in limits if l.tokens), default=0)
    want = prompt + default_completion
    return prompt, (max(prompt, min(want, smallest)) if smallest else want), False


def too_large(limits: tuple[Limit, ...], tokens: int, spend: int = 0) -> Limit | None:
    """The limit a request can never pass (its tokens, or their cost, past the amount), if any."""
    for l in limits:
        if (l.tokens and tokens > l.amount) or (l.spend and spend > l.amount):
            return l
    return None


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a request is not let in now: typed, rendered at the edge (server.py)."""

    limit: Limit | None  # None: the limits could not be checked (the store did not answer, policy closed)
    wait_s: float
    too_large: bool = False
    requested: int = 0

    @property
    def status(self) -> int:
        return 503 if self.limit is None else 429

    @property
    def code(self) -> str:
        if self.limit is None:
            return "limits_unavailable"
        return "request_too_large" if self.too_large else "rate_limit_exceeded"

    def message(self) -> str:
        if self.limit is None:
            return "The gateways' shared limits cannot be checked now (NATS does not answer) and this gateway fails closed."
        if self.too_large:
            what = f"{self.requested / MICRO:.4f}" if self.limit.spend else f"{self.requested} tokens"
            return f"Request too large for {self.limit.describe()}: requested {what}."
        budget = "" if self.limit.kind.rate else " budget"
        return f"Rate limit reached for {self.limit.describe()}{budget}."
