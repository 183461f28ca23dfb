"""Draining a held domain (`llmgw ctl facility hold DOMAIN --drain`).

Each replica with a shard in a drained domain is restarted beside itself,
like a restart with surge (restarts.py): its replacement is placed elsewhere
(placement places nothing in a held domain), and it is stopped only once
that one serves. So a model never goes below its desired count while there
is room elsewhere, paced as its restarts are (one at a time by default, so
a rack of one model's replicas does not all move at once).

A replica whose replacement fits nowhere else stays where it is, serving,
and says why (its restart refused, the reason kept on it). It is tried
again once room appears somewhere (a pass in which a replica of it would
fit), not every pass: a refusal each pass would be a decision each pass.
"""

from __future__ import annotations

from ..contract import events as ev
from ..scheduling.facility import draining
from .passes import ModelPass, Pass
from ..contract.reasons import K, cause
from ..folding.state import Replica, State


def models_draining(state: State) -> set[str]:
    """Models with a ready replica left in a drained domain: they need a
    look each pass until it has moved (the tallies do not say so)."""
    if not any(h.drain for h in state.holds.values()):
        return set()
    return {
        r.model for r in state.replicas.values()
        if r.state == "ready" and r.restart in ("", "refused") and draining(state, r)
    }


def to_move(p: Pass, m: ModelPass, queued: set[str]) -> list[tuple[Replica, ev.Cause]]:
    """The model's serving replicas to restart out of a drained domain, with
    the reason; those refused before only when a replica would fit now."""
    state = p.state
    if not state.holds:
        return []
    out = []
    room: bool | None = None
    for rep in m.serving:
        if rep.id in queued or rep.state != "ready" or rep.restart not in ("", "refused"):
            continue
        domain = draining(state, rep)
        if not domain:
            continue
        if rep.restart == "refused":
            if room is None:
                room = any(p.inv.fits(prof, m.spread) for prof in m.spec.profiles)
            if not room:
                continue
        out.append((rep, cause(K.DRAIN, domain=domain, text=state.holds[domain].reason)))
    return out


def refusal(state: State, rep: Replica) -> ev.Cause | None:
    """Why a replica in a drained domain stays (None when it is in none)."""
    domain = draining(state, rep)
    if not domain:
        return None
    return cause(K.REFUSE_DRAIN, model=rep.model, domain=domain, text=state.holds[domain].reason)
