"""Nats-Msg-Id's no one else can predict.

JetStream drops a publish whose Nats-Msg-Id it saw in the last
DUPLICATE_WINDOW_S and acks it as a duplicate of the first. When ids were
`<leader>-<counter>` (and `<node>-<instance>-<counter>`), every reader of the
log could see the next one coming: a gateway that published first under the
control plane's next ids had every decision acked as a duplicate, treated
as landed, and froze the control plane for as long as it kept at it; a node
did the same to the record of its own revocation (issue 35, finding 3).

So each id carries 64 random bits drawn for that message (`secrets`): an id
is known only once it is in the log, and by then it is used. A retry of the
same publish keeps its id (that is what deduplication is for: a publish
that timed out may have landed). The other half of the fix is in
NatsBus.publish: a duplicate ack counts as landed only when the message it
points at is ours.
"""

from __future__ import annotations

import itertools
import secrets

RANDOM_BYTES = 8


def fresh(prefix: str) -> str:
    """One id: `<prefix>-<64 random bits>`."""
    return f"{prefix}-{secrets.token_hex(RANDOM_BYTES)}"


class MsgIds:
    """`<prefix>-<n>-<random>` for each message: the counter for people
    reading the log, the random part so that no one can claim it first.
    `peek()` says the next one (for a test that tries to claim it first)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._numbers = itertools.count(1)
        self._next = ""

    def peek(self) -> str:
        if not self._next:
            self._next = fresh(f"{self.prefix}-{next(self._numbers)}")
        return self._next

    def __next__(self) -> str:
        taken, self._next = self.peek(), ""
        return taken

    def __iter__(self) -> "MsgIds":
        return self
