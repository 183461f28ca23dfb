"""Why a model waits, as data: the kind of each waiting reason, and whether a
request for the model should wait for a replica or be refused now.

`decide` says why a model has fewer replicas than it wants in words (the
reason of a `ModelWaiting`) and, since issue 34, in a `WaitKind` beside
them. The gateway reads the kind, never the words: a request for a model
that waits for room that is not there (no room, its owner over a limit) or
that is parked is answered 503 at once with the reason and a Retry-After,
where it used to hang for the whole wait timeout (300 s) and then get a 503
that did not say why. A model on its way (a replica placing, starting or
loading, victims being stopped for it, an on-demand model waking) is still
waited for.

The kinds decide says (ModelWaiting.kind):

    no_room        no profile fits anywhere: "no room: ... needs 16, has 8"   refused
    over_limit     a replica would take its owner past a limit                refused
    parked         its replicas kept failing to start (`ctl retry`)           refused
    no_node        no node is ready (or all are cordoned): one may register   waited for
    room_later     the replicas that would give way are too young: a time     waited for
    preempting     replicas are being stopped to make room for it             waited for
    held           it gave room to another model, for a while                 waited for
    backing_off    after replicas that failed to start, the next try later    waited for

and those only a reader of the state says (`request_wait`): placing,
loading (a replica on its way) and waking (an on-demand model at zero).

A ModelWaiting recorded before the kind existed has none: the fold gives it
the kind its words say (`legacy_kind`), so that a log recorded then folds to
the state decide would now reach, and a model already waiting when the
control plane was upgraded is not said again only for its kind.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..contract.events import Cause
from .scaling import decided


class WaitKind(str, enum.Enum):
    """Why a model waits (a request for it, or its next replica)."""

    NONE = ""  # not waiting; or a ModelWaiting recorded before kinds (see legacy_kind)
    NO_ROOM = "no_room"
    OVER_LIMIT = "over_limit"
    PARKED = "parked"
    NO_NODE = "no_node"
    ROOM_LATER = "room_later"
    PREEMPTING = "preempting"
    HELD = "held"
    BACKING_OFF = "backing_off"
    # Said by `request_wait` only, from the replicas and the desired count.
    PLACING = "placing"
    LOADING = "loading"
    WAKING = "waking"


# The kinds decide says (ModelWaiting.kind), in the order above.
DECIDED = (
    WaitKind.NO_ROOM, WaitKind.OVER_LIMIT, WaitKind.PARKED, WaitKind.NO_NODE, WaitKind.ROOM_LATER,
    WaitKind.PREEMPTING, WaitKind.HELD, WaitKind.BACKING_OFF,
)  # fmt: skip

# What a request is refused for at once: nothing the control plane does will
# bring a replica until something changes (a node added, the catalog or a
# limit changed, `ctl retry`).
FAIL_FAST = frozenset({WaitKind.NO_ROOM, WaitKind.OVER_LIMIT, WaitKind.PARKED})


@dataclass(frozen=True, slots=True)
class Wait:
    """Why a request for a model, or the model, waits: a kind and the words,
    and (when a rule of decide's said it) the cause they were rendered from
    (core/contract/reasons.py), which the ModelWaiting carries."""

    kind: WaitKind
    reason: str = ""
    cause: Cause | None = None

    @property
    def fails_fast(self) -> bool:
        return self.kind in FAIL_FAST


def kind_of(text: str) -> WaitKind:
    """A kind said as text (an event's field): NONE for one this code does not know."""
    try:
        return WaitKind(text)
    except ValueError:
        return WaitKind.NONE


# The words decide began each reason with before the kind was recorded
# (decide.py, explain.py, quota.py, preempt.py), most specific first.
_LEGACY = (
    ("no room;", WaitKind.ROOM_LATER),
    ("no room", WaitKind.NO_ROOM),
    ("over limit", WaitKind.OVER_LIMIT),
    ("parked", WaitKind.PARKED),
    ("no node is ready", WaitKind.NO_NODE),
    ("preempting ", WaitKind.PREEMPTING),
    ("waiting for ", WaitKind.PREEMPTING),
    ("held:", WaitKind.HELD),
    ("backing off", WaitKind.BACKING_OFF),
    ("a replica of ", WaitKind.BACKING_OFF),
)


def legacy_kind(reason: str) -> WaitKind:
    """The kind of a waiting reason recorded without one, from its words
    (only for those: a kind recorded is always what is read)."""
    for prefix, kind in _LEGACY:
        if reason.startswith(prefix):
            return kind
    return WaitKind.NONE


def model_kind(model) -> str:
    """Why a model (a state.Model) waits, as a kind's value ("" when it does
    not wait; "other" for a reason of a kind this code does not know)."""
    if model.parked:
        return WaitKind.PARKED.value
    if not model.waiting:
        return ""
    return kind_of(model.waiting_kind).value or "other"


def request_wait(model, on_way: int, loading: int = 0, ready: int = 0) -> Wait:
    """Why a request for `model` (a state.Model) that no ready replica can
    take waits, and so whether it should (`Wait.fails_fast`): `on_way` of its
    replicas are placing, starting or loading (or failed, to be replaced),
    `loading` of them loading, `ready` of them ready. A model with a ready
    replica is served: no room is room for more, and a request that finds
    their breakers open waits for them as before."""
    if model.parked:
        return Wait(WaitKind.PARKED, f"model {model.spec.name} is parked: {model.parked}")
    kind = kind_of(model.waiting_kind)
    if kind is WaitKind.PARKED:
        # Parked is read from the model, not its reason: `ctl retry` unparks
        # it at once, and the reason says so only at the next pass.
        kind = WaitKind.NONE
    if kind in FAIL_FAST:
        if not on_way and not ready:
            return Wait(kind, f"model {model.spec.name} cannot be served now: {model.waiting}")
        kind = WaitKind.NONE  # it has replicas, or one is coming: the room it lacks is for more
    if on_way:
        return Wait(WaitKind.LOADING if loading else WaitKind.PLACING)
    if kind is not WaitKind.NONE:
        return Wait(kind, model.waiting)
    if ready:
        return Wait(WaitKind.NONE)  # (their breakers are open: waited for, as any)
    if model.spec.on_demand and decided(model) == 0:
        return Wait(WaitKind.WAKING)
    return Wait(WaitKind.PLACING)
