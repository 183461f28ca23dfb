"""Property tests of the pure core: random worlds, folded as the shell folds them.

Each test drives a `World` (tests/fleet_strategies.py) through a random
sequence of steps over a random fleet and catalog, and checks one promise of
the fold and its decisions after every step or over the whole log. No NATS,
no I/O: the log is a list of (seq, subject, data) and the live state is folded
with `fold.apply` as each message is appended.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.core.contract import events as ev
from llmgw.core.contract.catalog import profile_named
from llmgw.core.rules.decide import decide
from llmgw.core.folding.fold import apply, copy_state, decode_state, encode_state, evolve
from llmgw.core.simulation.history import verify
from llmgw.core.folding import replicaindex
from llmgw.core.folding.nodeindex import index_of, track
from llmgw.core.folding.replicaindex import replicas_of
from llmgw.core.scheduling.explain import explain
from llmgw.core.scheduling.placement import Inventory, replicas_per_node
from llmgw.core.rules.scaling import desired
from llmgw.core.rules.quota import add, need, over_limit, shard_amount
from llmgw.core.folding.state import LIVE_SHARD_STATES, State, gpus_in_use

from .fleet_strategies import Step, World

# LLMGW_PROPERTY_EXAMPLES=2000 LLMGW_PROPERTY_STEPS=80 search deeper (minutes, not seconds).
STEPS = int(os.environ.get("LLMGW_PROPERTY_STEPS", "40"))
SETTINGS = settings(
    max_examples=int(os.environ.get("LLMGW_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# Passing takes seconds; a failure is shrunk for up to 5 minutes more
# (Hypothesis's own limit), which the suite's 300 s default would cut short.
pytestmark = pytest.mark.timeout(900)


def replay(records) -> State:
    state = State()
    for seq, subject, data in records:
        apply(state, seq, subject, data)
    return state


# --------------------------------------------------------------------------- invariants


def assert_no_gpu_given_twice(state: State) -> None:
    """Each GPU and each port of a node is held by at most one live shard, and
    the nodes' `used`/`ports` maps say exactly what the shards and strays hold."""
    holders: dict[tuple[str, int], str] = {}
    for node, gpu, shard in gpus_in_use(state):
        assert (node, gpu) not in holders, f"GPU {gpu} on {node} is given to {holders[(node, gpu)]} and {shard}"
        holders[(node, gpu)] = shard
    ports: dict[tuple[str, int], str] = {}
    # A shard stopped for a replacement placed in its place (a restart in
    # place) hands over its GPUs and its port: the replacement starts once it
    # has exited (Shard.after). Old shard (node, id) -> the shards it handed over to.
    heirs: dict[tuple[str, str], set[str]] = {}
    for rep in state.replicas.values():
        for sh in rep.shards:
            if sh.state in LIVE_SHARD_STATES:
                for old in sh.after:
                    heirs.setdefault((sh.node, old), set()).add(sh.id)
    for rep in state.replicas.values():
        for sh in rep.shards:
            if sh.state not in LIVE_SHARD_STATES:
                continue
            node = state.nodes.get(sh.node)
            assert node is not None, f"live shard {sh.id} is on {sh.node}, a node never registered"
            assert node.state == "ready", f"live shard {sh.id} ({sh.state}) is on {sh.node}, which is {node.state}"
            have = {g.index for g in node.gpus}
            assert set(sh.gpus) <= have, f"shard {sh.id} holds GPUs {sh.gpus}; {sh.node} has {sorted(have)}"
            handed = sh.state == "stopping" and node.ports.get(sh.port) in heirs.get((sh.node, sh.id), ())
            if sh.port and not handed:
                key = (sh.node, sh.port)
                assert key not in ports, f"port {sh.port} on {sh.node} is given to {ports[key]} and {sh.id}"
                ports[key] = sh.id
            for g in sh.gpus:
                assert node.used.get(g) == sh.id, f"{sh.node}.used[{g}] is {node.used.get(g)!r}, not {sh.id}"
            if sh.port and not handed:
                assert node.ports.get(sh.port) == sh.id, f"{sh.node}.ports[{sh.port}] is not {sh.id}"
    for name, node in state.nodes.items():
        # Ports other programs hold: as the agent said them, each once, only of the node's range.
        first, last = node.port_first or 20000, node.port_last or 29999
        assert node.taken == sorted(set(node.taken)) and all(first <= p <= last for p in node.taken), (
            f"{name}.taken = {node.taken} (range {first}-{last})"
        )
        if node.state != "ready":
            assert not node.used and not node.ports and not node.strays, f"lost node {name} still holds something"
            continue
        for sid, stray in node.strays.items():
            # The agents in these worlds never report two things on one GPU or port,
            # so a stray holds everything it runs on.
            for g in stray.gpus:
                assert node.used.get(g) == sid, f"{name}.used[{g}] is {node.used.get(g)!r}, not stray {sid}"
            if stray.port:
                assert node.ports.get(stray.port) == sid, f"{name}.ports[{stray.port}] is not stray {sid}"
        for g, holder in node.used.items():
            stray = node.strays.get(holder)
            assert holders.get((name, g)) == holder or (stray is not None and g in stray.gpus), (
                f"{name}.used[{g}] = {holder!r}, which neither a live shard nor a stray holds"
            )
        for p, holder in node.ports.items():
            stray = node.strays.get(holder)
            assert ports.get((name, p)) == holder or (stray is not None and stray.port == p), (
                f"{name}.ports[{p}] = {holder!r}, which neither a live shard nor a stray holds"
            )


def assert_held_memory_cores_and_tallies_are_derived(state: State) -> None:
    """What the fold keeps as sums (host memory and cores held per node, the
    tallies per model) is exactly what counting again from the shards and
    replicas gives; and no node holds more memory or cores than it has."""
    memory: dict[str, float] = {}
    cores: dict[str, int] = {}
    tallies: dict[str, tuple[int, int, int, int, int]] = {}
    for rep in state.replicas.values():
        for sh in rep.shards:
            if sh.state in LIVE_SHARD_STATES:
                memory[sh.node] = memory.get(sh.node, 0.0) + sh.memory_gb
                cores[sh.node] = cores.get(sh.node, 0) + sh.cpu_cores
        if rep.state != "stopping":
            model = state.models.get(rep.model)
            unwanted = model is None or model.fingerprints.get(rep.profile) != rep.fingerprint
            live, failed, unw, retiring, assembling = tallies.get(rep.model, (0, 0, 0, 0, 0))
            tallies[rep.model] = (
                live + 1,
                failed + (rep.state == "failed"),
                unw + unwanted,
                retiring + (rep.restart in ("replacing", "in place")),
                assembling + bool(rep.want_shards),
            )
    for name, node in state.nodes.items():
        assert abs(node.memory_used - memory.get(name, 0.0)) < 1e-6, (
            f"{name} holds {node.memory_used} GB of host memory; its shards hold {memory.get(name, 0.0)}"
        )
        held = cores.get(name, 0)
        assert node.cpu_used == held, f"{name} holds {node.cpu_used} cores, its shards {held}"
        if node.memory_gb:
            assert node.memory_used <= node.memory_gb + 1e-6, f"{name}: {node.memory_used} of {node.memory_gb} GB held"
        if node.cpu_cores:
            assert node.cpu_used <= node.cpu_cores, f"{name}: {node.cpu_used} of {node.cpu_cores} cores held"
    usage: dict = {}
    for rep in state.replicas.values():
        for sh in rep.shards:
            if sh.state in LIVE_SHARD_STATES:
                add(usage, rep.owner, shard_amount(sh))
    assert state.usage == usage, f"usage {state.usage}, counted again {usage}"
    kept = {m: (t.live, t.failed, t.unwanted, t.retiring, t.assembling) for m, t in state.tallies.items()}
    kept = {m: t for m, t in kept.items() if t != (0, 0, 0, 0, 0)}  # a model whose replicas have all gone
    assert kept == tallies, f"tallies {kept}, counted again {tallies}"


def assert_quarantined_and_nothing_else(step: Step, after: State) -> None:
    before = step.state_before()
    seq, subject, _ = step.record
    assert after.quarantine_count == before.quarantine_count + 1, f"{step.detail} on {subject} was not quarantined"
    assert (after.quarantined[-1].seq, after.quarantined[-1].subject) == (seq, subject)
    rest = copy_state(after)
    rest.seq, rest.control_seq = before.seq, before.control_seq
    rest.quarantine_count, rest.quarantined = before.quarantine_count, before.quarantined
    assert rest == before, f"a quarantined message ({step.detail} on {subject}) changed the state"


def why_place_is_unsafe(
    before: State,
    a: ev.PlaceReplica,
    taken: set[tuple[str, str, int]],
    numbers: dict[str, int],
    held: dict[tuple[str, str], float],
    stopped: set[str] = frozenset(),  # type: ignore[assignment]
) -> str:
    """Why applying a placement on `before` (plus what earlier actions of the
    same decision took) would be wrong, or "" when it is safe. Said
    independently of the fold; the fold may void more than this, never less.

    In place of a replica stopped by an earlier action of the same decision
    (`replaces`), what that replica's shards hold is the new one's to take."""
    handed: dict[str, list] = {}
    if a.replaces:
        old = before.replicas.get(a.replaces)
        if old is None or old.model != a.model or (a.replaces not in stopped and old.state != "stopping"):
            return f"the replica it replaces, {a.replaces}, is not being stopped"
        for sh in old.shards:
            if sh.state not in ("failed", "stopped"):
                handed.setdefault(sh.node, []).append(sh)
    model = before.models.get(a.model)
    if model is None:
        return "its model is not in the catalog"
    if model.fingerprints.get(a.profile) != a.fingerprint:
        return "its profile changed"
    # A replica id is "<model>-<n>" and is never used twice in one log.
    head, _, n = a.replica.rpartition("-")
    if a.replica in before.replicas or head != a.model or not n.isdigit() or int(n) < numbers.get(a.model, 1):
        return f"replica id {a.replica} was used before"
    if not a.shards or len({s.node for s in a.shards}) != len(a.shards):
        return "not one shard per distinct node"
    profile = profile_named(model.spec, a.profile)
    assert profile is not None
    for s in a.shards:
        node = before.nodes.get(s.node)
        if node is None or node.state != "ready":
            return f"{s.node} is not ready"
        if node.simulated and profile.engine != "sim" and not profile.simulate:
            return f"{s.node} is simulated and {profile.engine} would not run there"
        old_shards = handed.get(s.node, [])
        old_ids = {sh.id for sh in old_shards}
        memory = node.memory_used + held.get((s.node, "memory"), 0.0) + profile.memory_gb
        memory -= sum(sh.memory_gb for sh in old_shards)
        if profile.memory_gb and node.memory_gb and memory > node.memory_gb + 1e-6:
            return f"host memory on {s.node} would be over-committed"
        cores = node.cpu_used + held.get((s.node, "cpu"), 0) + profile.cpu_cores
        cores -= sum(sh.cpu_cores for sh in old_shards)
        if profile.cpu_cores and node.cpu_cores and cores > node.cpu_cores:
            return f"CPU cores on {s.node} would be over-committed"
        have = {g.index for g in node.gpus}
        for g in s.gpus:
            if g not in have:
                return f"{s.node} has no GPU {g}"
            if (g in node.used and node.used[g] not in old_ids) or (s.node, "gpu", g) in taken:
                return f"GPU {g} on {s.node} is held"
        if s.port and (
            (s.port in node.ports and node.ports[s.port] not in old_ids) or (s.node, "port", s.port) in taken
        ):
            return f"port {s.port} on {s.node} is held"
        if s.port and s.port in node.taken:
            return f"port {s.port} on {s.node} is held by another program"
    return ""


def assert_voided_not_applied(step: Step, after: State) -> None:
    """Each action of a decision, in order, is either applied, and then it was
    safe, or voided and counted; a decision taken on the live state voids
    nothing."""
    before = step.state_before()
    seq = step.record[0]
    decided: ev.Decided = step.event  # type: ignore[assignment]
    taken: set[tuple[str, str, int]] = set()  # GPUs and ports taken by earlier actions
    placed: set[str] = set()  # replicas placed by earlier actions
    stopped: set[str] = set()  # replicas stopped by earlier actions
    strays_stopped: set[tuple[str, str]] = set()  # strays stopped by earlier actions
    waiting: dict[str, str] = {}  # what each model's `waiting` must say afterwards
    numbers = dict(before.replica_numbers)  # each model's next replica number
    held: dict[tuple[str, str], float] = {}  # host memory and cores taken by earlier actions
    applied = 0
    for a in decided.actions:
        if isinstance(a, ev.PlaceReplica):
            rep = after.replicas.get(a.replica)
            ok = (
                a.replica not in placed
                and rep is not None
                and (rep.profile, rep.fingerprint) == (a.profile, a.fingerprint)  # (of two alike, the one applied)
                and [(s.id, s.node, s.gpus, s.port, s.generation) for s in rep.shards]
                == [(s.shard, s.node, s.gpus, s.port, seq) for s in a.shards]
            )
            if ok:
                why = why_place_is_unsafe(before, a, taken, numbers, held, stopped)
                assert not why, f"{a.replica} was placed though {why}"
                placed.add(a.replica)
                numbers[a.model] = int(a.replica.rpartition("-")[2]) + 1
                waiting[a.model] = ""
                profile = profile_named(before.models[a.model].spec, a.profile)
                # In place of a replica stopped by this decision: what its shards held on
                # the node is handed over, not held twice.
                old = before.replicas[a.replaces].shards if a.replaces else []
                for s in a.shards:
                    handed = [sh for sh in old if sh.node == s.node and sh.state not in ("failed", "stopped")]
                    memory = profile.memory_gb - sum(sh.memory_gb for sh in handed)
                    cores = profile.cpu_cores - sum(sh.cpu_cores for sh in handed)
                    held[(s.node, "memory")] = held.get((s.node, "memory"), 0.0) + memory
                    held[(s.node, "cpu")] = held.get((s.node, "cpu"), 0) + cores
                    taken.update((s.node, "gpu", g) for g in s.gpus)
                    if s.port:
                        taken.add((s.node, "port", s.port))
        elif isinstance(a, ev.StopReplica):
            was = before.replicas.get(a.replica)
            ok = a.replica not in stopped and (a.replica in placed or (was is not None and was.state != "stopping"))
            # A start-timeout stop taken on a stale state is void once the replica
            # became ready meanwhile: it did start, only later than that decision saw.
            ok = ok and not (a.failed_to_start and was is not None and was.ready_at)
            if ok:
                stopped.add(a.replica)
                now = after.replicas.get(a.replica)
                assert now is None or now.state == "stopping", f"{a.replica} was not stopped"
        elif isinstance(a, ev.ModelWaiting):
            ok = a.model in before.models
            if ok:
                waiting[a.model] = a.reason
        elif isinstance(a, ev.StopStray):
            node = before.nodes.get(a.node)
            stray = node.strays.get(a.shard) if node is not None else None
            ok = (
                stray is not None
                and stray.generation == a.generation
                and not stray.stopping
                and (a.node, a.shard) not in strays_stopped  # by an earlier action of the same decision
            )
            if ok:
                strays_stopped.add((a.node, a.shard))
                assert after.nodes[a.node].strays[a.shard].stopping
        elif isinstance(a, ev.ScaleModel):
            ok = a.model in before.models
            if ok:
                assert after.models[a.model].desired == a.desired
        elif isinstance(a, (ev.RestartReplica, ev.RefuseRestart)):
            was = before.replicas.get(a.replica)
            ok = was is not None and was.state != "stopping" and a.replica not in stopped and was.model in before.models
            if isinstance(a, ev.RestartReplica):
                ok = ok and was.restart not in ("replacing", "in place")
            if ok:
                now = after.replicas.get(a.replica)
                assert now is None or now.state == "stopping" or now.restart != ""
        elif isinstance(a, ev.Preempt):
            ok = a.model in before.models and all(
                v.replica in before.replicas
                and before.replicas[v.replica].state != "stopping"
                and not before.replicas[v.replica].preempted_for
                and v.replica not in stopped
                for v in a.victims
            )
            if ok:
                assert all(after.replicas[v.replica].preempted_for == a.model for v in a.victims
                           if v.replica in after.replicas)
        elif isinstance(a, ev.ParkModel):
            ok = a.model in before.models
            if ok and a.model in after.models:
                assert after.models[a.model].parked
        else:  # pragma: no cover - a new kind of action needs a rule here
            raise AssertionError(f"unknown action {a!r}")
        applied += ok
    # Nothing was placed but by an action that was applied.
    new = {
        rid
        for rid, rep in after.replicas.items()
        # (not one adopted before, whose agent-given generation happens to be this sequence)
        if rid not in before.replicas and any(s.generation == seq for s in rep.shards)
    }
    assert new == placed, f"placed {sorted(new)}, but only {sorted(placed)} by actions applied"
    for model, reason in waiting.items():
        assert after.models[model].waiting == reason
    voided = after.voided_count - before.voided_count
    assert voided == len(decided.actions) - applied, (
        f"{len(decided.actions) - applied} action(s) not applied but {voided} voided: {after.voided[-voided:]}"
    )
    assert all(v.seq == seq for v in after.voided[len(after.voided) - voided :])
    if step.fresh:
        assert voided == 0, f"a decision taken on the live state was voided: {after.voided[-voided:]}"


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(st.data())
def test_replaying_the_log_gives_the_live_state(data):
    world = World(data, rogue=True)
    for _ in world.run(STEPS):
        pass
    assert replay(world.log) == world.live


@SETTINGS
@given(st.data())
def test_a_snapshot_plus_the_tail_gives_the_full_replay(data):
    world = World(data, rogue=True)
    for _ in world.run(STEPS):
        pass
    full = replay(world.log)
    cut = data.draw(st.integers(0, len(world.log)), "cut")
    snapshot = encode_state(replay(world.log[:cut]))
    assert snapshot == world.states[cut]  # the state at the cut, as the live fold had it
    state = decode_state(snapshot)
    for seq, subject, data_ in world.log[cut:]:
        apply(state, seq, subject, data_)
    assert state == full


@SETTINGS
@given(st.data())
def test_decide_is_deterministic_and_does_not_touch_the_state(data):
    world = World(data, rogue=True)
    for _ in world.run(STEPS):
        now = world.now + data.draw(st.integers(0, 100))
        before = encode_state(world.live)
        one, two = decide(copy_state(world.live), now), decide(copy_state(world.live), now)
        assert one == two
        assert decide(world.live, now) == one
        assert encode_state(world.live) == before, "decide changed the state it was given"


@SETTINGS
@given(st.data())
def test_the_node_index_the_fold_keeps_is_the_one_built_afresh(data):
    """Placement's node index is filed again only for the nodes the fold
    touched (nodeindex.py), and each model's replicas are kept as the fold
    adds and forgets them (replicaindex.py): after every step both must be
    what the state says, and a pass on it decide what a pass on a copy decides
    (a copy has no index kept: its pass builds one)."""
    world = World(data, rogue=True)
    track(world.live).sync(world.live)
    replicas_of(world.live, set())  # each model's replicas kept from here on (replicaindex.py)
    for _ in world.run(STEPS):
        assert index_of(world.live).check(world.live) == []
        assert replicaindex.check(world.live) == []
        now = world.now + data.draw(st.integers(0, 100))
        assert decide(world.live, now) == decide(copy_state(world.live), now)


@SETTINGS
@given(st.data())
def test_no_gpu_or_port_is_ever_given_twice(data):
    world = World(data, rogue=True)
    assert_no_gpu_given_twice(world.live)
    for _ in world.run(STEPS):
        assert_no_gpu_given_twice(world.live)
        assert_held_memory_cores_and_tallies_are_derived(world.live)


@SETTINGS
@given(st.data())
def test_a_shard_failed_on_a_port_another_program_holds_never_counts_towards_parking(data):
    # It is the node's fact, not the model's: the replacement gets another
    # port. Counted, five such failures parked a model whose every other port was free.
    world = World(data)
    for step in world.run(STEPS):
        e = step.event
        if not (isinstance(e, ev.ShardStatus) and e.state == "failed"):
            continue
        before = step.state_before()
        rep, node = before.replicas.get(e.replica), before.nodes.get(e.node)
        sh = next((s for s in rep.shards if s.id == e.shard), None) if rep is not None else None
        if sh is None or node is None or sh.port not in node.taken or rep.model not in world.live.models:
            continue
        was, now = before.models[rep.model], world.live.models[rep.model]
        assert (now.start_failures, now.failed_at) == (was.start_failures, was.failed_at), (
            f"{e.shard} failed on port {sh.port}, which another program holds on {e.node}, and counted"
        )


def why_shard_breaks_a_rule(before: State, profile: ev.ProfileSpec, a: ev.PlaceReplica) -> str:
    """Which placement rule a decided replica breaks, said independently of
    placement.py (the GPU model by substring, enough for the names the
    strategies draw), or "" when it keeps them all."""
    if len(a.shards) != profile.nodes or [s.rank for s in a.shards] != list(range(profile.nodes)):
        return f"{len(a.shards)} shards ranked {[s.rank for s in a.shards]} for {profile.nodes} nodes"
    fabrics = set()
    for s in a.shards:
        node = before.nodes[s.node]
        if len(s.gpus) != profile.gpus:
            return f"{len(s.gpus)} GPUs on {s.node}, the profile asks {profile.gpus}"
        gpus = {g.index: g for g in node.gpus}
        for i in s.gpus:
            g = gpus[i]
            if profile.gpu_model and profile.gpu_model.lower() not in g.model.lower():
                return f"GPU {i} on {s.node} is a {g.model!r}, not a {profile.gpu_model}"
            if g.memory_gb < profile.gpu_memory_gb:
                return f"GPU {i} on {s.node} has {g.memory_gb} GB, not {profile.gpu_memory_gb}"
        if profile.pool and node.labels.get("llmgw.io/pool") != profile.pool:
            return f"{s.node} is not in pool {profile.pool}"
        if node.simulated and profile.engine != "sim" and not profile.simulate:
            return f"{s.node} is simulated: {profile.engine} runs there only with simulate"
        first, last = node.port_first or 20000, node.port_last or 29999
        if not first <= s.port <= last or s.port in node.taken:
            return f"port {s.port} on {s.node}: outside {first}-{last} or held by another program {node.taken}"
        fabrics.add(node.labels.get("llmgw.io/fabric", ""))
    if profile.nodes > 1 and (len(fabrics) != 1 or "" in fabrics):
        return f"a multi-node replica over fabrics {sorted(fabrics)}"
    return ""


@SETTINGS
@given(st.data())
def test_decided_placements_keep_every_rule_of_their_profile(data):
    world = World(data, rogue=True)
    for step in world.run(STEPS):
        if not (isinstance(step.event, ev.Decided) and step.fresh):
            continue
        before = step.state_before()
        for a in step.event.actions:
            if isinstance(a, ev.PlaceReplica):
                profile = profile_named(before.models[a.model].spec, a.profile)
                why = why_shard_breaks_a_rule(before, profile, a)
                assert not why, f"{a.replica} ({a.profile}): {why}"


@SETTINGS
@given(st.data())
def test_explain_and_placement_agree_on_what_fits(data):
    # Placement looks through its index; explain asks every node. Both must
    # find the same: a profile fits by one exactly when it does by the other.
    world = World(data, rogue=True)
    for _ in world.run(STEPS):
        state = world.live
        for name, model in state.models.items():
            e = explain(state, name)
            kept = [
                r for r in state.replicas.values()
                if r.model == name and r.state not in ("stopping", "failed")
                and model.fingerprints.get(r.profile) == r.fingerprint
            ]
            spread = replicas_per_node(kept)
            for p, pf in zip(model.spec.profiles, e.profiles):
                shards = Inventory(state).place(p, f"{name}-0", dict(spread))  # (place counts in it)
                assert (shards is not None) == pf.fits, (
                    f"{name}/{p.name}: placement found {shards}, explain says fits={pf.fits}: {pf}"
                )
            first = next((pf.profile for pf in e.profiles if pf.fits), "")
            assert e.chosen == first


@SETTINGS
@given(st.data())
def test_malformed_messages_are_quarantined_and_change_nothing_else(data):
    world = World(data, rogue=True)
    for step in world.run(STEPS):
        if step.malformed:
            assert_quarantined_and_nothing_else(step, world.live)
        else:
            # A well-formed event from its rightful speaker is never quarantined.
            assert world.live.quarantine_count == step.state_before().quarantine_count, (
                world.live.quarantined[-1].error
            )


@SETTINGS
@given(st.data())
def test_stale_decisions_are_voided_not_applied(data):
    world = World(data, rogue=True)
    for step in world.run(STEPS):
        if isinstance(step.event, ev.Decided):
            assert_voided_not_applied(step, world.live)
        assert_no_gpu_given_twice(world.live)
        assert_held_memory_cores_and_tallies_are_derived(world.live)


@SETTINGS
@given(st.data())
def test_verify_finds_no_difference_in_a_log_of_fresh_decisions(data):
    world = World(data, stale=False)
    passes = 0
    for step in world.run(STEPS):
        passes += isinstance(step.event, ev.Decided)
    checked, differences = verify(world.log)
    assert (checked, differences) == (passes, [])


@SETTINGS
@given(st.data())
def test_verify_finds_no_difference_in_decisions_taken_on_older_states(data):
    # A deposed leader's decision names the (older) state it was taken on as
    # its basis, so deciding again on that state gives it exactly.
    world = World(data)
    passes = 0
    for step in world.run(STEPS):
        passes += isinstance(step.event, ev.Decided)
    checked, differences = verify(world.log)
    assert (checked, differences) == (passes, [])


# This property found a core bug, since fixed in fold._place (commit 08ab9e8):
# the fold voided a placement whose replica existed *now*, not one whose id had
# been used before, so a late decision (a deposed leader's) re-placed a replica
# that had been placed, failed, stopped and forgotten, and one replica id named
# two incarnations in one log. The regression test below is the minimal log.
class ReuseWorld(World):
    """Replicas placed, failed, stopped and forgotten, and made-up decisions that name them again."""

    def kinds(self) -> list[str]:
        return [*super().kinds(), "rogue", "rogue", "decide", "status", "status"]


@settings(SETTINGS, max_examples=2 * SETTINGS.max_examples)
@given(st.data())
def test_a_replica_id_is_placed_at_most_once_in_a_log(data):
    # state.py: replica numbers are "never forgotten ... so an id is never used
    # twice in one log". Whoever publishes, the fold must keep that.
    world = ReuseWorld(data, rogue=True)
    placed: dict[str, int] = {}
    for step in world.run(STEPS):
        if isinstance(step.event, ev.Decided):
            seq = step.record[0]
            for rid, rep in world.live.replicas.items():
                if rep.shards and rep.shards[0].generation == seq:
                    assert rid not in placed, f"replica {rid} placed at seq {placed[rid]} and again at seq {seq}"
                    placed[rid] = seq


def test_a_late_decision_does_not_place_a_forgotten_replica_id_again():
    # The minimal log hypothesis found (before the fix), written out.
    state, log = State(), []

    def publish(event: ev.Event) -> int:
        seq = len(log) + 1
        log.append((seq, ev.subject_for(event), ev.encode(event)))
        apply(state, *log[-1])
        return seq

    publish(ev.NodeRegistered(at=1, node="a", gpus=[ev.Gpu(index=0, memory_gb=80)]))
    publish(ev.ModelApplied(at=2, model=ev.ModelSpec(name="m", profiles=[ev.ProfileSpec(name="p")])))
    old = copy_state(state)  # what a leader about to be deposed decides on
    first = publish(ev.Decided(at=3, basis=state.seq, actions=decide(state, 3)))  # m-1 placed
    publish(ev.ShardStatus(at=4, node="a", replica="m-1", shard="m-1.0", generation=first, state="failed"))
    # m-1 stopped and gone, m-2 placed (after the back-off its failure to start asks for)
    second = publish(ev.Decided(at=10, basis=state.seq, actions=decide(state, 10)))
    publish(ev.ShardStatus(at=11, node="a", replica="m-2", shard="m-2.0", generation=second, state="failed"))
    assert "m-1" not in state.replicas and state.replica_numbers["m"] == 3
    late = decide(old, 12)
    assert [a.replica for a in late] == ["m-1"]
    publish(ev.Decided(at=12, basis=old.seq, actions=late))  # published late
    assert "m-1" not in state.replicas, "replica id m-1 was placed a second time"
    assert state.voided_count == 1


# --------------------------------------------------------------------------- the reconciler's promises


class RestartWorld(World):
    """Warm worlds where agents do what they are told (shards come up, stop),
    operators restart replicas often and gateways report load: restarts
    begin, finish, go in place and are refused."""

    def __init__(self, data, **kw) -> None:
        super().__init__(data, warm=True, plain=True, min_steps=25, forgetful=False, **kw)

    def kinds(self) -> list[str]:
        calm = ["decide"] * 8 + ["up"] * 8 + ["restart"] * 4 + ["load"] * 2 + ["retry", "apply", "status", "stale"]
        return calm + ["register", "register", "lose", "remove"]


def ready_serving(state: State, model: str) -> int:
    """Replicas of a model that serve and stay: ready, not stopping, not being replaced."""
    return sum(
        1
        for r in state.replicas.values()
        if r.model == model and r.state == "ready" and r.restart not in ("replacing", "in place")
    )


def fits_anywhere(state: State, spec: ev.ModelSpec, freed: list = ()) -> bool:
    """Whether a replica of the model fits on some node, within its owner's
    limits, with what `freed` (replicas) hold counted as free. (A replacement
    beside that would take its owner past a limit does not fit: the restart
    goes in place, crediting what the old one holds.)"""
    inv = Inventory(state)
    for rep in freed:
        inv.release(rep.shards)
    allowed = [p for p in spec.profiles
               if not (state.owners and spec.owner and over_limit(state, spec.owner, need(p)))]
    return any(inv.place(p, f"{spec.name}-0", {}) is not None for p in allowed)


def assert_restarts_keep_models_serving(step: Step, after: State) -> None:
    """On a decision taken on the live state:
    - a retiring replica is drained only once its model has its desired count
      of ready replicas without it (a restart not in place never takes a
      model below it);
    - one is stopped for lack of room ("the only thing in its replacement's
      way") only when no replacement fits anywhere on what the actions before
      it left, counting the room of replicas preempted for its model as
      free (they are on their way out: it must wait for them, as restart.go
      does), and never in a decision that preempts for its model;
    - a refused restart leaves its replica as it was, serving."""
    before = step.state_before()
    decided: ev.Decided = step.event  # type: ignore[assignment]
    stopped = {a.replica for a in decided.actions if isinstance(a, ev.StopReplica)}
    preempted_for = {a.model for a in decided.actions if isinstance(a, ev.Preempt)}
    for i, a in enumerate(decided.actions):
        if isinstance(a, ev.StopReplica) and a.reason == "restarted: its replacement serves":
            model = before.replicas[a.replica].model
            n = desired(before.models[model], decided.at)
            have = ready_serving(after, model)
            assert have >= n, f"restarting {a.replica} left {model} with {have} ready of the {n} it wants"
        elif isinstance(a, ev.StopReplica) and a.reason.endswith("the only thing in its replacement's way"):
            rep = before.replicas[a.replica]
            assert rep.model not in preempted_for, (
                f"{a.replica} was stopped in place in the pass that preempted for {rep.model}"
            )
            partial = copy_state(before)
            evolve(partial, ev.Decided(at=decided.at, basis=decided.basis, actions=decided.actions[:i]), step.record[0])
            victims = [r for r in partial.replicas.values() if r.preempted_for == rep.model]
            assert not fits_anywhere(partial, before.models[rep.model].spec, victims), (
                f"{a.replica} was stopped in place though a replacement fitted beside it"
                + (f" once {', '.join(r.id for r in victims)}, preempted for it, had gone" if victims else "")
            )
        elif isinstance(a, ev.RefuseRestart):
            was, now = before.replicas[a.replica], after.replicas.get(a.replica)
            assert a.replica not in stopped, f"{a.replica}'s restart was refused, yet it was stopped"
            assert now is not None and now.state == was.state, f"{a.replica} was {was.state}, now {now}"
            assert now.restart == "refused" and now.restart_reason == a.reason


@SETTINGS
@given(st.data())
def test_restarts_never_take_a_model_below_its_desired_ready_count_and_refusals_keep_serving(data):
    world = RestartWorld(data)
    for step in world.run(STEPS):
        if isinstance(step.event, ev.Decided) and step.fresh:
            assert_restarts_keep_models_serving(step, world.live)
        assert_no_gpu_given_twice(world.live)
        assert_held_memory_cores_and_tallies_are_derived(world.live)
    assert replay(world.log) == world.live


# --------------------------------------------------------------------------- liveness

# Rounds of an obedient fleet after a random history, and the time each one
# lets pass: past every back-off (300 s at most), hold (HOLD_S) and wait for
# an adopted replica's other shards (ADOPT_WAIT_S), so that nothing waits on
# the clock alone. A restart paced one at a time takes two rounds a replica.
SETTLE_ROUNDS = 60
SETTLE_S = 400.0


def settle(world: World, rounds: int = SETTLE_ROUNDS) -> None:
    """Decide, then let every agent do what it was told, round after round:
    every shard placed or coming up on a ready node reports ready (one placed
    in place of others once they have exited), every shard told to stop
    exits, every stray told to stop exits; then time passes."""
    for _ in range(rounds):
        world.now += SETTLE_S
        actions = decide(world.live, world.now)
        if actions:
            world.publish(ev.Decided(at=world.now, basis=world.live.seq, actions=actions, leader="cp-1"))
        for rep in list(world.live.replicas.values()):
            for sh in list(rep.shards):
                node = world.live.nodes.get(sh.node)
                if node is None or node.state != "ready":
                    continue
                if sh.state == "stopping":
                    state = "stopped"
                elif sh.state in ("placing", "starting", "loading") and not _waits_for(world.live, sh.after):
                    state = "ready"
                else:
                    continue
                world.publish(ev.ShardStatus(at=world.now, node=sh.node, replica=rep.id, shard=sh.id,
                                             generation=sh.generation, state=state,
                                             endpoint=f"http://{sh.node}:{sh.port}"))
        for name, node in list(world.live.nodes.items()):
            for shard, stray in list(node.strays.items()):
                if stray.stopping and node.state == "ready":
                    replica = world.stray_replicas.get((name, shard), shard.rpartition(".")[0])
                    world.publish(ev.ShardStatus(at=world.now, node=name, replica=replica, shard=shard,
                                                 generation=stray.generation, state="stopped"))


def _waits_for(state: State, after: list[str]) -> bool:
    """Whether any of these shards (of replicas replaced in place) still runs."""
    for sid in after:
        rep = state.replicas.get(sid.rpartition(".")[0])
        if rep is not None and any(s.id == sid and s.state in LIVE_SHARD_STATES for s in rep.shards):
            return True
    return False


def assert_nothing_is_stuck(state: State, now: float) -> None:
    """After the fleet settled: every replica serves (none placing, starting,
    loading, failed or stopping for ever), no stray is left stopping, and
    every model has what it wants or says why it waits."""
    for rep in state.replicas.values():
        assert rep.state == "ready", f"{rep.id} is stuck {rep.state}: {rep.reason}"
    for name, node in state.nodes.items():
        stuck = [s for s, stray in node.strays.items() if stray.stopping and node.state == "ready"]
        assert not stuck, f"strays {stuck} on {name} never stopped"
    for name, model in state.models.items():
        have = sum(1 for r in state.replicas.values() if r.model == name)
        n = desired(model, now)
        assert have == n or model.waiting or model.parked, (
            f"{name} has {have} of {n} replicas and says nothing of why"
        )


@SETTINGS
@given(st.data())
def test_every_replica_not_ready_progresses_or_is_replaced(data):
    """Liveness: whatever happened before (registrations with and without
    running shards, engines stopping and failing unasked, nodes lost, stale
    and made-up decisions), once agents do what they are told nothing stays
    in a state that no rule moves it out of."""
    world = World(data, rogue=True)
    for _ in world.run(STEPS):
        pass
    settle(world)
    assert_nothing_is_stuck(world.live, world.now)
    assert_no_gpu_given_twice(world.live)
    assert_held_memory_cores_and_tallies_are_derived(world.live)
