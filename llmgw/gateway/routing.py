"""Where a request goes: the routing table as a function of the folded state,
the choice of a replica, and a breaker per endpoint. Pure: no I/O, and time
only as the `now` it is given.

The table is rebuilt from the state whenever the log says something that may
change it (a replica ready, draining, gone; the catalog; the keys). A replica
is routable while it is ready with an endpoint; one being stopped (draining)
gets no new request. Its weight is its profile's.

The least-load choice (`choose` here; the catalog's `routing: least-load`,
and what the others fall back on: choose.py) is least outstanding requests
per unit of weight: the replica with the fewest requests in flight from this
gateway, relative to its weight, among those whose breaker lets a request
through; ties go round in turn.

A replica's engine must be the one its agent started: an engine given an
identity at start (ShardStatus.identity) is sent requests only on a
connection where its GET /v1/models listed it (`identity_mismatch`; the shell
asks once per new connection). A simulated replica once advertised a port a
real engine held, and a request for `llama-70b` came back 200 from SmolLM2.
Every engine also has a key of its own, which the gateway reads from the
engine keys bucket under `Target.key_name` (the rank 0 shard's node, id and
generation) and sends on every request to it.

When no replica can take a request, `when_none_ready` says whether it waits:
not for a model the control plane says cannot be served now (it waits for
room that is not there, its owner is over a limit, or it is parked:
core/rules/waits.py), which is refused at once with that reason, where it hung for
the whole wait timeout and then got a 503 that did not say why; for a model
that runs replicas it does, up to the gateway's wait timeout;
once replicas were tried and failed, while another is coming (placing,
starting, loading, or a failed one about to be replaced), or for a grace
after the failure (the log says a crashed engine failed, and its replacement
placed, a moment after a request found its port closed). A model whose single
replica crashed once answered its users 502 while the replacement started.

A breaker opens after BREAKER_FAILURES failures in a row (no connection, the
connection lost before an answer, a 502/503/504); while open the endpoint gets
nothing; after its cool-down one request is let through (half-open) and its
outcome closes the breaker or opens it again for twice as long.
"""

from __future__ import annotations

import enum
import itertools
import json
from dataclasses import dataclass, field

from ..bus import engine_key_name
from ..core.contract.catalog import profile_named
from ..core.rules.scaling import decided
from ..core.folding.state import ApiKey, State
from ..core.contract.tenancy import keys_by_hash
from ..core.rules.waits import request_wait
from . import serves as serving

BREAKER_FAILURES = 3
BREAKER_COOLDOWN_S = 2.0
BREAKER_COOLDOWN_MAX_S = 30.0
MIN_WEIGHT = 1e-6


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True, slots=True)
class Target:
    """One ready replica, as the log says it."""

    replica: str
    model: str
    endpoint: str
    weight: float = 1.0
    identity: str = ""  # what its engine must list in GET /v1/models ("" : not checked)
    key_name: str = ""  # where its engine's key is in the engine keys bucket (bus.engine_key_name)


@dataclass(slots=True)
class Route:
    """One model of the catalog."""

    name: str
    owner: str = ""
    created: int = 0
    targets: tuple[Target, ...] = ()
    # Why a request for it must not wait for a replica ("" : it may: one is
    # coming, or load will bring one): it runs none, or cannot be served now
    # (`wait_kind` says which: waits.WaitKind; "" when it runs none).
    no_wait: str = ""
    wait_kind: str = ""
    # Replicas on their way: placing, starting, loading, failed (to be
    # replaced), and those its decided count lacks. 0 when parked.
    coming: int = 0
    # What its profiles' engines serve (tools, embeddings, rerank, context).
    serves: serving.Serves = serving.EVERYTHING
    routing: str = "prefix"  # the catalog's policy (choose.py)


@dataclass(slots=True)
class Table:
    routes: dict[str, Route] = field(default_factory=dict)  # by model name
    names: dict[str, str] = field(default_factory=dict)  # name or alias -> model name
    keys: dict[str, tuple[str, ApiKey]] = field(default_factory=dict)  # sha256 -> (name, key)

    def resolve(self, name: str) -> Route | None:
        model = self.names.get(name)
        return self.routes.get(model) if model is not None else None

    def aliases(self, model: str) -> list[str]:
        return sorted(n for n, m in self.names.items() if m == model and n != model)


def routable(state: State) -> list[Target]:
    """Every replica a request may go to, in replica id order."""
    out = []
    for rid in sorted(state.replicas):
        r = state.replicas[rid]
        if r.state != "ready" or not r.shards:
            continue
        lead = min(r.shards, key=lambda s: s.rank)
        if lead.state != "ready" or not lead.endpoint:
            continue
        model = state.models.get(r.model)
        if model is None:  # removed from the catalog: being stopped
            continue
        profile = profile_named(model.spec, r.profile)
        weight = profile.weight if profile is not None else 1.0
        out.append(
            Target(
                replica=rid, model=r.model, endpoint=lead.endpoint.rstrip("/"), weight=max(weight, MIN_WEIGHT),
                identity=lead.identity, key_name=engine_key_name(lead.node, lead.id, lead.generation),
            )
        )  # fmt: skip
    return out


COMING_STATES = ("placing", "starting", "loading", "failed")


@dataclass(slots=True)
class _Counts:
    live: int = 0
    on_way: int = 0  # in COMING_STATES
    loading: int = 0
    ready: int = 0


def _counts(state: State) -> dict[str, _Counts]:
    out: dict[str, _Counts] = {}
    for r in state.replicas.values():
        if r.state == "stopping" or r.state == "stopped":
            continue
        c = out.get(r.model)
        if c is None:
            c = out[r.model] = _Counts()
        c.live += 1
        if r.state in COMING_STATES:
            c.on_way += 1
            if r.state == "loading":
                c.loading += 1
        elif r.state == "ready":
            c.ready += 1
    return out


def coming(state: State, counts: dict[str, _Counts] | None = None) -> dict[str, int]:
    """Per model, the replicas on their way to ready (see Route.coming)."""
    counts = _counts(state) if counts is None else counts
    out = {}
    none = _Counts()
    for name, model in state.models.items():
        if model.parked:
            continue
        c = counts.get(name, none)
        n = c.on_way + max(decided(model) - c.live, 0)
        if n:
            out[name] = n
    return out


def build(state: State) -> Table:
    """The routing table the state implies."""
    table = Table(keys=keys_by_hash(state))
    counts = _counts(state)
    on_way = coming(state, counts)
    none = _Counts()
    for name in sorted(state.models):
        model = state.models[name]
        spec = model.spec
        c = counts.get(name, none)
        wait = request_wait(model, c.on_way, c.loading, c.ready)
        kind = ""
        if wait.fails_fast:  # parked, no room, over a limit: core/rules/waits.py
            no_wait, kind = wait.reason, wait.kind.value
        elif not spec.on_demand and spec.target_load <= 0 and decided(model) == 0:
            no_wait = f"model {name} runs no replica (min_replicas 0, no target_load, not on demand)"
        else:
            no_wait = ""
        table.routes[name] = Route(
            name=name, owner=spec.owner, created=int(model.applied_at), no_wait=no_wait, wait_kind=kind,
            coming=on_way.get(name, 0),
            serves=serving.of(spec),
            routing=spec.routing,
        )
        table.names[name] = name
    for name in sorted(state.models):  # aliases never shadow a model's own name
        for alias in state.models[name].spec.aliases:
            table.names.setdefault(alias, name)
    by_model: dict[str, list[Target]] = {}
    for t in routable(state):
        by_model.setdefault(t.model, []).append(t)
    for model, targets in by_model.items():
        table.routes[model].targets = tuple(targets)
    return table


# --------------------------------------------------------------------------- waiting


class NoneReady(enum.Enum):
    """What becomes of a request no replica can take now."""

    WAIT = "wait"  # one is coming, or may: wait for it (up to the wait timeout)
    REFUSE = "refuse"  # none will come (parked, runs none, removed): 503 at once
    FAIL = "fail"  # those tried failed and no other is coming: the failure is the answer


def when_none_ready(route: Route | None, tried: int, failed_for: float, grace_s: float) -> NoneReady:
    """Whether a request for `route` that no ready replica can take waits:
    `tried` replicas have failed it, the last `failed_for` seconds ago."""
    if route is None:
        return NoneReady.REFUSE
    if tried:
        if route.no_wait:
            return NoneReady.FAIL
        if route.coming or failed_for < grace_s:
            return NoneReady.WAIT
        return NoneReady.FAIL
    return NoneReady.REFUSE if route.no_wait else NoneReady.WAIT


# --------------------------------------------------------------------------- identity


def identity_mismatch(status: int, body: bytes, identity: str) -> str:
    """Why an engine that answered GET /v1/models with `status` and `body`
    is not the one given `identity`, or "" when it lists it (a model's `id`
    or one of its `aliases`, as llama.cpp lists its aliases)."""
    if status != 200:
        return f"GET /v1/models answered {status}, not a list naming {identity}"
    try:
        data = json.loads(body)["data"]
        names = []
        for m in data:
            names.append(m["id"])
            names.extend(a for a in m.get("aliases") or () if isinstance(a, str))
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"GET /v1/models answered {body[:80]!r}, not an OpenAI list of models"
    if identity in names:
        return ""
    shown = ", ".join(sorted(set(map(str, names)))[:4]) or "no model"
    return f"its GET /v1/models lists {shown}, not {identity}"


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """("host", port) of "http://host:port" (the scheme optional; port 80 if none)."""
    rest = endpoint.split("://", 1)[-1].split("/", 1)[0]
    if rest.startswith("["):  # [v6]:port
        host, _, port = rest[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    return host, int(port) if port else 80


# --------------------------------------------------------------------------- the breaker


class Breaker:
    """A breaker for one endpoint: closed, open, or half-open with one probe."""

    __slots__ = ("state", "failures", "opened_at", "cooldown", "probing")

    def __init__(self) -> None:
        self.state = "closed"
        self.failures = 0
        self.opened_at = 0.0
        self.cooldown = BREAKER_COOLDOWN_S
        self.probing = False

    def allows(self, now: float) -> bool:
        """Whether a request may be sent now (a half-open breaker: the probe)."""
        state = self.state
        if state == "closed":
            return True
        if state == "open":
            return now >= self.opened_at + self.cooldown
        return not self.probing

    def picked(self, now: float) -> None:
        """A request is being sent through it (after `allows`)."""
        if self.state != "closed":
            self.state = "half-open"
            self.probing = True

    def success(self) -> None:
        self.state = "closed"
        self.failures = 0
        self.cooldown = BREAKER_COOLDOWN_S
        self.probing = False

    def failure(self, now: float) -> None:
        if self.state == "half-open":
            self.state, self.opened_at, self.probing = "open", now, False
            self.cooldown = min(self.cooldown * 2, BREAKER_COOLDOWN_MAX_S)
            return
        self.failures += 1
        if self.failures >= BREAKER_FAILURES:
            self.state, self.opened_at = "open", now

    def released(self) -> None:
        """A request ended with no verdict on the endpoint (the client left)."""
        self.probing = False


# --------------------------------------------------------------------------- the choice


_tokens = itertools.count(1)


class Backend:
    """What this gateway keeps per replica: requests outstanding, its breaker.
    Kept across rebuilds of the table for as long as the replica is in it.
    `token`: a number of its own, what the prefix index knows it by (a new
    generation of the replica is a new backend, so a new token: forgotten)."""

    __slots__ = (
        "target", "replica", "model", "endpoint", "host", "port", "weight", "outstanding", "breaker", "pool", "identity",
        "token",
    )  # fmt: skip

    def __init__(self, target: Target) -> None:
        self.target = target
        self.replica = target.replica
        self.model = target.model
        self.endpoint = target.endpoint
        self.host, self.port = split_endpoint(target.endpoint)
        self.weight = target.weight
        self.identity = target.identity
        self.outstanding = 0
        self.breaker = Breaker()
        self.pool = None  # the shell's connections to it
        self.token = next(_tokens)


def choose(backends: list[Backend], now: float, turn: int, exclude: tuple[str, ...] | set[str] = ()) -> Backend | None:
    """The backend with the fewest requests outstanding per unit of weight,
    among those not excluded whose breaker allows one; ties in turn from `turn`."""
    n = len(backends)
    if n == 1:
        b = backends[0]
        if b.replica in exclude or not b.breaker.allows(now):
            return None
        return b
    best = None
    best_score = 0.0
    for i in range(n):
        b = backends[(turn + i) % n]
        if exclude and b.replica in exclude:
            continue
        if b.breaker.state != "closed" and not b.breaker.allows(now):
            continue
        score = (b.outstanding + 1) / b.weight
        if best is None or score < best_score:
            best, best_score = b, score
    return best
