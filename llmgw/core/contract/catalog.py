"""Rules about the catalog that the fold and the decisions share."""

from __future__ import annotations

import hashlib
import re

import msgspec

from .events import ModelSpec, ProfileSpec
from ..folding.facility_facts import KINDS

# Node names appear as a token in NATS subjects; model names in replica ids.
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


def fingerprint(profile: ProfileSpec) -> str:
    """A short digest of a profile's definition.

    It changes when anything that would change the running engine changes, so
    a replica running an older fingerprint is known to need a restart.
    """
    data = msgspec.json.encode(profile)
    if b'"weight"' in data or b'"tools"' in data:  # routing and serving only: they restart nothing
        fields = msgspec.to_builtins(profile)
        fields.pop("weight", None)
        fields.pop("tools", None)
        data = msgspec.json.encode(fields)
    return hashlib.sha256(data).hexdigest()[:12]


def profile_named(spec: ModelSpec, name: str) -> ProfileSpec | None:
    for p in spec.profiles:
        if p.name == name:
            return p
    return None


def max_replicas(spec: ModelSpec) -> int:
    return max(spec.max_replicas, spec.min_replicas)


def spec_problem(spec: ModelSpec) -> str:
    """Why a model spec cannot be folded, or "" when it can."""
    if not MODEL_NAME_RE.match(spec.name):
        return f"model name {spec.name!r} must be letters, digits and . _ : / - (at most 128)"
    if not spec.profiles:
        return f"model {spec.name} has no profile"
    if spec.min_replicas < 0:
        return f"model {spec.name}: min_replicas must not be negative"
    seen = set()
    for p in spec.profiles:
        if p.name in seen:
            return f"model {spec.name}: two profiles are named {p.name}"
        seen.add(p.name)
        if p.gpus < 0 or p.nodes < 1:
            return f"model {spec.name}, profile {p.name}: gpus must be >= 0 and nodes >= 1"
        # What a shard holds is added to its node's count and taken away at
        # its exit: a negative amount would make room that is not there.
        if p.memory_gb < 0 or p.cpu_cores < 0:
            return f"model {spec.name}, profile {p.name}: memory_gb and cpu_cores must be >= 0"
        # (Counted into a domain's draw: a negative one would make power that is not there.)
        if p.power_w < 0:
            return f"model {spec.name}, profile {p.name}: power_w must be >= 0"
        if p.keep_within and p.keep_within not in KINDS:
            return f"model {spec.name}, profile {p.name}: keep_within must be one of {', '.join(KINDS)}"
    return ""
