"""Why the control plane did something: the kinds of its reasons, and their words.

A rule says why as data, an `events.Cause`: a kind from `CauseKind` and the
parameters that kind reads. This module is the one place those are put
into words (`render`), and the one place code outside the rules reads an
action's why (`words`, `kind_of`): the CLI, the console, the replay tool,
the control plane's log and metrics. Nothing else matches the text of a
reason (tests/test_reasons.py holds the code to that).

The words are those the rules gave before causes existed, the same for
every decision (tests/test_reasons.py keeps a table of them). An action
still carries them in its `reason`, rendered here when it is decided:
the fold keeps them on the state (a replica's reason, a model's waiting
reason, compared to say a wait only when it changes), the agents read a
stop's, the projections store them, and the recorded logs (events/logs/)
have nothing else. So an edge says `words(action)`: the cause rendered
when there is one, else the text recorded before causes.

Each kind, the action that carries it, and the fields it reads:

    stops (StopReplica)
    model_removed      model
    replaced           text (the failed replica's reason, as the fold said it)
    adopted_partly     count (shards reported), of (shards), seconds (adopt_wait_s)
    start_timeout      seconds (start_timeout_s), state, nodes
    scale_down         model, count (the desired count), scale
    preempted          model (the preemptor), tier
    restart_served     -
    in place (StopReplica and RestartReplica in_place)
    in_place_asked     -
    in_place_paced     -            (max_unavailable)
    in_place_only      -            (it was the only thing in its replacement's way)
    in_place_grace     seconds (drain_grace_s)
    restarts (RestartReplica)
    restart_asked      -
    profile_changed    model, profile
    drain              domain, text (the hold's reason)
    refusals (RefuseRestart)
    refuse_parked      model
    refuse_over_limit  owner
    refuse_fits_nowhere model
    refuse_drain       model, domain, text (the hold's reason)
    scaling (ScaleModel)
    desired            model, scale
    parking (ParkModel)
    parked             model, count (failures in a row), text (the last one)
    preemption (Preempt)
    preempt            model, priority, count (replicas it has), of (it wants), victims
    waiting (ModelWaiting, beside its WaitKind; no_room and no_node are the placement's words)
    backing_off        count, text (the last failure), seconds (the back-off)
    late               model (one of its replicas was not ready by its start deadline)
    held               model (the model it gave room to), seconds (hold_s)
    waiting_for        replicas (preempted for it, not gone yet)
    preempting         replicas (the victims)
    young_victims      replicas, seconds (min_lifetime_s), at (when they may give way)
    over_limit         owner, resource, held, more, limit
    strays (StopStray)
    no_model           model
    no_profile         model, profile
    given_up           shard, replica
    second_copy        replica, nodes
    unknown_replica    replica
    cordoned           node, text (the cordon, in words)
    placed_elsewhere   replica, node, nodes
    rank_taken         replica, count (the rank), node, nodes (who reported it)
    wrong_pool         model, profile, pool, node, node_pool
"""

from __future__ import annotations

import enum
from typing import Callable

from . import events as ev
from .bounds import clip
from .times import utc


class CauseKind(str, enum.Enum):
    """One value per distinct reason the rules give (see the module's table)."""

    MODEL_REMOVED = "model_removed"
    REPLACED = "replaced"
    ADOPTED_PARTLY = "adopted_partly"
    START_TIMEOUT = "start_timeout"
    SCALE_DOWN = "scale_down"
    PREEMPTED = "preempted"
    RESTART_SERVED = "restart_served"
    IN_PLACE_ASKED = "in_place_asked"
    IN_PLACE_PACED = "in_place_paced"
    IN_PLACE_ONLY = "in_place_only"
    IN_PLACE_GRACE = "in_place_grace"
    RESTART_ASKED = "restart_asked"
    PROFILE_CHANGED = "profile_changed"
    DRAIN = "drain"
    REFUSE_PARKED = "refuse_parked"
    REFUSE_OVER_LIMIT = "refuse_over_limit"
    REFUSE_FITS_NOWHERE = "refuse_fits_nowhere"
    REFUSE_DRAIN = "refuse_drain"
    DESIRED = "desired"
    PARKED = "parked"
    PREEMPT = "preempt"
    BACKING_OFF = "backing_off"
    LATE = "late"
    HELD = "held"
    WAITING_FOR = "waiting_for"
    PREEMPTING = "preempting"
    YOUNG_VICTIMS = "young_victims"
    OVER_LIMIT = "over_limit"
    NO_MODEL = "no_model"
    NO_PROFILE = "no_profile"
    GIVEN_UP = "given_up"
    SECOND_COPY = "second_copy"
    UNKNOWN_REPLICA = "unknown_replica"
    CORDONED = "cordoned"
    PLACED_ELSEWHERE = "placed_elsewhere"
    RANK_TAKEN = "rank_taken"
    WRONG_POOL = "wrong_pool"


class ScaleWhy(str, enum.Enum):
    """Why a model should run the replicas it should (events.Scale.why)."""

    UNUSED = "on_demand_unused"  # on demand, never asked for
    IDLE = "on_demand_idle"  # on demand, no request for idle_s
    ASKED = "on_demand_asked"  # on demand, asked for (no target load)
    MIN = "min_replicas"  # no target load: its minimum
    LOAD = "load"  # its load at its target per replica


# The tiers of preemption's victims (preempt.py), tried in this order.
TIERS = {
    0: "idle on-demand replica of a lower class",
    1: "borrowed past its owner's guarantee, taken back by an owner within its own",
    2: "a lower class, above its minimum",
    3: "the same class, above its minimum, for a model below its own",
    4: "a lower class's minimum",
}

# The names of an owner's resources, as a limit says them.
RESOURCES = {"gpus": "GPUs", "cpu_cores": "CPU cores", "memory_gb": "GB of host memory"}

K = CauseKind


def cause(kind: CauseKind, **fields) -> ev.Cause:
    """A cause of this kind (its value is what the contract holds)."""
    return ev.Cause(kind=kind.value, **fields)


def scale_words(model: str, s: ev.Scale) -> str:
    """Why a model should run what it should, in words (scaling.why_desired)."""
    why = s.why
    if why == ScaleWhy.UNUSED:
        return f"on demand: no request for {model} yet"
    if why == ScaleWhy.IDLE:
        return f"on demand: no request for {s.idle_s:.0f}s (idle after {s.idle_after_s:g}s)"
    if why == ScaleWhy.ASKED:
        return "on demand: asked for"
    if why == ScaleWhy.MIN:
        return f"min_replicas {s.least}"
    said = f"load {s.load} (in flight and queued) at {s.per:g} per replica asks for {s.wants}"
    if s.recent > s.wants:
        said += f"; {s.recent} were asked for within the scale-down delay ({s.delay_s:g}s)"
    n = max(s.wants, s.recent)
    if n < s.least:
        said += f"; at least {s.least}"
    elif n > s.most:
        said += f"; at most {s.most}"
    return said


def _held(text: str) -> str:
    return text or "no reason given"


def _drain(c: ev.Cause) -> str:
    return f"{c.domain} is held for draining: {_held(c.text)}"


_SAYING: dict[CauseKind, Callable[[ev.Cause], str]] = {
    K.MODEL_REMOVED: lambda c: f"model {c.model} was removed from the catalog",
    K.REPLACED: lambda c: f"replaced: {c.text}",
    K.ADOPTED_PARTLY: lambda c: (
        f"adopted with {c.count} of its {c.of} shards; the others were not reported within {c.seconds:g}s"
    ),
    K.START_TIMEOUT: lambda c: (
        f"not ready within {c.seconds:g}s (start_timeout_s) of its placement: "
        f"{c.state} on {', '.join(c.nodes) or 'its nodes'}"
    ),
    K.SCALE_DOWN: lambda c: f"{c.model} scales down to {c.count}: {scale_words(c.model, c.scale or _NO_SCALE)}",
    K.PREEMPTED: lambda c: f"preempted for {c.model} (tier {c.tier}: {TIERS.get(c.tier, '')})",
    K.RESTART_SERVED: lambda c: "restarted: its replacement serves",
    K.IN_PLACE_ASKED: lambda c: "restarted in place, as asked",
    K.IN_PLACE_PACED: lambda c: "restarted in place (max_unavailable)",
    K.IN_PLACE_ONLY: lambda c: "restarted in place: it was the only thing in its replacement's way",
    K.IN_PLACE_GRACE: lambda c: f"restarted in place: no replacement beside it within {c.seconds:g}s",
    K.RESTART_ASKED: lambda c: "asked by an operator",
    K.PROFILE_CHANGED: lambda c: f"profile {c.profile} of {c.model} changed",
    K.DRAIN: _drain,
    K.REFUSE_PARKED: lambda c: f"its replacements fail to start; the model is parked (llmgw ctl retry {c.model})",
    K.REFUSE_OVER_LIMIT: lambda c: (
        f"its replacement would take {c.owner} past a limit even with this replica stopped"
    ),
    K.REFUSE_FITS_NOWHERE: lambda c: (
        f"its replacement fits on no node even with this replica stopped (llmgw ctl explain-placement {c.model})"
    ),
    K.REFUSE_DRAIN: lambda c: (
        f"{_drain(c)}; its replacement fits nowhere else, so it stays and serves "
        f"until there is room (llmgw ctl explain-placement {c.model})"
    ),
    K.DESIRED: lambda c: scale_words(c.model, c.scale or _NO_SCALE),
    K.PARKED: lambda c: (
        f"parked: {c.count} replicas in a row failed to start (the last: {c.text}); "
        f"`llmgw ctl retry {c.model}` tries again"
    ),
    K.PREEMPT: lambda c: (
        f"{c.model} ({c.priority}) has {c.count} of {c.of} replicas and fits nowhere; "
        f"stopping {c.victims} replica(s) makes room"
    ),
    K.BACKING_OFF: lambda c: (
        f"backing off: {c.count} replica(s) in a row failed to start (the last: {c.text}); "
        f"the next try {c.seconds:g}s after that failure"
    ),
    K.LATE: lambda c: f"a replica of {c.model} was not ready by its start deadline",
    K.HELD: lambda c: (
        f"held: it gave room to {c.model} (preempted for it), which is still short; "
        f"until {c.model} has what it asked for, {c.seconds:g}s after the preemption at the latest"
    ),
    K.WAITING_FOR: lambda c: f"waiting for {', '.join(c.replicas)}, preempted for it, to stop",
    K.PREEMPTING: lambda c: f"preempting {', '.join(c.replicas)} to make room",
    K.YOUNG_VICTIMS: lambda c: (
        f"no room; {', '.join(c.replicas)} would make room but became ready less than {c.seconds:g}s ago "
        f"(a replica is not preempted before it has served that long): they may give way from {utc(c.at)}"
    ),
    K.OVER_LIMIT: lambda c: (
        f"over limit: owner {c.owner} holds {c.held:g} {RESOURCES.get(c.resource, c.resource)}; "
        f"{c.more:g} more would pass its limit of {c.limit:g}"
    ),
    K.NO_MODEL: lambda c: f"no model {c.model} in the catalog claims it",
    K.NO_PROFILE: lambda c: f"model {c.model} has no profile {c.profile} any more",
    K.GIVEN_UP: lambda c: (
        f"shard {c.shard} of {c.replica} was given up here (failed or lost) and its replica went on without it"
    ),
    K.SECOND_COPY: lambda c: (
        f"replica {c.replica} runs on {', '.join(c.nodes) or 'another node'} already: "
        f"this copy of it is not the one the control plane placed"
    ),
    K.UNKNOWN_REPLICA: lambda c: f"replica {c.replica} is not one the control plane knows",
    K.CORDONED: lambda c: f"node {c.node} {c.text}: it adopts nothing meanwhile",
    K.PLACED_ELSEWHERE: lambda c: (
        f"replica {c.replica} was placed on {', '.join(c.nodes)}: node {c.node} may claim only shards placed on it"
    ),
    K.RANK_TAKEN: lambda c: (
        f"rank {c.count} of {c.replica} was reported by {', '.join(c.nodes)} already: "
        f"node {c.node} may not claim it too"
    ),
    K.WRONG_POOL: lambda c: (
        f"{c.model}'s profile {c.profile} runs only in pool {c.pool}, and node {c.node} "
        f"is in {('pool ' + c.node_pool) if c.node_pool else 'no pool'} (as an operator set it)"
    ),
}

_NO_SCALE = ev.Scale(why=ScaleWhy.LOAD.value)
# By the kind's value, as a cause holds it (a str enum hashes by its name).
_WORDS = {k.value: say for k, say in _SAYING.items()}


def render(c: ev.Cause) -> str:
    """A cause in words: the words its rule gave before causes were data.
    A kind this code does not know (a newer control plane's) is said as
    its name, never an error: a reader may be older than the log."""
    say = _WORDS.get(c.kind)
    return say(c) if say is not None else c.kind.replace("_", " ")


def words(action) -> str:
    """Why an action (or a Victim) was decided, in words: its cause
    rendered, or the text recorded before causes existed."""
    c = getattr(action, "cause", None)
    if c is not None:
        return clip(render(c))  # as the reason was recorded (bounds.fit_action)
    return getattr(action, "reason", "")


def victim_words(v: ev.Victim) -> str:
    """Why a victim was the one, in words: its tier's (the data it carries)."""
    return TIERS.get(v.tier, v.why)


def kind_of(action) -> str:
    """An action's cause's kind ("" when recorded before causes, or none)."""
    c = getattr(action, "cause", None)
    return c.kind if c is not None else ""


def because(c: ev.Cause) -> dict:
    """The fields an action carries for a cause: the cause, and its words as
    the `reason` the fold, the agents and older readers read."""
    return {"cause": c, "reason": render(c)}
