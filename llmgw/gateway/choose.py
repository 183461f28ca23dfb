"""Which replica of a model a request goes to, by the model's routing policy
(the catalog's `routing`), and why: typed reasons, counted on /metrics.
Pure: no I/O; time only as the `now` it is given.

`prefix` (the default; issue 30): a prompt already in a replica's cache
costs a fraction of one that is new to it (SmolLM2 on one CPU thread, a
1,270-token prompt: first token in 9.4 s cold, 0.12 s warm), so
- a request of a session (`user`, or an X-Session-Id header) goes where its
  session went, while that replica is in the table and its breaker lets it
  through (SESSION);
- else the replica holding the longest leading part of its prompt (the
  index, prefix.py) takes it, unless saturated (WARM); a less warm one next,
  then the one it hashes to, then the least loaded (OVERFLOW);
- a prompt warm nowhere goes where it hashes (rendezvous over the replicas
  that can take it, by weight: prefix.py), so the next request with that
  prefix, at this gateway or any other folding the same log, looks where it
  went (HASHED), unless that replica has more outstanding (per unit of
  weight) than the least loaded: then the least loaded (OVERFLOW). A cold
  prompt costs its prefill wherever it goes, so it should not queue for a
  place: with one request of slack, unique prompts were placed nearly at
  random, and their first token came 1.6 times later than by least load
  (benchmarks/prefix.py, the no-prefix workload); at low load, where the
  replicas are idle, the hash decides, and gateways agree (under load,
  the hints tell the others where it went: hints.py);
- a request with no prompt (embeddings) goes to the least loaded (LEAST_LOAD).

Saturated (bounded load, as consistent hashing with bounded loads): a
replica whose outstanding requests per unit of weight, with this one, pass
(1 + epsilon) times the model's mean, and also `floor`. The floor is ours:
at low load the mean is below one request, and the bound alone sent the
second request of a warm prefix to a cold replica, a 75-times slower first
token on this machine, where queueing behind one answer costs less. It is
8: a warm turn here takes ~1 s, a cold prompt ~10 s, so a queue of up to
about 8 costs less than a cold prefill elsewhere. At 4 a burst sent turns
to cold replicas whose prefills queued the rest (benchmarks/prefix.py,
phase c, p90 first token 24 s in two runs of three), where two gateways,
each counting half the load, overflowed 1 request in 200.

`least-load`: fewest outstanding per unit of weight (routing.choose).
`round-robin`: each in turn.

Only replicas the table lists as ready, not excluded (tried and failed) and
whose breaker lets a request through are ever chosen.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .prefix import Index, Prefix, Sessions, rendezvous
from .routing import Backend, choose

PREFIX = "prefix"
LEAST_LOAD = "least-load"
ROUND_ROBIN = "round-robin"
POLICIES = (PREFIX, LEAST_LOAD, ROUND_ROBIN)

# An answer's cached tokens below this share of what the index predicted:
# the replica no longer holds what it was believed to (an eviction, a restart).
CONFIRM_SHARE = 0.5
# Misses in a row, with no hit between, before a replica's older beliefs are dropped (see Router.answered).
MISSES_TO_DROP = 3
# An answer with at least this share of its prompt cached counts as a prefix hit.
HIT_SHARE = 0.5


class Reason(enum.Enum):
    """Why a request went where it did."""

    WARM = "warm"  # the replica with the longest warm prefix
    HASHED = "hashed"  # warm nowhere: where its prefix hashes
    OVERFLOW = "overflow"  # the better ones were saturated
    SESSION = "session"  # where its session went
    LEAST_LOAD = "least_load"  # policy least-load, or no prompt to match
    ROUND_ROBIN = "round_robin"  # policy round-robin


@dataclass(slots=True)
class Choice:
    backend: Backend
    reason: Reason
    warm: int = 0  # blocks of the prompt believed warm there
    blocks: int = 0  # blocks of the prompt hashed
    seq: int = 0  # the index's sequence before this request was learned


@dataclass(slots=True)
class Ask:
    """What the choice reads of one request (the shell's `Gateway.ask`), and
    the choice made for its latest attempt."""

    policy: str = PREFIX
    prefix: Prefix | None = None
    session: str = ""
    choice: Choice | None = None


@dataclass(frozen=True, slots=True)
class Bounds:
    """The settings of the bounded load (GatewayConfig)."""

    epsilon: float = 0.25
    floor: float = 8.0


class Router:
    """One gateway's prefix index and sessions, and the choice."""

    __slots__ = ("index", "sessions", "bounds", "misses")

    def __init__(self, index_bytes: int, sessions: int, bounds: Bounds = Bounds()) -> None:
        self.index = Index(index_bytes)
        self.sessions = Sessions(sessions)
        self.bounds = bounds
        self.misses: dict[int, int] = {}  # token -> misses in a row

    def pick(
        self, policy: str, model: str, backends: list[Backend], now: float, turn: int, exclude=(),
        prefix: Prefix | None = None, session: str = "",
    ) -> Choice | None:  # fmt: skip
        """The replica for one request, or None when none can take it."""
        if policy == LEAST_LOAD or (policy != ROUND_ROBIN and prefix is None and not session):
            b = choose(backends, now, turn, exclude)
            return Choice(b, Reason.LEAST_LOAD) if b is not None else None
        allowed = [b for b in backends if b.replica not in exclude and b.breaker.allows(now)]
        if not allowed:
            return None
        if policy == ROUND_ROBIN:
            return Choice(allowed[turn % len(allowed)], Reason.ROUND_ROBIN)
        by_token = {b.token: b for b in allowed}
        skey = Sessions.key(model, session) if session else b""
        choice = None
        if skey:
            b = by_token.get(self.sessions.get(skey))
            if b is not None:
                choice = Choice(b, Reason.SESSION)
        if choice is None:
            choice = self._by_prefix(allowed, by_token, prefix, turn) if prefix is not None else None
            if choice is None:  # a session's first request with no prompt
                b = choose(allowed, now, turn)
                choice = Choice(b, Reason.LEAST_LOAD)
            if skey:
                self.sessions.put(skey, choice.backend.token)
        if prefix is not None:
            choice.blocks = len(prefix.hashes)
            if choice.reason is Reason.SESSION:
                choice.warm = self.index.warm(prefix, {choice.backend.token}).get(choice.backend.token, 0)
            choice.seq = self.index.seq
            self.index.learn(prefix, choice.backend.token)
        return choice

    def _by_prefix(self, allowed: list[Backend], by_token: dict, prefix: Prefix, turn: int) -> Choice:
        total_out = total_w = 0.0
        for b in allowed:
            total_out += b.outstanding
            total_w += b.weight
        bound = max((1.0 + self.bounds.epsilon) * (total_out + 1) / total_w, self.bounds.floor)

        def fits(b: Backend) -> bool:
            return (b.outstanding + 1) / b.weight <= bound

        depth = self.index.warm(prefix, by_token)
        home = allowed[rendezvous(prefix.ring, [b.replica for b in allowed], [b.weight for b in allowed])]
        if depth:
            ranked = sorted(depth.items(), key=lambda kv: (-kv[1], by_token[kv[0]].outstanding / by_token[kv[0]].weight))
            for i, (token, d) in enumerate(ranked):
                b = by_token[token]
                if fits(b):
                    return Choice(b, Reason.WARM if i == 0 else Reason.OVERFLOW, warm=d)
            if home.token not in depth and fits(home):
                return Choice(home, Reason.OVERFLOW)
        else:
            least = choose(allowed, 0.0, turn)
            if (home.outstanding + 1) / home.weight <= (least.outstanding + 1) / least.weight:
                return Choice(home, Reason.HASHED)
            return Choice(least, Reason.OVERFLOW)
        b = choose(allowed, 0.0, turn)
        return Choice(b, Reason.OVERFLOW, warm=depth.get(b.token, 0))

    def answered(self, choice: Choice, prompt: int, cached: int) -> bool:
        """The engine answered `choice`'s request with `cached` of its `prompt`
        tokens from its cache. Fewer than CONFIRM_SHARE of what the index
        predicted is a miss: the engine no longer held that prefix (it holds it
        again now, having just read it). One miss says one prompt was evicted,
        nothing of the others: dropping every belief about the replica on it
        (as this did before) turned one eviction into a cascade, its other
        groups, still cached there, believed warm nowhere and sent to cold
        replicas (benchmarks/prefix.py, phase c: 16 misses in 100 after the
        first). MISSES_TO_DROP in a row, no hit between, say the replica lost
        what it held (its cache emptied, or too small for what it is sent):
        then what it was sent before is dropped. A restarted engine needs
        none of this: it is a new generation, a new backend, forgotten at once.
        Whether the answer was a prefix hit (HIT_SHARE of the prompt cached)."""
        if prompt <= 0:
            return False
        token = choice.backend.token
        if choice.warm and choice.blocks:
            predicted = prompt * choice.warm / choice.blocks
            if cached < CONFIRM_SHARE * predicted:
                n = self.misses.get(token, 0) + 1
                if n >= MISSES_TO_DROP:
                    self.index.drop(token, choice.seq)
                    n = 0
                self.misses[token] = n
            else:
                self.misses.pop(token, None)
        return cached >= HIT_SHARE * prompt

    def told(self, hashes: list[bytes], backend: Backend) -> None:
        """Another gateway sent a prompt of these blocks to `backend`'s replica (hints.py)."""
        self.index.learn(Prefix(hashes, b"", 0), backend.token)

    def forget(self, tokens) -> None:
        """Replicas that left the table (the fold said so): forgotten."""
        for t in tokens:
            self.index.forget(t)
            self.misses.pop(t, None)
