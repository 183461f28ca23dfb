"""What-if, without NATS: policy as data, `ctl apply --dry-run`'s core
(core/simulation/whatif.py) and `llmgw replay --what-if` (core/simulation/redecide.py) on the
recorded logs of events/logs/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from llmgw.core.contract import events as ev
from llmgw.core.folding.fold import apply, evolve
from llmgw.core.contract.policy import DEFAULT, FIELDS, Policy
from llmgw.core.simulation.redecide import Plan, what_if
from llmgw.core.folding.state import State
from llmgw.core.simulation.whatif import Sim, Timing, dry_run, field_changes
from llmgw.ctl.catalog_file import CatalogError, items, load_catalog
from llmgw.replay import logfile
from llmgw.replay.whatif import plan_of

from .conftest import REPO

LOGS = REPO / "events" / "logs"
CONTENTION = LOGS / "contention.jsonl"
CATALOG = LOGS / "contention.catalog.yaml"
RECORDED_LIFETIME = 10.0  # the recorded catalog's policy.min_lifetime_s


def records():
    return logfile.read(CONTENTION)


def variant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = CATALOG.read_text()
    assert old in text
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return path


def plan(path: Path) -> Plan:
    return plan_of(load_catalog(path))


# --------------------------------------------------------------------------- policy as data


def test_the_policy_defaults_are_the_rules_constants_as_they_were():
    from llmgw.core.rules import decide, preempt, scaling

    assert (DEFAULT.min_lifetime_s, DEFAULT.hold_s, DEFAULT.eviction_grace_s, DEFAULT.max_victims) == (
        preempt.MIN_LIFETIME_S, preempt.HOLD_S, preempt.EVICTION_GRACE_S, preempt.MAX_VICTIMS) == (120.0, 120.0, 300.0, 3)
    assert (DEFAULT.backoff_first_s, DEFAULT.backoff_max_s, DEFAULT.park_after) == (
        scaling.BACKOFF_FIRST_S, scaling.BACKOFF_MAX_S, scaling.PARK_AFTER) == (5.0, 300.0, 5)
    assert DEFAULT.adopt_wait_s == decide.ADOPT_WAIT_S == 120.0
    assert DEFAULT.restart_max_surge == 1


def test_a_policy_is_folded_and_a_bad_one_quarantined():
    state = State()
    good = ev.PolicyApplied(at=1.0, policy=Policy(min_lifetime_s=30.0, max_victims=1))
    apply(state, 1, ev.subject_for(good), ev.encode(good))
    assert state.policy.min_lifetime_s == 30.0 and state.policy.max_victims == 1 and state.policy.hold_s == 120.0
    bad = ev.PolicyApplied(at=2.0, policy=Policy(park_after=0))
    apply(state, 2, ev.subject_for(bad), ev.encode(bad))
    assert state.quarantine_count == 1 and "park_after" in state.quarantined[0].error
    assert state.policy.max_victims == 1  # the good one stands
    # Only an operator may say it.
    apply(state, 3, "llmgw.agent.n1.policy.applied", ev.encode(good))
    assert state.quarantine_count == 2


def test_the_rules_read_the_policy_from_the_state():
    """A smaller max_victims: a model that needs three victims gets none."""
    state = State()
    sim = Sim(state, Timing(fixed=0.0))
    sim.fold(ev.NodeRegistered(at=0, node="n1", gpus=[ev.Gpu(index=i) for i in range(3)]))
    sim.fold(ev.ModelApplied(at=0, model=ev.ModelSpec(name="low", priority="opportunistic", min_replicas=3,
                                                       profiles=[ev.ProfileSpec(name="p")])))
    for t in range(3):
        sim.decide_pass(float(t))
        sim.advance(float(t) + 0.5)
    sim.fold(ev.ModelApplied(at=500, model=ev.ModelSpec(name="big", priority="critical",
                                                         profiles=[ev.ProfileSpec(name="p", gpus=3)])))
    copy = msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=State)
    acts = sim.decide_pass(500.0)
    assert any(type(a) is ev.Preempt and len(a.victims) == 3 for a in acts)
    evolve(copy, ev.PolicyApplied(at=500, policy=Policy(max_victims=2)))
    from llmgw.core.rules.decide import decide

    assert not any(type(a) is ev.Preempt for a in decide(copy, 500.0))


def test_a_catalog_files_policy_section_is_checked_by_file_line_and_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  min_lifetime_s: 30\n  max_victim: 2\n")
    with pytest.raises(CatalogError) as e:
        load_catalog(path)
    assert f"{path}:3: policy.max_victim" in str(e.value) and "max_victims" in str(e.value)
    path.write_text("policy:\n  hold_s: -1\n")
    with pytest.raises(CatalogError) as e:
        load_catalog(path)
    assert f"{path}:2: policy.hold_s" in str(e.value)
    path.write_text("policy:\n  min_lifetime_s: 30\n")
    catalog = load_catalog(path)
    assert catalog.policy == Policy(min_lifetime_s=30.0) and catalog.given == ("policy",)
    assert set(FIELDS) == set(msgspec.structs.asdict(Policy()))


def test_apply_publishes_the_policy_first_and_only_when_it_changed():
    catalog = load_catalog(CATALOG)
    got = items(State(), catalog)
    assert [(i.kind, i.name) for i in got][:3] == [("policy", ""), ("owner", "research"), ("owner", "product")]
    assert all(i.event is not None for i in got)
    state = State()
    for i in got:
        evolve(state, i.event)
    assert all(i.event is None for i in items(state, catalog))  # applied again: nothing changes


def test_field_changes_say_before_and_after():
    a = ev.ModelSpec(name="m", min_replicas=3, profiles=[ev.ProfileSpec(name="p", gpus=2)])
    b = ev.ModelSpec(name="m", min_replicas=1, profiles=[ev.ProfileSpec(name="p", gpus=2), ev.ProfileSpec(name="q")])
    changes = {c.field: (c.before, c.after) for c in field_changes(a, b)}
    assert changes["min_replicas"] == (3, 1)
    assert changes["profiles.q"] == (None, "(defined)") and changes["profiles.q.gpus"] == (None, 1)
    assert "profiles.p.gpus" not in changes
    assert {c.field: c.after for c in field_changes(Policy(), Policy(hold_s=5.0))} == {"hold_s": 5.0}


# --------------------------------------------------------------------------- replay --what-if


@pytest.mark.parametrize("log", sorted(LOGS.glob("*.jsonl")), ids=lambda p: p.name)
def test_a_what_if_under_the_recorded_catalog_reports_no_difference(log, tmp_path):
    if log == CONTENTION:
        file = CATALOG
    else:  # a log whose catalog changed as it went: its policy alone (the default it ran under)
        file = tmp_path / "policy.yaml"
        file.write_text("policy:\n  min_lifetime_s: 120\n")
    report = what_if(logfile.read(log), plan(file))
    assert report.diverged is None
    assert report.same, [r for r in report.models if r.recorded != r.what_if]
    assert report.followed == report.passes > 0


def test_a_smaller_minimum_lifetime_makes_the_critical_model_ready_earlier_by_what_the_rule_predicts(tmp_path):
    short = variant(tmp_path, "short.yaml", "min_lifetime_s: 10", "min_lifetime_s: 4")
    recs = records()
    report = what_if(recs, plan(short))
    judge = next(r for r in report.models if r.model == "judge")
    earlier = judge.recorded.first_ready_s - judge.what_if.first_ready_s
    # The rule: the victims may be preempted 10 - 4 = 6 s sooner after they
    # became ready. On top of it, what the recorded control plane took to
    # see the deadline pass and to place (its passes are a tick apart), which
    # the what-if, deciding at the deadline, does not.
    lag = _recorded_lag(recs)
    assert 0 <= lag < 1.0
    assert 6.0 - 0.05 <= earlier <= 6.0 + lag + 0.2, (earlier, lag)
    assert judge.what_if.waiting_s < judge.recorded.waiting_s - 5.0
    batch = next(r for r in report.models if r.model == "batch")
    assert batch.recorded.preempted == batch.what_if.preempted == 2  # the same victims, sooner
    d = report.diverged
    assert d is not None and "less than 10s ago" in d.recorded[0] and "less than 4s ago" in d.what_if[0]
    assert not report.same


def _recorded_lag(recs) -> float:
    """From the recorded log: the preemption's time less the victims' last ready time plus the lifetime."""
    state = State()
    for seq, subject, data in recs:
        e = ev.decode(data)
        if type(e) is ev.Decided and any(type(a) is ev.Preempt for a in e.actions):
            p = next(a for a in e.actions if type(a) is ev.Preempt)
            ready = max(state.replicas[v.replica].ready_at for v in p.victims)
            return e.at - (ready + RECORDED_LIFETIME)
        apply(state, seq, subject, data)
    raise AssertionError("no preemption in the log")


def test_a_model_removed_is_never_placed_and_the_gpus_it_held_are_free(tmp_path):
    text = CATALOG.read_text()
    without = tmp_path / "no-batch.yaml"
    without.write_text(text[: text.index("  - name: batch")] + text[text.index("  - name: judge"):])
    report = what_if(records(), plan(without))
    batch = next(r for r in report.models if r.model == "batch")
    assert batch.recorded.placed == 8 and batch.what_if.placed == 0
    assert batch.what_if.gpu_hours == 0 and batch.what_if.gpus_at_end == 0 and batch.what_if.first_ready_s is None
    held = batch.recorded.gpus_at_end
    assert held == 6
    # Its GPUs are free, but for what the judge's restart holds beside itself at the end.
    judge = next(r for r in report.models if r.model == "judge")
    recorded_free, what_if_free = report.gpus_free_at_end
    assert what_if_free == recorded_free + held - (judge.what_if.gpus_at_end - judge.recorded.gpus_at_end)
    assert judge.what_if.waiting_s == 0  # nothing in its way: never waited


def test_the_report_is_the_same_byte_for_byte(tmp_path):
    short = variant(tmp_path, "short.yaml", "min_lifetime_s: 10", "min_lifetime_s: 4")
    outs = []
    for _ in range(2):
        for flag in ([], ["--json"]):
            out = subprocess.run([sys.executable, "-m", "llmgw", "replay", str(CONTENTION), "--what-if", str(short), *flag],
                                 capture_output=True, timeout=120)
            assert out.returncode == 5, out.stderr  # something differs
            outs.append(out.stdout)
    assert outs[0] == outs[2] and outs[1] == outs[3]
    data = json.loads(outs[1])
    assert data["diverged"]["what_if"] and not data["same"]
    same = subprocess.run([sys.executable, "-m", "llmgw", "replay", str(CONTENTION), "--what-if", str(CATALOG)],
                          capture_output=True, text=True, timeout=120)
    assert same.returncode == 0 and "no difference" in same.stdout


def test_what_if_a_window_and_a_bad_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy:\n  min_lifetme_s: 3\n")
    out = subprocess.run([sys.executable, "-m", "llmgw", "replay", str(CONTENTION), "--what-if", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and f"{bad}:2: policy.min_lifetme_s" in out.stderr
    report = what_if(records(), plan(CATALOG), ("seq", 33), ("seq", 42))
    assert (report.first_seq, report.last_seq, report.events) == (33, 42, 10)
    assert report.same


# --------------------------------------------------------------------------- dry run, in the core


def test_a_dry_run_predicts_what_the_control_plane_then_decided():
    """Folded to just before the judge was applied, a dry run of that
    event says what the recorded control plane then did: the wait for the
    victims' minimum lifetime, the same victims of the same tiers, the same
    placement."""
    recs = records()
    state = State()
    for seq, subject, data in recs:
        e = ev.decode(data)
        if type(e) is ev.ModelApplied and e.model.name == "judge":
            applied = e
            break
        apply(state, seq, subject, data)
    before = msgspec.msgpack.encode(state)
    report = dry_run(state, [applied], applied.at)
    assert msgspec.msgpack.encode(state) == before  # left as it was
    recorded = [a for _, _, d in recs for e in [ev.decode(d)] if type(e) is ev.Decided for a in e.actions]
    rec_pre = next(a for a in recorded if type(a) is ev.Preempt)
    rec_place = next(a for a in recorded if type(a) is ev.PlaceReplica and a.model == "judge")
    pre = next(h for h in report.happenings if h.kind == "preempt")
    assert [(v.replica, v.tier) for v in pre.victims] == [(v.replica, v.tier) for v in rec_pre.victims]
    place = next(h for h in report.happenings if h.kind == "place" and h.model == "judge")
    assert place.shards == [f"{s.node}:{'+'.join(map(str, s.gpus))}" for s in rec_place.shards]
    assert report.happenings[0].kind == "wait" and "less than 10s ago" in report.happenings[0].reason
    ready = state.replicas[pre.victims[-1].replica].ready_at
    assert pre.after_s == pytest.approx(ready + RECORDED_LIFETIME - applied.at, abs=1e-3)
    assert any(h.kind == "ready" and h.model == "judge" for h in report.happenings)
    assert report.settled
    judge = next(m for m in report.models if m.model == "judge")
    assert (judge.ready_before, judge.ready_after) == (0, 1)


def test_a_dry_run_of_a_restart_says_in_which_order():
    recs = records()
    state = State()
    for seq, subject, data in recs:
        e = ev.decode(data)
        if type(e) is ev.ReplicasRestart:
            asked = e
            break
        apply(state, seq, subject, data)
    report = dry_run(state, [asked], asked.at)
    kinds = [(h.kind, h.replica) for h in report.happenings if h.kind in ("restart", "stop", "place", "ready")]
    assert kinds[:3] == [("restart", "judge-1"), ("stop", "judge-1"), ("place", "judge-2")]
    assert ("ready", "judge-2") in kinds


def test_a_dry_run_of_a_facility_hold_with_drain_moves_what_runs_there_first():
    """What `ctl facility hold DOMAIN --drain --dry-run` folds: its
    DomainHeld, as any other command's events."""
    state = State()
    sim = Sim(state, Timing(fixed=1.0))
    for node, rack in (("n1", "r1"), ("n2", "r2")):
        sim.fold(ev.NodeRegistered(at=0, node=node, gpus=[ev.Gpu(index=i) for i in range(4)],
                                   labels={"llmgw.io/rack": rack}))
    sim.fold(ev.ModelApplied(at=0, model=ev.ModelSpec(name="m", min_replicas=2, profiles=[ev.ProfileSpec(name="p")])))
    for t in range(3):
        sim.decide_pass(float(t))
        sim.advance(float(t) + 1.5)
    on = {r.id: r.shards[0].node for r in state.replicas.values()}
    assert sorted(on.values()) == ["n1", "n2"]  # spread over the racks
    report = dry_run(state, [ev.DomainHeld(at=0.0, domain="rack/r1", drain=True, reason="PDU swap")], 10.0)
    moved = next(rid for rid, node in on.items() if node == "n1")
    places = [h for h in report.happenings if h.kind == "place"]
    stops = [h for h in report.happenings if h.kind == "stop"]
    assert places and all(s.startswith("n2:") for h in places for s in h.shards)
    assert [h.replica for h in stops] == [moved]
    assert report.happenings.index(places[0]) < report.happenings.index(stops[0])  # replaced first
    assert report.settled and {m.model: m.ready_after for m in report.models} == {"m": 2}
