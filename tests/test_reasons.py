"""Reasons as data (issue 33, part 3): each rule says why as a typed cause
(core/contract/reasons.py), the words are rendered from it, the same words as the
rules gave before, and nothing but the renderer reads the words back."""

from __future__ import annotations

import ast
import os
import pathlib

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.core.contract import events as ev
from llmgw.core.contract.bounds import TEXT_LEN, clip
from llmgw.core.folding.decisions import as_recorded
from llmgw.core.simulation.history import verify
from llmgw.core.contract.policy import Policy
from llmgw.core.contract.reasons import TIERS, CauseKind, ScaleWhy, kind_of, render, scale_words, words
from llmgw.core.contract.times import utc

from .fleet_strategies import World
from .scenario import Fleet, model

K = CauseKind


def c(kind: CauseKind, **fields) -> ev.Cause:
    return ev.Cause(kind=kind.value, **fields)


def s(why: ScaleWhy, **fields) -> ev.Scale:
    return ev.Scale(why=why.value, **fields)


# --------------------------------------------------------------------------- the words, as the rules gave them

# Each kind with parameters, and the words its rule wrote before causes
# were data (copied from the f-strings of decide.py, restarts.py,
# preempt.py, drains.py, scaling.py, admission.py, adoption.py, quota.py).
WORDS = [
    (c(K.MODEL_REMOVED, model="m"), "model m was removed from the catalog"),
    (c(K.REPLACED, text="shard m-1.0 on a failed: CUDA error"), "replaced: shard m-1.0 on a failed: CUDA error"),
    (c(K.ADOPTED_PARTLY, count=1, of=2, seconds=120.0),
     "adopted with 1 of its 2 shards; the others were not reported within 120s"),
    (c(K.START_TIMEOUT, seconds=60.0, state="placing", nodes=["idle"]),
     "not ready within 60s (start_timeout_s) of its placement: placing on idle"),
    (c(K.START_TIMEOUT, seconds=60.0, state="loading", nodes=["a", "b"]),
     "not ready within 60s (start_timeout_s) of its placement: loading on a, b"),
    (c(K.START_TIMEOUT, seconds=60.0, state="loading"),
     "not ready within 60s (start_timeout_s) of its placement: loading on its nodes"),
    (c(K.SCALE_DOWN, model="m", count=1, scale=s(ScaleWhy.MIN, least=1)), "m scales down to 1: min_replicas 1"),
    (c(K.PREEMPTED, model="prod", tier=4), f"preempted for prod (tier 4: {TIERS[4]})"),
    (c(K.PREEMPTED, model="prod", tier=0), "preempted for prod (tier 0: idle on-demand replica of a lower class)"),
    (c(K.RESTART_SERVED), "restarted: its replacement serves"),
    (c(K.IN_PLACE_ASKED), "restarted in place, as asked"),
    (c(K.IN_PLACE_PACED), "restarted in place (max_unavailable)"),
    (c(K.IN_PLACE_ONLY), "restarted in place: it was the only thing in its replacement's way"),
    (c(K.IN_PLACE_GRACE, seconds=30.0), "restarted in place: no replacement beside it within 30s"),
    (c(K.RESTART_ASKED), "asked by an operator"),
    (c(K.PROFILE_CHANGED, profile="default", model="m"), "profile default of m changed"),
    (c(K.DRAIN, domain="rack/r1", text="maintenance"), "rack/r1 is held for draining: maintenance"),
    (c(K.DRAIN, domain="rack/r1"), "rack/r1 is held for draining: no reason given"),
    (c(K.REFUSE_PARKED, model="m"), "its replacements fail to start; the model is parked (llmgw ctl retry m)"),
    (c(K.REFUSE_OVER_LIMIT, owner="team"),
     "its replacement would take team past a limit even with this replica stopped"),
    (c(K.REFUSE_FITS_NOWHERE, model="m"),
     "its replacement fits on no node even with this replica stopped (llmgw ctl explain-placement m)"),
    (c(K.REFUSE_DRAIN, model="m", domain="rack/r1", text="power work"),
     "rack/r1 is held for draining: power work; its replacement fits nowhere else, so it stays and serves "
     "until there is room (llmgw ctl explain-placement m)"),
    (c(K.DESIRED, model="m", scale=s(ScaleWhy.UNUSED)), "on demand: no request for m yet"),
    (c(K.PARKED, model="m", count=5, text="shard m-5.0 on a: no such file"),
     "parked: 5 replicas in a row failed to start (the last: shard m-5.0 on a: no such file); "
     "`llmgw ctl retry m` tries again"),
    (c(K.PREEMPT, model="prod", priority="critical", count=0, of=1, victims=1),
     "prod (critical) has 0 of 1 replicas and fits nowhere; stopping 1 replica(s) makes room"),
    (c(K.BACKING_OFF, count=2, text="m-2: boom", seconds=10.0),
     "backing off: 2 replica(s) in a row failed to start (the last: m-2: boom); the next try 10s after that failure"),
    (c(K.LATE, model="m"), "a replica of m was not ready by its start deadline"),
    (c(K.HELD, model="prod", seconds=300.0),
     "held: it gave room to prod (preempted for it), which is still short; "
     "until prod has what it asked for, 300s after the preemption at the latest"),
    (c(K.WAITING_FOR, replicas=["b-1", "b-2"]), "waiting for b-1, b-2, preempted for it, to stop"),
    (c(K.PREEMPTING, replicas=["batch-1"]), "preempting batch-1 to make room"),
    (c(K.YOUNG_VICTIMS, replicas=["b-1", "b-2"], seconds=120.0, at=1_700_000_000.0),
     f"no room; b-1, b-2 would make room but became ready less than 120s ago "
     f"(a replica is not preempted before it has served that long): they may give way from {utc(1_700_000_000.0)}"),
    (c(K.OVER_LIMIT, owner="team", resource="gpus", held=4.0, more=1.0, limit=4.0),
     "over limit: owner team holds 4 GPUs; 1 more would pass its limit of 4"),
    (c(K.OVER_LIMIT, owner="a/b", resource="memory_gb", held=30.5, more=8.0, limit=32.0),
     "over limit: owner a/b holds 30.5 GB of host memory; 8 more would pass its limit of 32"),
    (c(K.OVER_LIMIT, owner="t", resource="cpu_cores", held=2.0, more=4.0, limit=4.0),
     "over limit: owner t holds 2 CPU cores; 4 more would pass its limit of 4"),
    (c(K.NO_MODEL, model="old"), "no model old in the catalog claims it"),
    (c(K.NO_PROFILE, model="m", profile="big"), "model m has no profile big any more"),
    (c(K.GIVEN_UP, shard="m-1.0", replica="m-1"),
     "shard m-1.0 of m-1 was given up here (failed or lost) and its replica went on without it"),
    (c(K.SECOND_COPY, replica="m-1", nodes=["b"]),
     "replica m-1 runs on b already: this copy of it is not the one the control plane placed"),
    (c(K.SECOND_COPY, replica="m-1"),
     "replica m-1 runs on another node already: this copy of it is not the one the control plane placed"),
    (c(K.UNKNOWN_REPLICA, replica="m-9"), "replica m-9 is not one the control plane knows"),
    (c(K.CORDONED, node="a", text="is cordoned"), "node a is cordoned: it adopts nothing meanwhile"),
    (c(K.PLACED_ELSEWHERE, replica="m-1", nodes=["b", "c"], node="a"),
     "replica m-1 was placed on b, c: node a may claim only shards placed on it"),
    (c(K.RANK_TAKEN, replica="m-1", count=1, nodes=["b"], node="a"),
     "rank 1 of m-1 was reported by b already: node a may not claim it too"),
    (c(K.WRONG_POOL, model="m", profile="p", pool="gold", node="a", node_pool="tin"),
     "m's profile p runs only in pool gold, and node a is in pool tin (as an operator set it)"),
    (c(K.WRONG_POOL, model="m", profile="p", pool="gold", node="a"),
     "m's profile p runs only in pool gold, and node a is in no pool (as an operator set it)"),
]

SCALE_WORDS = [
    (s(ScaleWhy.UNUSED), "on demand: no request for m yet"),
    (s(ScaleWhy.IDLE, idle_s=601.4, idle_after_s=600.0), "on demand: no request for 601s (idle after 600s)"),
    (s(ScaleWhy.ASKED), "on demand: asked for"),
    (s(ScaleWhy.MIN, least=2), "min_replicas 2"),
    (s(ScaleWhy.LOAD, load=7, per=2.0, wants=4, least=1, most=8),
     "load 7 (in flight and queued) at 2 per replica asks for 4"),
    (s(ScaleWhy.LOAD, load=1, per=2.5, wants=1, recent=3, delay_s=300.0, least=1, most=8),
     "load 1 (in flight and queued) at 2.5 per replica asks for 1; 3 were asked for within the scale-down delay (300s)"),
    (s(ScaleWhy.LOAD, load=0, per=1.0, wants=0, least=2, most=8),
     "load 0 (in flight and queued) at 1 per replica asks for 0; at least 2"),
    (s(ScaleWhy.LOAD, load=20, per=1.0, wants=20, least=1, most=4),
     "load 20 (in flight and queued) at 1 per replica asks for 20; at most 4"),
]


@pytest.mark.parametrize("cause, said", WORDS, ids=[f"{w[0].kind}-{i}" for i, w in enumerate(WORDS)])
def test_each_kind_renders_the_words_its_rule_gave(cause, said):
    assert render(cause) == said
    # The same once through the log (numbers stay numbers, floats exact).
    again = msgspec.json.decode(msgspec.json.encode(cause), type=ev.Cause)
    assert again == cause and render(again) == said


def test_the_table_covers_every_kind_and_every_scale():
    assert {w[0].kind for w in WORDS} == {k.value for k in CauseKind}
    assert {w[0].why for w in SCALE_WORDS} == {k.value for k in ScaleWhy}


@pytest.mark.parametrize("scale, said", SCALE_WORDS)
def test_why_a_model_scales_renders_as_before(scale, said):
    assert scale_words("m", scale) == said
    assert render(c(K.DESIRED, model="m", scale=scale)) == said
    assert render(c(K.SCALE_DOWN, model="m", count=1, scale=scale)) == f"m scales down to 1: {said}"


def test_an_edge_renders_a_cause_and_falls_back_on_the_words_of_an_old_event():
    new = ev.StopReplica(replica="m-1", reason="stale words", cause=c(K.MODEL_REMOVED, model="m"))
    old = ev.StopReplica(replica="m-1", reason="model m was removed from the catalog")
    assert words(new) == words(old) == "model m was removed from the catalog"
    assert kind_of(new) == "model_removed" and kind_of(old) == ""
    # A kind this code does not know (a newer control plane's): its name, no error.
    assert render(ev.Cause(kind="moon_phase")) == "moon phase"
    # Words past the bound are cut as the recorded reason was.
    long = ev.StopReplica(replica="m-1", reason="", cause=c(K.REPLACED, text="x" * (TEXT_LEN + 10)))
    assert words(long) == clip("replaced: " + "x" * (TEXT_LEN + 10)) and len(words(long)) == TEXT_LEN


# --------------------------------------------------------------------------- the rules say it as data


def causes(actions) -> list[tuple[str, str]]:
    """(action tag, cause kind) of each action that carries a cause, and
    every one of them says in `reason` the words of its cause."""
    out = []
    for a in actions:
        cause = getattr(a, "cause", None)
        if cause is not None:
            assert a.reason == clip(render(cause)), a
            out.append((a.__struct_config__.tag, cause.kind))
    return out


def of(actions, cls):
    return [a for a in actions if type(a) is cls]


def up(f: Fleet) -> list[ev.Action]:
    said = []
    for _ in range(10):
        actions = f.decide()
        said += actions
        f.make_ready()
        if not of(actions, ev.PlaceReplica):
            break
    return said


def test_a_removed_model_a_failed_replica_and_a_scale_down_say_why_as_data():
    f = Fleet()
    f.register("a", gpus=4)
    f.apply(model("m", min_replicas=2))
    f.apply(model("gone"))
    up(f)
    f.report("m-1.0", "failed", reason="CUDA error")
    failure = f.state.replicas["m-1"].reason
    f.remove("gone")
    actions = f.decide()
    assert ("stop", "model_removed") in causes(actions) and ("stop", "replaced") in causes(actions)
    (removed,) = [a for a in of(actions, ev.StopReplica) if a.replica == "gone-1"]
    assert removed.cause == c(K.MODEL_REMOVED, model="gone")
    (failed,) = [a for a in of(actions, ev.StopReplica) if a.replica == "m-1"]
    assert failed.cause == c(K.REPLACED, text=failure) and failed.reason == f"replaced: {failure}"
    f.make_ready()
    f.apply(model("m", min_replicas=1))
    actions = f.decide()
    assert causes(actions) == [("stop", "scale_down")]  # (its count follows the catalog: no ScaleModel)
    (stop,) = actions
    assert stop.cause == c(K.SCALE_DOWN, model="m", count=1, scale=s(ScaleWhy.MIN, least=1))
    assert stop.reason == "m scales down to 1: min_replicas 1"


def test_load_scaling_carries_its_numbers():
    f = Fleet()
    f.register("a", gpus=8)
    f.apply(model("m", min_replicas=1, max_replicas=4, target_load=2.0))
    up(f)
    f.load("m", in_flight=5)
    (scale,) = of(f.decide(), ev.ScaleModel)
    sc = scale.cause.scale
    assert (sc.why, sc.load, sc.per, sc.wants, sc.least, sc.most) == ("load", 5, 2.0, 3, 1, 4)
    assert scale.reason == "load 5 (in flight and queued) at 2 per replica asks for 3"


def preempting() -> tuple[Fleet, list[ev.Action]]:
    """A critical model on a node full of an opportunistic one's replicas,
    old enough to give way: the pass that preempts one."""
    f = Fleet()
    f.register("a", gpus=2)
    f.apply(model("batch", min_replicas=2, priority="opportunistic"))
    up(f)
    f.tick(Policy().min_lifetime_s + 1)
    f.apply(model("prod", priority="critical"))
    return f, f.decide()


def test_preemption_its_victims_and_the_wait_say_why_as_data():
    f, actions = preempting()
    assert causes(actions) == [("preempt", "preempt"), ("stop", "preempted"), ("wait", "preempting")]
    pre, stop, wait = actions
    assert pre.cause == c(K.PREEMPT, model="prod", priority="critical", count=0, of=1, victims=1)
    assert stop.cause == c(K.PREEMPTED, model="prod", tier=4)
    assert wait.kind == "preempting" and wait.cause == c(K.PREEMPTING, replicas=["batch-1"])
    # The next pass: the model that gave room is held, and the preemptor
    # waits for its victim to go; both say so as data.
    f.tick()
    held, again = f.decide()
    assert (held.model, held.kind) == ("batch", "held")
    assert held.cause == c(K.HELD, model="prod", seconds=Policy().hold_s)
    assert (again.model, again.kind) == ("prod", "preempting")
    assert again.cause == c(K.WAITING_FOR, replicas=["batch-1"])


def test_a_model_whose_victims_are_too_young_says_when_they_may_give_way():
    f = Fleet()
    f.register("a", gpus=1)
    f.apply(model("batch", priority="opportunistic"))
    up(f)
    f.apply(model("prod", priority="critical"))
    (wait,) = f.decide()
    lifetime = Policy().min_lifetime_s
    assert wait.kind == "room_later"
    assert wait.cause == c(K.YOUNG_VICTIMS, replicas=["batch-1"], seconds=lifetime,
                           at=f.state.replicas["batch-1"].ready_at + lifetime)


def test_restarts_asked_served_and_in_place_say_why_as_data():
    f = Fleet()
    f.register("a", gpus=4)
    f.apply(model("m", min_replicas=2))
    up(f)
    f.restart("m-1")
    assert causes(f.decide()) == [("restart", "restart_asked")]  # (and its replacement's placement)
    f.make_ready()
    assert causes(f.decide()) == [("stop", "restart_served")]
    f.restart("m-2", in_place=True)
    assert causes(f.decide()) == [("restart", "in_place_asked"), ("stop", "in_place_asked")]
    # No room beside it: the replica was the only thing in its replacement's way.
    f = Fleet()
    f.register("a", gpus=2)
    f.apply(model("m", min_replicas=2))
    up(f)
    f.restart("m-1")
    assert causes(f.decide()) == [("restart", "restart_asked"), ("stop", "in_place_only")]


def test_a_changed_profile_restarts_with_its_name():
    f = Fleet()
    f.register("a", gpus=4)
    f.apply(model("m"))
    up(f)
    f.apply(model("m", profiles=[ev.ProfileSpec(name="default", gpus=1, args=["--new"])]))
    (restart,) = of(f.decide(), ev.RestartReplica)
    assert restart.cause == c(K.PROFILE_CHANGED, profile="default", model="m")


def fail_to_start(f: Fleet, replica: str) -> None:
    f.report(f"{replica}.0", "starting")
    f.report(f"{replica}.0", "failed", reason="no such file: /models/m")


def test_backing_off_and_parking_carry_the_count_and_the_last_failure():
    f = Fleet()
    f.register("a", gpus=1)
    f.apply(model("m"))
    f.decide()
    fail_to_start(f, "m-1")
    actions = f.decide()
    assert causes(actions) == [("stop", "replaced"), ("wait", "backing_off")]
    wait = actions[1].cause
    assert (wait.count, wait.seconds) == (1, 5.0) and wait.text == f.state.models["m"].last_failure
    park_after = Policy().park_after
    for k in range(1, park_after):
        f.tick(400)
        f.decide()
        fail_to_start(f, f"m-{k + 1}")
    f.tick(400)
    actions = f.decide()
    (park,) = of(actions, ev.ParkModel)
    assert park.cause.kind == "parked" and park.cause.count == park_after and park.cause.model == "m"
    assert of(actions, ev.ModelWaiting)[0].cause == park.cause


def test_a_replica_past_its_start_deadline_says_where_and_how_long():
    f = Fleet()
    f.publish(ev.PolicyApplied(at=f.tick(), policy=Policy(start_timeout_s=60)))
    f.register("idle", gpus=1)
    f.apply(model("m"))
    f.decide()
    f.tick(61)
    actions = f.decide()
    (stop,) = of(actions, ev.StopReplica)
    assert stop.failed_to_start and stop.cause == c(K.START_TIMEOUT, seconds=60.0, state="placing", nodes=["idle"])
    assert of(actions, ev.ModelWaiting) == [] or of(actions, ev.ModelWaiting)[0].cause.kind == "late"


def test_a_stray_is_stopped_with_why_it_is_one_as_data():
    f = Fleet()
    stray = ev.RunningShard(shard="old-1.0", replica="old-1", model="old", profile="p", generation=7, gpus=[0],
                            port=20000)
    f.register("a", gpus=2, running=[stray])
    assert f.state.nodes["a"].strays["old-1.0"].cause == c(K.NO_MODEL, model="old")
    (stop,) = f.decide()
    assert stop.cause == c(K.NO_MODEL, model="old") and stop.reason == "no model old in the catalog claims it"


def test_over_limit_says_the_owner_the_resource_and_the_amounts():
    f = Fleet()
    f.register("a", gpus=4)
    f.publish(ev.OwnerApplied(at=f.tick(), name="team", limit=ev.Limit(gpus=1)))
    f.apply(model("m", min_replicas=2, owner="team"))
    actions = up(f)
    (wait,) = of(actions, ev.ModelWaiting)
    assert wait.kind == "over_limit"
    assert wait.cause == c(K.OVER_LIMIT, owner="team", resource="gpus", held=1.0, more=1.0, limit=1.0)
    assert wait.reason == "over limit: owner team holds 1 GPUs; 1 more would pass its limit of 1"


@settings(max_examples=int(os.environ.get("LLMGW_PROPERTY_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_every_decision_of_a_random_fleet_says_why_as_data_and_its_words_are_the_cause_s(data):
    """Whatever the fleet went through (fleet_strategies.World: failures,
    strays, restarts, preemption, quotas, the facility), every stop,
    restart, refusal, scaling, parking, preemption and stray stop a fresh
    pass decides carries a cause of a known kind, and its reason is that
    cause in words; a wait carries one unless it is the placement's (no
    room, no node) or a parked model's, said again from the state."""
    world = World(data, facility=data.draw(st.booleans(), "facility"))
    known = {k.value for k in CauseKind}
    for step in world.run(30):
        if not step.fresh or type(step.event) is not ev.Decided:
            continue
        for a in step.event.actions:
            if type(a) is ev.PlaceReplica:
                continue
            if type(a) is ev.ModelWaiting and (a.kind in ("no_room", "no_node", "parked") or not a.reason):
                continue
            assert a.cause is not None and a.cause.kind in known, a
            assert a.reason == clip(render(a.cause)) == words(a)


# --------------------------------------------------------------------------- the log


def test_a_log_with_causes_verifies_and_one_without_them_does_too():
    f, _ = preempting()
    f.remove("batch")
    f.decide()
    assert any(b'"cause"' in data for _, _, data in f.log)
    checked, diffs = verify(f.log)
    assert checked and diffs == []
    # The same log as a control plane before causes wrote it: words only.
    old = []
    for seq, subject, data in f.log:
        e = ev.decode(data)
        if type(e) is ev.Decided:
            e = msgspec.structs.replace(e, actions=[msgspec.structs.replace(a, cause=None) if hasattr(a, "cause")
                                                    else a for a in e.actions])
            data = ev.encode(e)
        old.append((seq, subject, data))
    checked, diffs = verify(old)
    assert checked and diffs == []


def test_a_recorded_cause_that_differs_is_a_difference():
    again = [ev.StopReplica(replica="m-1", reason="model m was removed from the catalog",
                            cause=c(K.MODEL_REMOVED, model="m"))]
    recorded = [ev.StopReplica(replica="m-1", reason="model m was removed from the catalog",
                               cause=c(K.MODEL_REMOVED, model="n"))]
    assert as_recorded(again, recorded) != recorded


# --------------------------------------------------------------------------- metrics


def test_stops_and_restarts_are_counted_by_kind():
    from llmgw.control.metrics import ControlMetrics

    m = ControlMetrics(plane=None)  # (the state's gauges are read only when scraped)
    m.landed([
        ev.StopReplica(replica="a-1", reason="", cause=c(K.PREEMPTED, model="p", tier=2)),
        ev.StopReplica(replica="a-2", reason="", cause=c(K.PREEMPTED, model="p", tier=4)),
        ev.StopReplica(replica="a-3", reason="replaced: old words"),
        ev.StopStray(node="n", shard="s", generation=1, reason="", cause=c(K.NO_MODEL, model="x")),
        ev.RefuseRestart(replica="a-4", reason="", cause=c(K.REFUSE_FITS_NOWHERE, model="a")),
        ev.RestartReplica(replica="a-5", reason="", cause=ev.Cause(kind="from_the_future")),
    ])
    assert m.stops.labels("preempted")._value.get() == 2
    assert m.stops.labels("other")._value.get() == 1
    assert m.stops.labels("no_model")._value.get() == 1
    assert m.restarts.labels("refuse_fits_nowhere")._value.get() == 1
    assert m.restarts.labels("other")._value.get() == 1


# --------------------------------------------------------------------------- nobody reads the words back

ROOT = pathlib.Path(__file__).resolve().parents[1] / "llmgw"
# Attributes that hold a reason's words (on actions, victims, the state).
WORDY = {"reason", "why", "waiting", "parked", "restart_reason", "last_failure", "hold_reason"}
TEXT_METHODS = {"startswith", "endswith", "find", "rfind", "index", "rindex", "split", "rsplit", "partition",
                "rpartition", "count"}
# The renderer, and the one reader of logs recorded before kinds (waits.legacy_kind).
ALLOWED = {("core/contract/reasons.py", None), ("core/rules/waits.py", "legacy_kind")}


def _wordy(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in WORDY or isinstance(node, ast.Name) and node.id in WORDY


def _readers(tree: ast.AST) -> list[tuple[int, str | None]]:
    """(line, enclosing function) of each place that matches a reason's words."""
    out = []

    def visit(node: ast.AST, fn: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = node.name
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in TEXT_METHODS and _wordy(node.func.value):
                out.append((node.lineno, fn))
            if node.func.attr in ("search", "match", "fullmatch", "findall") and any(_wordy(a) for a in node.args):
                out.append((node.lineno, fn))
        if isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)) and _wordy(right):
                    out.append((node.lineno, fn))
        for child in ast.iter_child_nodes(node):
            visit(child, fn)

    visit(tree, None)
    return out


def test_no_code_outside_the_renderer_and_the_legacy_reader_matches_a_reason_s_words():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for line, fn in _readers(ast.parse(path.read_text(), str(path))):
            if (rel, None) not in ALLOWED and (rel, fn) not in ALLOWED:
                found.append(f"{rel}:{line} ({fn})")
    assert found == []


def test_the_check_finds_what_it_looks_for():
    src = (
        "def f(a, m):\n"
        "    if a.reason.startswith('no room'):\n"
        "        pass\n"
        "    return 'parked' in m.waiting or re.search('x', a.why)\n"
    )
    assert [line for line, _ in _readers(ast.parse(src))] == [2, 4, 4]
