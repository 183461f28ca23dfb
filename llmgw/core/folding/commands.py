"""Commands to agents, derived from the folded state.

Commands are not facts: they follow from committed decisions, and whatever is
outstanding can always be derived again from the state. That is why a new
leader simply re-sends them, and why an agent must act on each only once, by
shard id and generation, however often it arrives.

Every command carries the term of the leader that sent it (`LeaderElected`):
an agent remembers the highest term it has seen and never acts on a command
of an older one, so a deposed leader's commands are fenced as its decisions
are. 0: sent by a control plane that does not campaign (tests). Terms
count within one log (`log`, the log's identity): a command from another
log (NATS made anew) begins the count again instead of being refused for ever.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from ..contract.catalog import profile_named
from ..contract.events import ProfileSpec
from .state import State


class StartShard(msgspec.Struct, kw_only=True, tag_field="command", tag="start"):
    shard: str
    replica: str
    generation: int
    model: str
    profile: ProfileSpec
    fingerprint: str
    rank: int
    gpus: list[int]
    port: int
    nodes: list[str]  # every node of the replica, by rank: rank 0 is the leader
    # Shards on this node that must have exited before this one starts: the
    # replica it replaces in place, whose GPUs and port it takes over.
    after: list[str] = []
    term: int = 0
    log: str = ""


class StopShard(msgspec.Struct, kw_only=True, tag_field="command", tag="stop"):
    """Stop a shard. With `grace_s`, drain it first: the agent waits up to
    that long for the requests in flight to finish (as the engine's metrics
    tell, or the whole grace when it has none), then SIGTERM, then SIGKILL."""

    shard: str
    generation: int
    reason: str
    grace_s: float = 0.0
    term: int = 0
    log: str = ""


class Reregister(msgspec.Struct, kw_only=True, tag_field="command", tag="reregister"):
    """Sent to a node the control plane counts as lost but hears again (a
    healed partition): its agent registers anew, reporting what it runs, and
    adoption takes it from there."""

    reason: str
    term: int = 0
    log: str = ""


Command = StartShard | StopShard | Reregister

_decoder = msgspec.json.Decoder(Command)
_encoder = msgspec.json.Encoder()


def encode(cmd: Command) -> bytes:
    return _encoder.encode(cmd)


def decode(data: bytes) -> Command:
    return _decoder.decode(data)


def outstanding(state: State) -> Iterator[tuple[str, Command]]:
    """(node, command) for everything an agent has yet to acknowledge."""
    for rep in state.replicas.values():
        model = state.models.get(rep.model)
        profile = profile_named(model.spec, rep.profile) if model else None
        nodes = [s.node for s in sorted(rep.shards, key=lambda s: s.rank)]
        for sh in rep.shards:
            node = state.nodes.get(sh.node)
            if node is None or node.state != "ready":
                continue
            if sh.state == "placing" and rep.state != "stopping" and profile is not None:
                yield sh.node, StartShard(
                    shard=sh.id,
                    replica=rep.id,
                    generation=sh.generation,
                    model=rep.model,
                    profile=profile,
                    fingerprint=rep.fingerprint,
                    rank=sh.rank,
                    gpus=sh.gpus,
                    port=sh.port,
                    nodes=nodes,
                    after=sh.after,
                )
            elif sh.state == "stopping":
                yield sh.node, StopShard(shard=sh.id, generation=sh.generation, reason=rep.reason, grace_s=rep.drain_s)
    for name, node in state.nodes.items():
        if node.state != "ready":
            continue
        for shard, stray in node.strays.items():
            if stray.stopping:
                yield name, StopShard(shard=shard, generation=stray.generation, reason=stray.reason)
