"""A catalog in YAML, validated with pydantic; errors name the file, the line
and the field, so a typo is found without reading the code.

    models:
      - name: smollm2
        min_replicas: 2
        profiles:
          - name: cpu
            engine: llama.cpp
            gpus: 0
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .. import yamlfile
from ..core.contract.catalog import MODEL_NAME_RE
from ..core.contract.events import ApiKeyApplied, Event, FacilityApplied, Limit, ModelApplied, ModelSpec, OwnerApplied, PolicyApplied, ProfileSpec, Resources
from ..core.folding.facility_facts import domain_problem
from ..core.contract.policy import DEFAULT, Policy
from ..core.folding.state import ApiKey, Owner, State


class CatalogError(ValueError):
    """A catalog file with an error: each line names the file, the line and the field."""


class _Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    engine: str = "sim"
    args: list[str] = []
    gpus: int = Field(1, ge=0)
    nodes: int = Field(1, ge=1)
    gpu_memory_gb: float = Field(0.0, ge=0)
    memory_gb: float = Field(0.0, ge=0)
    gpu_model: str = ""
    cpu_cores: int = Field(0, ge=0)
    pool: str = ""
    model: str = ""
    weight: float = Field(1.0, gt=0)  # routing: the share of requests its replicas get
    # Facility (core/scheduling/facility.py): the declared draw of one shard, in watts,
    # and the domain kind every shard of a multi-node replica must share.
    power_w: float = Field(0.0, ge=0)
    keep_within: Literal["", "site", "room", "row", "rack", "pdu"] = ""
    # May run simulated on a simulated node (`llmgw agent --simulate`), where
    # its engine would not run; without it, a real engine's profile is never placed there.
    simulate: bool = False
    tools: bool = True  # serving: false when its engine cannot call tools (the gateway refuses them)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    aliases: list[str] = []
    owner: str = ""
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(0, ge=0)
    target_load: float = Field(0.0, ge=0)
    scale_down_delay_s: float = Field(300.0, ge=0)
    on_demand: bool = False
    idle_s: float = Field(600.0, gt=0)
    drain_grace_s: float = Field(30.0, ge=0)
    priority: Literal["critical", "standard", "opportunistic"] = "standard"
    routing: Literal["prefix", "least-load", "round-robin"] = "prefix"  # gateway/choose.py
    price_in_per_1k: float = Field(0.0, ge=0)  # spend in `ctl get usage` (issue 32)
    price_out_per_1k: float = Field(0.0, ge=0)
    profiles: list[_Profile] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not MODEL_NAME_RE.match(v):
            raise ValueError("a model name is letters, digits and . _ : / - (at most 128), starting with a letter or digit")
        return v

    @field_validator("profiles")
    @classmethod
    def _unique(cls, v: list[_Profile]) -> list[_Profile]:
        names = [p.name for p in v]
        if len(set(names)) != len(names):
            raise ValueError("two profiles have the same name")
        return v


# The limits the gateways hold an owner's and a key's requests to (gateway/quota.py).
GATEWAY_LIMITS = (
    "requests_per_minute", "tokens_per_minute", "tokens_per_day", "tokens_per_month", "spend_per_day", "spend_per_month",
)  # fmt: skip


class _GatewayLimits(BaseModel):
    """What a key, or an owner's keys together, may ask of the gateways (gateway/quota.py); 0: no limit."""

    model_config = ConfigDict(extra="forbid")
    requests_per_minute: int = Field(0, ge=0)
    tokens_per_minute: int = Field(0, ge=0)
    tokens_per_day: int = Field(0, ge=0)
    tokens_per_month: int = Field(0, ge=0)
    spend_per_day: float = Field(0.0, ge=0)  # in the catalog's currency, at its models' prices
    spend_per_month: float = Field(0.0, ge=0)


class _ApiKey(_GatewayLimits):
    """A key of the gateway. Give `key` (hashed here, never published) or its
    `key_sha256`; the log and the gateways only ever see the hash."""

    model_config = ConfigDict(extra="forbid")
    name: str
    owner: str
    key: str | None = Field(None, min_length=16)
    key_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")

    @model_validator(mode="after")
    def _one_key(self) -> "_ApiKey":
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("give the key or its key_sha256, one of the two")
        return self


class _Amount(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: int = Field(0, ge=0)
    cpu_cores: int = Field(0, ge=0)
    memory_gb: float = Field(0.0, ge=0)


class _Limit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: int | None = Field(None, ge=0)
    cpu_cores: int | None = Field(None, ge=0)
    memory_gb: float | None = Field(None, ge=0)


class _Owner(_GatewayLimits):
    """An owner: "org", or a team of it, "org/team"."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}(/[A-Za-z0-9_-]{1,64})*$")
    guarantee: _Amount = _Amount()
    limit: _Limit = _Limit()


class _Policy(BaseModel):
    """The fleet-wide numbers of the rules (llmgw/core/contract/policy.py says what
    each one does); a field not given keeps its default."""

    model_config = ConfigDict(extra="forbid")
    min_lifetime_s: float = Field(DEFAULT.min_lifetime_s, ge=0)
    hold_s: float = Field(DEFAULT.hold_s, ge=0)
    eviction_grace_s: float = Field(DEFAULT.eviction_grace_s, ge=0)
    max_victims: int = Field(DEFAULT.max_victims, ge=0)
    restart_max_surge: int = Field(DEFAULT.restart_max_surge, ge=1)
    backoff_first_s: float = Field(DEFAULT.backoff_first_s, ge=0)
    backoff_max_s: float = Field(DEFAULT.backoff_max_s, ge=0)
    park_after: int = Field(DEFAULT.park_after, ge=1)
    adopt_wait_s: float = Field(DEFAULT.adopt_wait_s, ge=0)
    start_timeout_s: float = Field(DEFAULT.start_timeout_s, gt=0)
    admission: Literal["operator", "open", "manual"] = DEFAULT.admission


class _Facility(BaseModel):
    """The facility: the power cap in watts of each domain that has one
    (KIND/NAME: rack/r4-12, pdu/pdu-a)."""

    model_config = ConfigDict(extra="forbid")
    budgets: dict[str, float] = {}

    @field_validator("budgets")
    @classmethod
    def _domains(cls, v: dict[str, float]) -> dict[str, float]:
        for domain, watts in v.items():
            problem = domain_problem(domain)
            if problem:
                raise ValueError(problem)
            if not watts > 0:
                raise ValueError(f"{domain}: a cap is a number of watts above 0, not {watts!r}")
        return v


class _Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: list[_Model] = []
    owners: list[_Owner] = []
    api_keys: list[_ApiKey] = []
    policy: _Policy | None = None
    facility: _Facility | None = None


class Catalog(NamedTuple):
    models: list[ModelSpec]
    owners: list[OwnerApplied]  # `at` 0: set when published
    api_keys: list[ApiKeyApplied]
    policy: Policy | None = None  # None: the file has no `policy:` section (the policy is left as it is)
    given: tuple[str, ...] = ()  # the sections the file has (models, owners, api_keys, policy), even empty
    facility: FacilityApplied | None = None  # the file's `facility:` section, if it has one


class Item(NamedTuple):
    """One thing a catalog file defines, against what the log has now."""

    kind: str  # model, owner, api key, policy
    name: str
    had: object | None  # as the state has it (ModelSpec, Owner, ApiKey, Policy); None: not yet
    now: object  # as the file says, in the same type
    event: Event | None  # what publishing it takes (`at` 0: stamped when published); None: unchanged


def items(state: State, catalog: Catalog) -> list[Item]:
    """What `ctl apply` publishes for a file, in order: the policy and the
    owners first (the rules and limits the models are then placed under),
    then each model and API key, with the event that changes it (None when
    unchanged). `apply` publishes these events; `apply --dry-run` folds them
    on a copy of the state instead."""
    out = []
    if catalog.policy is not None:
        same = catalog.policy == state.policy
        out.append(Item("policy", "", state.policy, catalog.policy,
                        None if same else PolicyApplied(at=0.0, policy=catalog.policy)))
    for o in catalog.owners:
        had_o = state.owners.get(o.name)
        now_o = Owner(guarantee=o.guarantee, limit=o.limit, **{f: getattr(o, f) for f in GATEWAY_LIMITS})
        out.append(Item("owner", o.name, had_o, now_o, None if had_o == now_o else o))
    for spec in catalog.models:
        current = state.models.get(spec.name)
        had = current.spec if current is not None else None
        out.append(Item("model", spec.name, had, spec, None if had == spec else ModelApplied(at=0.0, model=spec)))
    for k in catalog.api_keys:
        had_k = state.api_keys.get(k.name)
        now_k = ApiKey(owner=k.owner, key_sha256=k.key_sha256, **{f: getattr(k, f) for f in GATEWAY_LIMITS})
        out.append(Item("api key", k.name, had_k, now_k, None if had_k == now_k else k))
    return out


# Profile fields added after catalogs were first applied: left out of the
# spec when the file does not give them. msgspec leaves a default out of
# the encoding only when it is the very default object, and a float from
# the file (0.0) is not: with power_w written out, every profile of an
# unchanged catalog got a new fingerprint, and applying it again would
# have restarted every replica (found by replay --what-if of a recorded log).
_LATER_PROFILE_FIELDS = ("power_w", "keep_within", "simulate")


def _profile(p: _Profile) -> ProfileSpec:
    fields = p.model_dump()
    for name in _LATER_PROFILE_FIELDS:
        if name not in p.model_fields_set:
            fields.pop(name, None)
    return ProfileSpec(**fields)


def load(path: str | Path) -> list[ModelSpec]:
    """The models of a catalog file."""
    return load_catalog(path).models


def load_catalog(path: str | Path) -> Catalog:
    """Everything a catalog file defines: models and API keys."""
    path = Path(path)
    try:
        catalog, _ = yamlfile.load(path, _Catalog)
    except yamlfile.YamlFileError as e:
        raise CatalogError(str(e)) from None
    for kind, names in (
        ("model", [m.name for m in catalog.models]),
        ("owner", [o.name for o in catalog.owners]),
        ("api key", [k.name for k in catalog.api_keys]),
    ):
        for n in sorted(set(names)):
            if names.count(n) > 1:
                raise CatalogError(f"{path}: {kind} {n} is defined twice")
    models = [
        ModelSpec(**{**m.model_dump(), "profiles": [_profile(p) for p in m.profiles]})
        for m in catalog.models
    ]
    keys = [
        ApiKeyApplied(
            at=0.0,
            name=k.name,
            owner=k.owner,
            key_sha256=k.key_sha256 or hashlib.sha256(k.key.encode()).hexdigest(),  # type: ignore[union-attr]
            **{f: getattr(k, f) for f in GATEWAY_LIMITS},
        )
        for k in catalog.api_keys
    ]
    owners = [
        OwnerApplied(
            at=0.0, name=o.name, guarantee=Resources(**o.guarantee.model_dump()), limit=Limit(**o.limit.model_dump()),
            **{f: getattr(o, f) for f in GATEWAY_LIMITS},
        )
        for o in catalog.owners
    ]
    facility = FacilityApplied(at=0.0, budgets=dict(catalog.facility.budgets)) if catalog.facility else None
    policy = Policy(**catalog.policy.model_dump()) if catalog.policy is not None else None
    _within_contract(path, models, owners, keys, facility, policy)
    return Catalog(models=models, owners=owners, api_keys=keys, facility=facility, policy=policy,
                   given=tuple(sorted(catalog.model_fields_set)))


def _within_contract(path: Path, models, owners, keys, facility, policy) -> None:
    """Each event the file would publish, decoded as the fold will decode it:
    one past the contract's bounds (core/contract/bounds.py) would be quarantined by
    the fold, so `ctl apply` said "applied" while nothing changed. Refused
    here instead, naming the file, the entry and the field."""
    import msgspec

    from ..core.contract import events as ev

    named = [(f"model {m.name}", ModelApplied(at=0.0, model=m)) for m in models]
    named += [(f"owner {o.name}", o) for o in owners] + [(f"api key {k.name}", k) for k in keys]
    if facility is not None:
        named.append(("facility", facility))
    if policy is not None:
        named.append(("policy", PolicyApplied(at=0.0, policy=policy)))
    errors = []
    for what, event in named:
        try:
            ev.decode(ev.encode(event))
        except msgspec.ValidationError as e:
            errors.append(f"{path}: {what}: {e} (past the event contract's bounds, llmgw/core/contract/bounds.py)")
    if errors:
        raise CatalogError("\n".join(errors))
