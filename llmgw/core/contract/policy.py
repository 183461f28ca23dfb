"""Policy as data: the fleet-wide numbers that shape decisions.

They were module constants of the rules (preempt.py, scaling.py, decide.py,
restarts.py). As constants they could not be varied, so nobody could ask
what a shorter minimum lifetime would have done to last night's outage
(`llmgw replay --what-if`) or what a new hold would do now (`ctl apply
--dry-run`). Now the catalog file's `policy:` section sets them, `ctl apply`
publishes them as one event (PolicyApplied), the fold keeps the last one
in `State.policy`, and the rules read them from the state. The defaults are
the values the constants had, so a log that never says a policy decides
as before.

Per-model numbers that were already data stay in the model's spec:
drain_grace_s and scale_down_delay_s (ModelSpec).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from . import bounds as b

# Who decides the labels that keep a model to trusted nodes (admission.py):
# "operator", the default, counts only what an operator set (`llmgw ctl
# label`, `llmgw ctl node admit`); "open" also counts what a node says of
# itself, as before issue 35 (a lab, a test fleet with no operator);
# "manual" is "operator", and a node is placed on only once admitted (`ctl
# node admit`), and only while it claims no more GPUs than it was admitted with.
Admission = Literal["operator", "open", "manual"]


class Policy(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """The numbers the rules decide with, fleet-wide."""

    # Preemption (preempt.py). A replica is no victim within this long of
    # becoming ready: stopping it throws away a load only just paid for.
    min_lifetime_s: b.Duration = 120.0
    # How long a model that gave room may not take it back (unless the
    # model it gave room to has what it asked for first).
    hold_s: b.Duration = 120.0
    # Idle this long, an on-demand replica of a lower class goes first.
    eviction_grace_s: b.Duration = 300.0
    # Replicas stopped at most to make room for one.
    max_victims: b.SmallCount = 3
    # Restarts (restarts.py): replaced beside themselves at once when the
    # operator gave no pace (max_surge and max_unavailable both 0).
    restart_max_surge: b.SmallCount = 1
    # Start failures (scaling.py): the first back-off, doubling up to the
    # most, and parked after this many in a row.
    backoff_first_s: b.Duration = 5.0
    backoff_max_s: b.Duration = 300.0
    park_after: b.SmallCount = 5
    # Adoption (decide.py): how long the shards of a multi-node replica
    # rebuilt from registrations may take to all be reported.
    adopt_wait_s: b.Duration = 120.0
    # Start deadline (admission.py): a replica placed and not ready this long
    # after is failed as a start failure and placed elsewhere (backing off,
    # parked after park_after). Without one, a node that never started what
    # it was given kept it "placing" for ever (issue 35, finding 5). Long
    # enough for a large model's weights to load.
    start_timeout_s: b.Duration = 1800.0
    # Whose word counts for a node's `llmgw.io/pool` (see Admission above).
    admission: Admission = "operator"


FIELDS: tuple[str, ...] = Policy.__struct_fields__
DEFAULT = Policy()


def problem(policy: Policy) -> str:
    """Why a policy cannot be folded ("" when it can): every number is an
    amount, and a park after 0 failures would park every model at once."""
    for name in FIELDS:
        value = getattr(policy, name)
        if not isinstance(value, str) and value < 0:
            return f"policy: {name} must not be negative"
    if policy.park_after < 1:
        return "policy: park_after must be at least 1"
    if policy.restart_max_surge < 1:
        return "policy: restart_max_surge must be at least 1 (0 would begin no restart)"
    if policy.start_timeout_s <= 0:
        return "policy: start_timeout_s must be above 0 (0 would fail every replica at its placement)"
    return ""


def changes(before: Policy, after: Policy) -> list[tuple[str, object, object]]:
    """(field, before, after) for each field that differs, in field order."""
    return [(f, getattr(before, f), getattr(after, f)) for f in FIELDS if getattr(before, f) != getattr(after, f)]
