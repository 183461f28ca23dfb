"""What followed an operator's action from the console: the decision that
took its event into account, or the word that none needs to follow.

WHY it is decided from the fold and not by waiting for a decision: many
actions need none (a node's location labels, a hold without drain): the
control plane decides only when there is something to do, so no decision
ever comes, and a banner that waits for one ("waiting for the decision that
follows…") waits forever. Once the console's fold has the action's event,
`decide` (pure, the control plane's own) is asked on that state: no action
means nothing needs to follow, said at once; actions mean a decision is due,
and the banner waits for a Decided whose basis includes the event, for at
most the console's settle time (ConsoleConfig.follow_settle_s), then says
that none came and what the fold would decide.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import msgspec

from ..core.rules.decide import decide
from ..core.simulation.history import Record, _said
from ..core.folding.state import State
from .views import _decided, _seq_of

PENDING, FOLLOWED, NOTHING, LATE = "pending", "followed", "nothing", "late"
SAID_LIMIT = 20  # the actions of a decision said in the banner


class Followed(msgspec.Struct, kw_only=True):
    """What the banner of an action says: `status` one of pending (the
    console has not folded the event yet, or a decision is due), followed
    (`seq` is the decision, `actions` what it did), nothing (no decision needs
    to follow) or late (one was due and none came within the settle time;
    `actions` what the fold would decide now)."""

    status: str
    event: int
    seq: int = 0
    actions: list[str] = []
    said: str = ""


def followed(records: Sequence[Record], state: State, event: int, event_at: float, now: float,
             settle_s: float) -> Followed:
    """What followed the event at sequence `event` (published at `event_at`)."""
    if state.seq < event:
        return Followed(status=PENDING, event=event, said="the console has not folded it yet")
    for i in range(bisect.bisect_right(records, event, key=_seq_of), len(records)):
        d = _decided(records[i])
        if d is not None and d.basis >= event:
            said = [_said(a) for a in d.actions]
            return Followed(status=FOLLOWED, event=event, seq=records[i][0], actions=said[:SAID_LIMIT],
                            said=f"the decision that followed (event {records[i][0]})")
    due = decide(state, now)
    if not due:
        return Followed(status=NOTHING, event=event,
                        said="no decision needs to follow: the control plane has nothing to do after it")
    if now - event_at < settle_s:
        return Followed(status=PENDING, event=event, said="waiting for the decision that follows")
    return Followed(status=LATE, event=event, actions=[_said(a) for a in due][:SAID_LIMIT],
                    said=f"no decision followed within {settle_s:g} s; the control plane would now decide")
