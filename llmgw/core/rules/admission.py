"""Node admission, like Kubernetes' NodeRestriction: what a node says of
itself does not decide where trusted models run, nor who serves them.

Issue 35, finding 5, tried against a real fleet with one node credential:
- a node that claimed `llmgw.io/pool=secure` (and 8 H100s) in its
  registration got the pool-restricted model and 20 of 20 user prompts;
- a node that registered a replica placed on another node (not yet started
  there) as running on itself took it over, and got 10 of 20 prompts;
- a node that never started what it was given kept those replicas "placing"
  for ever: placements had no start deadline.

Three rules, one per finding, each read by the fold or by decide:

1. **The pool is the operator's** (`take_claims`, `settle`). A node's own
   `llmgw.io/pool` (from its agent file) is kept as a claim (`Node.claims`)
   and steers nothing; the pool placement reads (`Node.labels`) is the one
   an operator set with `llmgw ctl label NODE pool=secure`, or admitted
   with `llmgw ctl node admit NODE` (which sets what the node claims). The
   policy `admission: open` counts the node's own word too, as before (a
   lab, a test fleet with no operator). Only the pool: it is the label that
   keeps a model to trusted nodes (ProfileSpec.pool); fabric and location
   labels steer where among the nodes a model may use, not whether it may.
   The policy `admission: manual` goes further: a node is placed on only
   once an operator admitted it (NodeAdmitted), and only while it claims no
   more GPUs, of no other models, than then (`cordoned`).
2. **A node claims only what the log placed on it** (`claim_problem`). A
   registration that says a node runs a replica the log placed on another
   node does not take it over: what it runs is a stray there, stopped, and
   the genuine shard stays where it was placed (stopping it, not ignoring
   it: an engine the log did not ask for holds GPUs and may answer
   requests). Adoption of engines the log never placed goes on (a fleet
   outlives its log), but only onto a node in the profile's pool. (A
   ShardStatus from the wrong node was refused by the fold already.)
3. **A start deadline** (`overdue`, `start_overdue`). A replica placed and
   not ready within the policy's `start_timeout_s` is stopped as a start
   failure (decide, StopReplica.failed_to_start), counted as a shard that
   failed to start is (`count_start_failure`): the model backs off and is
   parked after `park_after`, and the replica is placed again, elsewhere
   where it can be (Model.late_nodes weigh in its spread).
   Measured with decide's `now`, as every other timeout, so replay decides
   the same.

Pure, like the rest of the core.
"""

from __future__ import annotations

from ..contract import events as ev
from ..contract.catalog import profile_named
from ..folding.nodeindex import POOL_LABEL, touch
from ..contract.reasons import K, cause
from ..folding.state import Admitted, Node, Replica, State

# The labels whose value is the operator's to set (rule 1), by whole name,
# and the short keys `llmgw ctl label` takes for them.
RESTRICTED = (POOL_LABEL,)
KEYS = {"pool": POOL_LABEL}


def label_name(key: str) -> str:
    """The whole name of a restricted label key ("pool" or "llmgw.io/pool"); "" if it is none."""
    if key in KEYS:
        return KEYS[key]
    return key if key in RESTRICTED else ""


# --------------------------------------------------------------------------- rule 1: the pool is the operator's


def take_claims(node: Node) -> None:
    """Move the restricted labels a node said of itself out of its labels
    into its claims (a fresh registration); `settle` then says which count."""
    own = node.labels
    node.claims = {k: own[k] for k in RESTRICTED if k in own}
    if node.claims:
        node.labels = {k: v for k, v in own.items() if k not in node.claims}


def counted(state: State, node: Node, key: str) -> str:
    """The value of a restricted label that placement counts on this node: the
    operator's, else (policy `admission: open`) the node's own claim."""
    value = node.operator_labels.get(key, "")
    if not value and state.policy.admission == "open":
        value = node.claims.get(key, "")
    return value


def settle(state: State, node: Node) -> None:
    """Put into the node's labels the restricted ones that count, and say
    whether it is cordoned (after a registration, an operator's label or
    admission, a policy change)."""
    labels = {k: v for k, v in node.labels.items() if k not in RESTRICTED}
    for key in RESTRICTED:
        value = counted(state, node, key)
        if value:
            labels[key] = value
    cordon = cordoned(state, node)
    if labels != node.labels or cordon != node.cordon:
        node.labels, node.cordon = labels, cordon
        touch(state, node.name)  # its pool and its cordon file it in the placement index


def cordoned(state: State, node: Node) -> str:
    """Why placement passes the node over under `admission: manual` ("" : it
    does not): not admitted, or claiming more GPUs, or other models of
    them, than it was admitted with (a node that claimed 8 H100s got the
    restricted model's prompts: issue 35)."""
    if state.policy.admission != "manual":
        return ""
    admitted = state.admitted.get(node.name)
    if admitted is None:
        return f"waits for admission (`llmgw ctl node admit {node.name}`: the policy is admission: manual)"
    models = sorted({g.model for g in node.gpus})
    if len(node.gpus) > admitted.gpus or not set(models) <= set(admitted.gpu_models):
        return (f"claims {len(node.gpus)} GPU(s) ({', '.join(models) or 'no model'}), admitted with "
                f"{admitted.gpus} ({', '.join(admitted.gpu_models) or 'no model'}): `llmgw ctl node admit "
                f"{node.name}` again if that is so")
    return ""



def settle_all(state: State) -> None:
    """A policy applied: whose word counts may have changed (a scan: rare)."""
    for node in state.nodes.values():
        settle(state, node)


def unadmitted(node: Node) -> dict[str, str]:
    """What the node claims of itself that placement does not count (for
    `ctl describe node`): claims whose value is not the one counted."""
    return {k: v for k, v in node.claims.items() if node.labels.get(k) != v}


# --------------------------------------------------------------------------- rule 2: only what the log placed there


def claim_problem(state: State, node: Node, rid: str, group: list[ev.RunningShard]) -> ev.Cause | None:
    """Why shards a registering node reports, of replica `rid`, that the log
    did not place on it, may not be taken as its (None when adoption may
    rebuild or merge them, as adoption.py says)."""
    if node.cordon:
        return cause(K.CORDONED, node=node.name, text=node.cordon)
    existing = state.replicas.get(rid)
    if existing is not None:
        if not existing.want_shards:
            # Its shards placed here (given up since, reported again) are
            # adoption's to judge; any other is a claim on another node's.
            here = {sh.id for sh in existing.shards if sh.node == node.name}
            elsewhere = sorted({sh.node for sh in existing.shards if sh.node != node.name})
            if elsewhere and any(r.shard not in here for r in group):
                return cause(K.PLACED_ELSEWHERE, replica=rid, nodes=elsewhere, node=node.name)
        else:
            # Being rebuilt from what several agents report: a rank another
            # node has reported already is not this node's to fill.
            ranks = {sh.rank: sh.node for sh in existing.shards if sh.node != node.name}
            taken = [r for r in group if r.rank in ranks]
            if taken:
                return cause(K.RANK_TAKEN, replica=rid, count=taken[0].rank, nodes=[ranks[taken[0].rank]],
                             node=node.name)
    first = group[0]
    model = state.models.get(first.model)
    profile = profile_named(model.spec, first.profile) if model is not None else None
    if profile is not None and profile.pool and node.labels.get(POOL_LABEL, "") != profile.pool:
        return cause(K.WRONG_POOL, model=first.model, profile=profile.name, pool=profile.pool, node=node.name,
                     node_pool=node.labels.get(POOL_LABEL, ""))
    return None


# --------------------------------------------------------------------------- rule 3: a start deadline


def placed(state: State, rep: Replica) -> None:
    """The fold placed a replica: its start deadline runs from now."""
    state.unstarted[rep.id] = rep.placed_at


def overdue(state: State, now: float) -> set[str]:
    """The models with a replica past its start deadline (decide looks at them).

    `state.unstarted` is in log order, which is the order of the deadlines
    but where a new leader's clock runs behind the last one's: read up to
    the first live replica whose deadline is still ahead, so a pass reads
    what is overdue and one more, not every replica still loading."""
    out: set[str] = set()
    timeout = state.policy.start_timeout_s
    replicas = state.replicas
    for rid, at in state.unstarted.items():
        rep = replicas.get(rid)
        if rep is None or rep.state == "stopping":
            continue  # stopping on a node that never says so: kept, but nothing to do
        if now - at <= timeout:
            break
        if start_overdue(state, rep, now) is not None:
            out.add(rep.model)
    return out


def start_overdue(state: State, rep: Replica, now: float) -> ev.Cause | None:
    """Why a replica is stopped for not being ready in time, or None."""
    timeout = state.policy.start_timeout_s
    if rep.ready_at or rep.want_shards or rep.state in ("ready", "stopping", "failed"):
        return None
    if now - rep.placed_at <= timeout or rep.id not in state.unstarted:
        return None
    where = sorted({sh.node for sh in rep.shards if sh.state != "ready"})
    return cause(K.START_TIMEOUT, seconds=timeout, state=rep.state, nodes=where)


def count_start_failure(state: State, rep: Replica, why: str, at: float) -> None:
    """A replica stopped past its start deadline counts as one that failed to
    start (as fold._failed_to_start counts a shard's failure): its model
    backs off before the next, and is parked after enough in a row."""
    model = state.models.get(rep.model)
    if model is not None:
        model.start_failures += 1
        model.last_failure = f"{rep.id}: {why}"
        model.failed_at = at
        late = [sh.node for sh in rep.shards if sh.state != "ready" and sh.node not in model.late_nodes]
        if late:
            model.late_nodes = [*model.late_nodes, *late]
