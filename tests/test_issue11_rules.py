"""Scenario tests of the rules issue 11 found missing: events in, decisions
out, through the real fold (tests/scenario.py), one rule each.

- A shard that stopped while nobody asked its replica to stop fails the
  replica, which is replaced: a rerun of `llmgw up` (its agent stopped the
  engine on Ctrl-C and reported it) served again.
- A restart that comes with a shortfall waits while room is being made for
  its model (a preemption) and while its model's other replicas come up,
  rather than stopping the only serving replica "in place".
- Of equally idle victims the smallest goes first: GPUs, then CPU cores,
  then host memory.
- A model whose victims are within their minimum lifetime says so, and from
  when they may give way.
"""

from __future__ import annotations

from llmgw.core.contract import events as ev
from llmgw.core.rules.decide import Outcome
from llmgw.core.rules.preempt import MIN_LIFETIME_S
from llmgw.core.contract.times import utc

from .scenario import Fleet
from .scenario import model as _model
from .test_preemption import age, placed, stops, up, victims


def model(name: str, *, gpus: int = 1, cpu_cores: int = 0, memory_gb: float = 0.0, **kw) -> ev.ModelSpec:
    """A model of one profile that asks for GPUs, CPU cores and host memory."""
    return _model(name, profiles=[ev.ProfileSpec(name="default", gpus=gpus, cpu_cores=cpu_cores, memory_gb=memory_gb)],
                  **kw)


def test_a_replica_whose_shard_stopped_unasked_is_replaced_not_left_placing():
    # `llmgw up`, Ctrl-C: the agent stopped its engine and said so; the rerun's
    # agent registers with nothing running. The replica read "placing" for ever.
    f = Fleet()
    f.register("a", gpus=0, cpu_cores=4)
    f.apply(model("m", gpus=0, cpu_cores=1))
    up(f)
    assert f.ready("m") == ["m-1"]
    f.report("m-1.0", "stopped", reason="the agent stopped, and stops its engines with it")
    assert f.state.replicas["m-1"].state == "failed"
    assert "stopped unasked" in f.state.replicas["m-1"].reason
    f.register("a", gpus=0, cpu_cores=4)  # the rerun: nothing runs there
    actions = f.decide()
    assert stops(actions) == ["m-1"] and placed(actions) == ["m-2"]
    f.make_ready()
    assert f.ready("m") == ["m-2"]
    # Not a start failure: it had served.
    assert f.state.models["m"].start_failures == 0


def test_a_stop_the_control_plane_asked_for_is_not_a_failure():
    f = Fleet()
    f.register("a", gpus=1)
    f.apply(model("m"))
    up(f)
    f.remove("m")
    f.decide()
    f.stopped("m-1")
    assert "m-1" not in f.state.replicas


def _restart_with_a_shortfall() -> Fleet:
    """One node of 2 GPUs; a critical model m (min 1) and an opportunistic
    batch (min 1), 1 GPU each, both ready; then one edit changes m's
    profile and raises its minimum to 2 (the incident of issue 11)."""
    f = Fleet()
    f.register("a", gpus=2)
    f.apply(model("m", priority="critical"))
    f.apply(model("batch", priority="opportunistic"))
    up(f)
    assert f.ready("m") == ["m-1"] and f.ready("batch") == ["batch-1"]
    age(f)
    changed = _model("m", min_replicas=2, priority="critical", profiles=[ev.ProfileSpec(name="default", args=["--new"])])
    f.apply(changed)
    return f


def test_a_restart_with_a_shortfall_waits_for_the_victim_instead_of_stopping_the_only_replica():
    f = _restart_with_a_shortfall()
    actions = f.decide()
    assert victims(actions) == [("batch-1", 4)]  # a lower class's minimum
    assert stops(actions) == ["batch-1"], "m-1 was stopped in place while room was being made for m"
    assert f.state.replicas["m-1"].restart == "replacing"
    assert f.ready("m") == ["m-1"]
    # While the victim drains: m waits for it, m-1 still serves.
    actions = f.decide()
    assert stops(actions) == [] and f.ready("m") == ["m-1"]
    f.stopped("batch-1")
    # The room is freed: the replacement goes there, beside m-1.
    actions = f.decide()
    assert placed(actions) == ["m-2"] and stops(actions) == []
    f.make_ready()
    # m-2 serves: now m-1 is the only thing in the way of m's second replica.
    actions = f.decide()
    assert stops(actions) == ["m-1"] and placed(actions) == ["m-3"]
    assert f.ready("m") == ["m-2"]  # never none
    f.stopped("m-1")
    f.make_ready()
    assert f.ready("m") == ["m-2", "m-3"]


def test_the_outcome_of_a_pass_is_a_typed_value():
    assert {o.value for o in Outcome} == {"enough", "placed", "no room", "over limit", "not tried", "preempting"}


def test_of_equally_idle_victims_the_one_with_fewer_cores_goes_first():
    # The seed's note: the choice between a 1-core and a 4-core replica. On
    # CPU-only nodes every victim has 0 GPUs: cores are what tells them apart.
    f = Fleet()
    f.register("a", gpus=0, cpu_cores=5)
    f.apply(model("big", gpus=0, cpu_cores=4, priority="opportunistic"))
    f.apply(model("small", gpus=0, cpu_cores=1, priority="opportunistic"))
    up(f)
    age(f)
    f.apply(model("urgent", gpus=0, cpu_cores=1, priority="critical"))
    actions = f.decide()
    assert victims(actions) == [("small-1", 4)]


def test_of_victims_alike_in_gpus_and_cores_the_one_with_less_memory_goes_first():
    f = Fleet()
    f.register("a", gpus=2, memory_gb=64.0)
    f.apply(model("heavy", gpus=1, memory_gb=40.0, priority="opportunistic"))
    f.apply(model("light", gpus=1, memory_gb=8.0, priority="opportunistic"))
    up(f)
    age(f)
    f.apply(model("urgent", gpus=1, priority="critical"))
    assert victims(f.decide()) == [("light-1", 4)]


def test_a_model_whose_victims_are_too_young_says_so_and_from_when():
    f = Fleet()
    f.register("a", gpus=1)
    f.apply(model("batch", priority="opportunistic"))
    up(f)
    ready_at = f.state.replicas["batch-1"].ready_at
    f.apply(model("urgent", priority="critical"))
    actions = f.decide()
    assert victims(actions) == []
    why = f.state.models["urgent"].waiting
    assert "batch-1" in why and f"{MIN_LIFETIME_S:g}s" in why, why
    assert utc(ready_at + MIN_LIFETIME_S) in why, why
    # The reason names a moment, not a countdown: the next pass says nothing new.
    assert not [a for a in f.decide() if isinstance(a, ev.ModelWaiting)]
    age(f)
    assert victims(f.decide()) == [("batch-1", 4)]
