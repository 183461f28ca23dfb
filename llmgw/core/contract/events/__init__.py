"""The event contract: every fact and decision llmgw records, as one tagged union.

The log is forever, so these types only ever grow: a field may be added with a
default, never removed, renamed or retyped, and a tag never changes.
`tests/test_contract.py` holds the code to that against `events/schema/`.

Every event carries its tag (`type`), a schema version (`v`) and the time its
publisher assigned (`at`, Unix seconds). Time enters the fold only this way.

Who may say what is part of the contract too: each event type belongs to one
origin (the operator's CLI, an agent, the control plane), and `origin_of`
tells which subject prefix it must arrive on. An agent speaks only for its
own node: the node named in the subject must be the node in the event.

A module per speaker: ctl.py (the operator), agent.py, gateway.py and
control.py, beside the records the events carry (records.py) and what every
record and event is (base.py); here, the union of them all, the origins,
the codec and `check_origin`.
"""

from __future__ import annotations

from typing import Union

import msgspec

# The contract by speaker, one module each (base.py: what every record and
# event is; records.py: what events carry); `ev.X` names them all here, and
# the policy PolicyApplied carries (policy.py).
from ..policy import Policy  # noqa: F401
from .base import (  # noqa: F401
    SCHEMA_VERSION, Struct, Event,
)
from .records import (  # noqa: F401
    ProfileSpec, ModelSpec, Resources, Limit, Gpu, RunningShard, ShardState,
)
from .ctl import (  # noqa: F401
    ModelApplied, ModelRemoved, ReplicasRestart, ModelRetry, OwnerApplied, OwnerRemoved, ApiKeyApplied,
    ApiKeyRemoved, CredentialRevoked, NodeLabeled, NodeAdmitted, DomainHeld, DomainReleased, FacilityApplied,
    PolicyApplied,
)
from .agent import (  # noqa: F401
    NodeRegistered, ShardStatus, NodePorts, NodePower,
)
from .gateway import (  # noqa: F401
    ROUTE_REASONS, RouteCount, UsageRow, UsageReported, ModelLoad,
)
from .control import (  # noqa: F401
    Scale, Cause, ShardPlacement, PlaceReplica, StopReplica, ScaleModel, RestartReplica, RefuseRestart,
    Victim, Preempt, ParkModel, ModelWaiting, StopStray, Action, Decided, NodeLost, LeaderElected, NodeMuted,
    NodeUnmuted,
)

AnyEvent = Union[
    ModelApplied,
    ModelRemoved,
    NodeRegistered,
    ShardStatus,
    Decided,
    NodeLost,
    ReplicasRestart,
    ModelRetry,
    ApiKeyApplied,
    ApiKeyRemoved,
    ModelLoad,
    OwnerApplied,
    OwnerRemoved,
    NodePorts,
    LeaderElected,
    CredentialRevoked,
    NodeLabeled,
    DomainHeld,
    DomainReleased,
    FacilityApplied,
    NodePower,
    PolicyApplied,
    NodeMuted,
    NodeUnmuted,
    NodeAdmitted,
    UsageReported,
]

EVENT_TYPES: tuple[type[Event], ...] = AnyEvent.__args__  # type: ignore[attr-defined]

# Which subject prefix each kind of event must arrive on.
ORIGIN: dict[type[Event], str] = {
    ModelApplied: "ctl",
    ModelRemoved: "ctl",
    NodeRegistered: "agent",
    ShardStatus: "agent",
    Decided: "control",
    NodeLost: "control",
    ReplicasRestart: "ctl",
    ModelRetry: "ctl",
    ApiKeyApplied: "ctl",
    ApiKeyRemoved: "ctl",
    ModelLoad: "gw",
    OwnerApplied: "ctl",
    OwnerRemoved: "ctl",
    NodePorts: "agent",
    LeaderElected: "control",
    CredentialRevoked: "ctl",
    NodeLabeled: "ctl",
    DomainHeld: "ctl",
    DomainReleased: "ctl",
    FacilityApplied: "ctl",
    NodePower: "agent",
    PolicyApplied: "ctl",
    NodeMuted: "control",
    NodeUnmuted: "ctl",
    NodeAdmitted: "ctl",
    UsageReported: "gw",
}


def tag_of(cls: type[Event]) -> str:
    return cls.__struct_config__.tag  # type: ignore[return-value]


TAGS: dict[str, type[Event]] = {tag_of(c): c for c in EVENT_TYPES}

_decoder = msgspec.json.Decoder(AnyEvent)
_encoder = msgspec.json.Encoder()


def decode(data: bytes) -> Event:
    """Decode one event; raises msgspec.DecodeError/ValidationError on bad input."""
    return _decoder.decode(data)


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


class OriginError(ValueError):
    """An event arrived on a subject whose speaker may not say it."""


def subject_for(event: Event, *, gateway: str = "") -> str:
    """The subject an event is published on: who speaks, then what it is."""
    origin = ORIGIN[type(event)]
    tag = tag_of(type(event))
    if origin == "agent":
        return f"llmgw.agent.{event.node}.{tag}"  # type: ignore[attr-defined]
    if origin == "gw":
        return f"llmgw.gw.{gateway or event.gateway}.{tag}"  # type: ignore[attr-defined]
    return f"llmgw.{origin}.{tag}"


def check_origin(subject: str, event: Event) -> None:
    """Refuse an event whose subject does not match who may say it.

    The subject is what NATS permissions can restrict per credential, so it is
    the trustworthy part: an agent for node A must not speak for node B.
    (Written for speed: it runs once per event of every replay.)
    """
    prefix = _PREFIX[type(event)]
    if not subject.startswith(prefix):
        raise OriginError(f"{tag_of(type(event))} may only be published under {prefix}, not on {subject}")
    if prefix == "llmgw.agent.":
        node = event.node  # type: ignore[attr-defined]
        end = 12 + len(node)
        if subject[12:end] != node or subject[end : end + 1] != ".":
            speaker = subject[12:].partition(".")[0]
            raise OriginError(f"an agent on {speaker} may not speak for node {node}")
    elif prefix == "llmgw.gw.":
        gateway = event.gateway  # type: ignore[attr-defined]
        if subject[9 : 9 + len(gateway) + 1] != gateway + ".":
            speaker = subject[9:].partition(".")[0]
            raise OriginError(f"gateway {speaker} may not speak for gateway {gateway}")


# One string object per origin, so the fold can compare prefixes by identity.
_ORIGIN_PREFIX = {origin: f"llmgw.{origin}." for origin in set(ORIGIN.values())}
_PREFIX: dict[type[Event], str] = {cls: _ORIGIN_PREFIX[origin] for cls, origin in ORIGIN.items()}
