"""Where this gateway sent each prompt, told to the other gateways, and
what they told: so that gateways behind one load balancer send a prefix to
the replica that holds it, whichever of them takes the request.

Rendezvous hashing alone (prefix.py) agrees only where each gateway sends a
new prefix where it hashes. Under load it does not: a burst of new prefixes
is spread by load (choose.py), and the other gateway, looking for each where
it hashes, finds it cold. benchmarks/prefix.py saw this: 32 system prompts
sent at once through two gateways taking turns, then conversations
alternating between them: a hit ratio of 0.62, against 0.91 through one
gateway (phase d). So every choice of a replica for a prompt is told, as
the block hashes the index learned and the replica (its id and the identity
its engine answers to, both from the log, so the same at every gateway),
and every gateway learns what the others told as if it had sent it itself.

Hints are soft state on core NATS (bus HINTS_PREFIX), not facts of the log:
one lost costs a cold prefill at worst, and the engines' cached_tokens
still correct what any gateway believes (choose.Router.answered). Only a
gateway may publish them, each on its own subject (bus/roles.py), and only
gateways read them. A hint naming a replica the table does not list (or a
past generation of it: another identity) is dropped; a malformed one is
dropped and counted, never raised: a hint is advice.

Sent in batches (at most BATCH hints a message, well under the readers'
payload limit: a hint is at most prefix_hash_kib/512 hashes of 8 bytes),
from an outbox bounded by MAX_PENDING (past it the oldest go: soft state).
"""

from __future__ import annotations

from collections import deque

import msgspec

from .prefix import DIGEST

BATCH = 32
MAX_PENDING = 4096

_Hint = tuple[str, str, str, bytes]  # model, replica, its identity, the block hashes joined
_decoder = msgspec.msgpack.Decoder(list[_Hint])


class Outbox:
    """The hints not yet sent."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: deque[_Hint] = deque(maxlen=MAX_PENDING)

    def add(self, model: str, replica: str, identity: str, hashes: list[bytes]) -> None:
        self.pending.append((model, replica, identity, b"".join(hashes)))

    def __len__(self) -> int:
        return len(self.pending)

    def batches(self) -> list[bytes]:
        """Everything pending, encoded BATCH hints a message; the outbox empty."""
        out = []
        pending = self.pending
        while pending:
            batch = [pending.popleft() for _ in range(min(BATCH, len(pending)))]
            out.append(msgspec.msgpack.encode(batch))
        return out


def decode(data: bytes) -> list[tuple[str, str, str, list[bytes]]]:
    """A message's hints: (model, replica, identity, block hashes). ValueError if malformed."""
    try:
        hints = _decoder.decode(data)
    except msgspec.MsgspecError as e:
        raise ValueError(str(e)) from None
    out = []
    for model, replica, identity, joined in hints:
        if len(joined) % DIGEST:
            raise ValueError(f"block hashes of {len(joined)} bytes, not a multiple of {DIGEST}")
        out.append((model, replica, identity, [joined[i : i + DIGEST] for i in range(0, len(joined), DIGEST)]))
    return out
