"""How a replica stands and what it holds: the bookkeeping that the fold's
handlers and adoption share.

A replica's state follows from its shards' (`derive_replica_state`), what a
live shard holds is counted on its node (`hold`, `release_ids`), and each
model's `Tally` is kept as its replicas come and go (`tally`). These are the
derived parts of the state: the property tests count them again from the
replicas and compare, so every handler must change them through here.
"""

from __future__ import annotations

from .facility_facts import count_unmeasured, uncount
from .nodeindex import touch
from ..rules.quota import count_shard
from .replicaindex import removed
from .state import TERMINAL_SHARD_STATES, Node, Replica, Shard, State, Tally, add_gb


def hold(state: State, node: Node, sh: Shard) -> None:
    """Count what a live shard holds on its node: its GPUs, port, memory and cores."""
    for g in sh.gpus:
        node.used[g] = sh.id
    if sh.port:
        node.ports[sh.port] = sh.id
    if sh.memory_gb:
        node.memory_used = add_gb(node.memory_used, sh.memory_gb)
    node.cpu_used += sh.cpu_cores
    count_unmeasured(state, node, sh)


def release_ids(node: Node, holder: str, gpus: list[int], port: int) -> None:
    for g in gpus:
        if node.used.get(g) == holder:
            del node.used[g]
    if port and node.ports.get(port) == holder:
        del node.ports[port]


# A replica restarting: replaced beside itself, or stopped for its replacement.
RETIRING = ("replacing", "in place")
TERMINAL = frozenset(TERMINAL_SHARD_STATES)


def unwanted(state: State, rep: Replica) -> bool:
    """The catalog no longer asks for this replica: its model is gone or its profile changed."""
    model = state.models.get(rep.model)
    return model is None or model.fingerprints.get(rep.profile) != rep.fingerprint


def derive_replica_state(state: State, rep: Replica, at: float) -> None:
    """A replica's state follows from its shards'; one that was stopping and
    whose shards have all exited is forgotten (the log keeps its history)."""
    shards = rep.shards
    was = rep.state
    if was == "stopping":
        for s in shards:
            if s.state not in TERMINAL_SHARD_STATES:
                return
        del state.replicas[rep.id]
        removed(state, rep)
        return
    derive_live_state(rep, at)
    if (rep.state == "failed") != (was == "failed"):
        state.tallies[rep.model].failed += 1 if rep.state == "failed" else -1
    if rep.state == "ready" and was != "ready":
        started(state, rep)



def tally(state: State, rep: Replica, sign: int) -> None:
    """Count a replica in (or out of) its model's tally, as it stands."""
    t = state.tallies.get(rep.model)
    if t is None:
        t = state.tallies[rep.model] = Tally()
    t.live += sign
    if rep.state == "failed":
        t.failed += sign
    if unwanted(state, rep):
        t.unwanted += sign
    if rep.restart in RETIRING:
        t.retiring += sign
    if rep.want_shards:
        t.assembling += sign



def started(state: State, rep: Replica) -> None:
    state.unstarted.pop(rep.id, None)  # its start deadline is met (admission.py)
    model = state.models.get(rep.model)
    if model is not None and model.start_failures:
        model.start_failures = 0
    if model is not None and model.late_nodes:
        model.late_nodes = []  # it starts somewhere: no node to avoid for it any more



def derive_live_state(rep: Replica, at: float) -> None:
    """The state of a replica that is not stopping, from its shards'."""
    shards = rep.shards
    # One pass over the shards (most replicas have one): the first failure
    # wins, else the least advanced shard says where the replica is.
    failed = None
    ready = loading = starting = 0
    for s in shards:
        st = s.state
        if st == "ready":
            ready += 1
        elif st == "failed" or st == "stopped":
            # A shard that ended though its replica was not being stopped
            # (its agent stopped it: Ctrl-C of `llmgw up`) serves no more.
            # Read as "placing", as it once was, the replica counted as live
            # and nothing ever replaced it: a rerun of `llmgw up` never served.
            failed = s
            break
        elif st == "loading":
            loading += 1
        elif st == "starting":
            starting += 1
    if failed is not None:
        rep.state = "failed"
        ended = "failed" if failed.state == "failed" else "stopped unasked"
        rep.reason = f"shard {failed.id} on {failed.node} {ended}: {failed.reason or 'no reason given'}"
    elif rep.want_shards:  # being rebuilt from what agents report: not whole yet
        rep.state = "starting"
    elif ready == len(shards):
        if rep.state != "ready":
            rep.ready_at = at
        rep.state = "ready"
    elif loading:
        rep.state = "loading"
    elif starting:
        rep.state = "starting"
    else:
        rep.state = "placing"


def forget(state: State, rep: Replica) -> None:
    """Drop a replica from the state, freeing what its shards hold. A shard
    placed in place of another that still runs hands back what it took over
    (`hand_back`), as one that ends does: freed instead, the port of the
    engine still draining there was lost from the node's books (found by the
    restart property: a replica placed in place, forgotten for the one an
    agent reported under its id, left the draining one without its port)."""
    for sh in rep.shards:
        node = state.nodes.get(sh.node)
        if node is None or sh.state in TERMINAL:
            continue
        release_ids(node, sh.id, sh.gpus, sh.port)
        touch(state, sh.node)
        if sh.memory_gb:
            node.memory_used = add_gb(node.memory_used, -sh.memory_gb)
        node.cpu_used -= sh.cpu_cores
        uncount(state, node, sh.id)
        count_shard(state, rep.owner, sh, -1)
        if sh.after:
            hand_back(state, node, sh)
    tally(state, rep, -1)
    del state.replicas[rep.id]
    removed(state, rep)


def replica_number(replica_id: str) -> int:
    """The number of a replica id ("<model>-<n>"): ids are handed out in order."""
    _, _, n = replica_id.rpartition("-")
    return int(n) if n.isdigit() else 0


def hand_back(state: State, node: Node, sh: Shard) -> None:
    """A shard placed in place of another (a restart in place) ended before
    that one exited (stopped while it waited, failed to start): what it took
    over goes back to the one still running there, until it exits. Freed
    instead, the GPUs and port of an engine still draining were handed to the
    next placement, which then failed to bind or to allocate. What the new
    one held beyond what it took over goes back too: held a little longer,
    never given twice."""
    for old_id in sh.after:
        old = state.replicas.get(old_id.rpartition(".")[0])
        old_sh = next((o for o in old.shards if o.id == old_id), None) if old is not None else None
        if old_sh is None or old_sh.node != sh.node or old_sh.state in TERMINAL:
            continue
        gpus = [g for g in sh.gpus if g not in node.used and g not in old_sh.gpus]
        for g in gpus:
            node.used[g] = old_id
        if old_sh.port and old_sh.port not in node.ports:
            node.ports[old_sh.port] = old_id
        back = Shard(id=old_id, node=sh.node, rank=0, gpus=gpus, port=0, generation=0,
                     memory_gb=sh.memory_gb, cpu_cores=sh.cpu_cores)
        old_sh.gpus = sorted(old_sh.gpus + gpus)
        old_sh.memory_gb = add_gb(old_sh.memory_gb, sh.memory_gb)
        old_sh.cpu_cores += sh.cpu_cores
        if sh.memory_gb:
            node.memory_used = add_gb(node.memory_used, sh.memory_gb)
        node.cpu_used += sh.cpu_cores
        count_shard(state, old.owner, back, +1)
        return
