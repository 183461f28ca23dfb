"""The console's plots and timelines (llmgw/console/series.py), without a
browser: a fleet run through the real core (tests/scenario.py), recorded as
the console records the log, and every value compared with what the fold
says at that time of the log (replay.tool.fold_until)."""

from __future__ import annotations

import math

from llmgw.console import series
from llmgw.core.contract import events as ev
from llmgw.core.rules.scaling import decided
from llmgw.core.folding.fold import apply
from llmgw.core.folding.state import LIVE_SHARD_STATES, State
from llmgw.replay.tool import fold_until

from .scenario import Fleet, model


def run() -> Fleet:
    f = Fleet()
    f.register("n1", gpus=4)
    f.register("n2", gpus=4)
    f.publish(ev.OwnerApplied(at=f.tick(), name="org/a", guarantee=ev.Resources(gpus=4)))
    f.apply(model("a", min_replicas=2, gpus=1, owner="org/a"))
    f.apply(model("b", min_replicas=1, gpus=2, owner="org/b"))
    f.decide()
    f.make_ready()
    f.decide()
    for i in range(3):  # a gateway's reports: requests, tokens, cached prompt tokens, time to first byte
        f.publish(ev.ModelLoad(at=f.tick(), gateway="gw-1", model="a", in_flight=1 + i, queued=i, last_used=f.now,
                               requests=10 * (i + 1), tokens_in=100, tokens_out=50, tokens_cached=25 * i,
                               ttft_p50=0.1 * (i + 1), ttft_p90=0.2 * (i + 1)))
    f.load("a")  # and back to nothing
    f.lose("n1")  # what ran there fails, and is placed again
    f.decide()
    f.make_ready()
    f.decide()
    f.apply(model("a", min_replicas=1, gpus=1, owner="org/a"))  # one fewer: one is drained
    f.decide()
    for rep in [r for r in f.state.replicas.values() if r.state == "stopping"]:
        f.stopped(rep.id)
    f.decide()
    return f


def gpus_of_owners(state) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in state.replicas.values():
        owner = r.owner or state.models[r.model].spec.owner if r.model in state.models else r.owner
        held = sum(len(s.gpus) for s in r.shards if s.state in LIVE_SHARD_STATES)
        if held:
            out[owner or series.NO_OWNER] = out.get(owner or series.NO_OWNER, 0) + held
    return out


def test_every_step_series_is_what_the_fold_says_at_every_time_of_the_log():
    f = run()
    state, rec = series.record(f.log)
    assert state.seq == f.state.seq
    times = sorted({ev.decode(d).at for _, _, d in f.log})
    assert len(times) > 20
    for t in times:
        then = fold_until(f.log, ("time", t))
        for name in ("a", "b"):
            ready = sum(1 for r in then.replicas.values() if r.model == name and r.state == "ready")
            assert rec.ready[name].at(t) == ready, (name, t)
            wanted = decided(then.models[name]) if name in then.models else 0
            assert rec.desired[name].at(t) == wanted, (name, t)
        owners = gpus_of_owners(then)
        for owner in set(owners) | set(rec.owner_gpus):
            assert rec.owner_gpus[owner].at(t) == owners.get(owner, 0), (owner, t)
        for node in ("n1", "n2"):  # what each GPU held then
            held = {g: seg.replica for g, segs in rec.segments.get(node, {}).items()
                    for seg in segs if seg.start <= t < seg.end}
            used = then.nodes[node].used if node in then.nodes else {}
            assert held == {g: shard.rpartition(".")[0] for g, shard in used.items()}, (node, t)
    assert max(rec.owner_gpus["org/a"].values) == 2 and max(rec.owner_gpus["org/b"].values) == 2


def test_the_plots_cut_any_window_into_buckets_of_the_log():
    f = run()
    _, rec = series.record(f.log)
    start, end = series.window(rec, None, None)
    assert (start, end) == (ev.decode(f.log[0][2]).at, ev.decode(f.log[-1][2]).at)
    p = series.plots(rec, "a", start, end, 10)
    assert len(p["x"]) == 11 and p["x"][0] == start and p["x"][-1] == end
    s = p["series"]
    then = fold_until(f.log, ("time", end))
    assert s["ready"][-1] == sum(1 for r in then.replicas.values() if r.model == "a" and r.state == "ready") == 1
    assert s["desired"][-1] == 1 and max(s["desired"]) == 2
    # The rates add up to what the gateway counted; the ratio and the percentiles are the reports'.
    width = p["step"]
    assert math.isclose(sum(r * width for r in s["requests_s"][1:]), 10 + 20 + 30, rel_tol=1e-3)
    assert math.isclose(sum(r * width for r in s["tokens_out_s"][1:]), 150, rel_tol=1e-3)
    hits = [h for h in s["prefix_hit"] if h is not None]
    assert hits and all(0 <= h <= 0.5 for h in hits)
    assert any(h > 0 for h in hits)
    p50 = [x for x in s["ttft_p50"] if x is not None]
    assert p50 and all(0.1 <= x <= 0.3 for x in p50)
    assert s["requests_s"][0] is None and s["prefix_hit"][0] is None  # x[0] is the window's start: no bucket
    # A window around the three reports alone: the prefix-hit ratio of the whole window.
    loads = [ev.decode(d) for _, _, d in f.log if b'"model.load"' in d]
    one = series.plots(rec, "a", loads[0].at - 0.5, loads[2].at, 1)["series"]
    assert one["prefix_hit"][1] == round((0 + 25 + 50) / 300, 4)
    assert one["ttft_p50"][1] == round((10 * 0.1 + 20 * 0.2 + 30 * 0.3) / 60, 4)
    assert one["queued"][1] == 2 and one["in_flight"][1] == 3
    # Owners' GPUs, every owner.
    assert set(p["owners"]) == {"org/a", "org/b"}
    # A model without load: zeros for rates, gaps for ratios.
    b = series.plots(rec, "b", start, end, 10)["series"]
    assert b["requests_s"][1:] == [0.0] * 10 and b["ttft_p50"][1:] == [None] * 10


def test_the_timeline_has_a_lane_per_model_with_each_reason():
    f = run()
    _, rec = series.record(f.log)
    start, end = series.window(rec, None, None)
    lanes = {lane["model"]: lane for lane in series.timeline(rec, start, end, ["a", "b"], 100, 1000)}
    marks = lanes["a"]["marks"]
    count = {k: sum(m["n"] for m in marks if m["kind"] == k) for k in ("placed", "ready", "drained", "failed")}
    places = [(seq, a) for seq, _, d in f.log if b'"control.decided"' in d for a in ev.decode(d).actions
              if isinstance(a, ev.PlaceReplica) and a.model == "a"]
    assert count["placed"] == len(places) >= 3
    # (drained: the replica scaled down, and those lost with n1)
    assert count["ready"] >= 3 and count["drained"] >= 1 and count["failed"] >= 1
    # One pass placed two of a: one mark of two, at that decision, with its reason once.
    first = next(m for m in marks if m["kind"] == "placed")
    same = [a for seq, a in places if seq == places[0][0]]
    assert first["n"] == len(same) == 2 and first["seq"] == places[0][0]
    assert first["replicas"] == [a.replica for a in same] and first["reasons"] == sorted({a.reason for a in same})
    assert set(first["nodes"]) == {s.node for a in same for s in a.shards}
    drained = [m for m in marks if m["kind"] == "drained"][-1]
    assert drained["reasons"] and drained["replicas"]
    # The window and the limit cut it.
    later = series.timeline(rec, drained["t"], end, ["a"], 100, 1000)[0]
    assert later["marks"][0]["kind"] == "drained"
    assert len(series.timeline(rec, start, end, ["a"], 2, 1000)[0]["marks"]) == 2
    # Coarser cells: one mark per kind, the last event of them, the first replicas named.
    one = series.timeline(rec, start, end, ["a"], 100, 1)[0]["marks"]
    assert sorted(m["kind"] for m in one) == ["drained", "failed", "placed", "ready"]
    assert next(m for m in one if m["kind"] == "placed")["seq"] == places[-1][0]
    assert len(series.timeline(rec, start, end, ["a"], 100, 1, named=1)[0]["marks"][0]["replicas"]) == 1


def test_a_preemption_is_on_the_victims_lane_with_its_reason():
    f = Fleet()
    f.register("n1", gpus=2)
    f.apply(model("low", min_replicas=1, gpus=2, priority="opportunistic"))
    f.decide()
    f.make_ready()
    f.publish(ev.PolicyApplied(at=f.tick(), policy=ev.Policy(min_lifetime_s=0)))
    f.apply(model("vip", min_replicas=1, gpus=2, priority="critical"))
    f.decide()
    _, rec = series.record(f.log)
    window = series.window(rec, None, None)
    lanes = {lane["model"]: lane for lane in series.timeline(rec, *window, ["low", "vip"], 100, 1000)}
    pre = [m for m in lanes["low"]["marks"] if m["kind"] == "preempted"]
    assert len(pre) == 1 and pre[0]["replicas"] == ["low-1"] and pre[0]["reasons"][0].startswith("for vip: ")


def test_a_quarantined_event_draws_nothing():
    f = Fleet()
    f.register("n1", gpus=2)
    f.apply(model("m", min_replicas=1))
    f.publish(ev.ModelLoad(at=f.tick(), gateway="gw-1", model="m", requests=5, tokens_in=10),
              subject="llmgw.gateway.someone-else.load")  # a gateway speaking for another: quarantined
    assert f.state.quarantine_count == 1
    _, rec = series.record(f.log)
    assert "m" not in rec.loads


def test_a_gpu_timeline_cuts_what_each_gpu_held_to_the_window():
    f = run()
    state, rec = series.record(f.log)
    start, end = series.window(rec, None, None)
    n2 = series.gpus(rec, state, "n2", start, end, 100)
    assert [g["index"] for g in n2] == [0, 1, 2, 3]
    segs = [s for g in n2 for s in g["segments"]]
    assert segs and all(start <= s["from"] <= s["to"] <= end for s in segs)
    running = {g: shard.rpartition(".")[0] for g, shard in state.nodes["n2"].used.items()}
    for g, rid in running.items():
        assert n2[g]["segments"][-1]["replica"] == rid and n2[g]["segments"][-1]["to"] == end
    assert series.gpus(rec, state, "nowhere", start, end, 100) == []


def test_the_consoles_routes_serve_windows_and_refuse_bad_input_clearly():
    import pytest

    from llmgw.console.server import Console, HttpError

    f = run()
    console = Console(None, None, "token")
    for record in f.log:
        console._on_message(*record)
    start, end = series.window(console.series, None, None)
    p = console.view("plots", {})
    assert p["model"] == "a" and p["models"] == ["a", "b"] and len(p["x"]) == 121 and not p["past"]
    assert p["series"]["ready"][-1] == 1 and (p["from"], p["to"]) == (start, end)
    mid = (start + end) / 2
    p = console.view("plots", {"model": "b", "from": str(mid), "to": str(end), "points": "4", "time": str(mid)})
    assert p["x"][0] == mid and len(p["x"]) == 5 and p["past"] and p["seq"] == series.seq_at(console.series, mid)
    assert p["at"] <= mid
    lanes = console.view("timeline", {"model": "a"})["lanes"]
    assert [lane["model"] for lane in lanes] == ["a"] and lanes[0]["marks"]
    assert len(console.view("timeline", {})["lanes"]) == 2
    assert [g["index"] for g in console.view("gpus/n2", {})["gpus"]] == [0, 1, 2, 3]
    for what, query, status, said in [
        ("plots", {"model": "nope"}, 404, "no model nope"),
        ("plots", {"from": "yesterday"}, 400, "from 'yesterday' is not Unix seconds"),
        ("plots", {"from": str(end), "to": str(start)}, 400, "is not before to"),
        ("plots", {"points": "0"}, 400, "points 0: give 1 to 2000"),
        ("plots", {"seq": "x"}, 400, "is not a sequence number"),
        ("timeline", {"model": "nope"}, 404, "no model nope"),
        ("gpus/nowhere", {}, 404, "no node nowhere"),
    ]:
        with pytest.raises(HttpError) as e:
            console.view(what, query)
        assert e.value.status == status and said in str(e.value), (what, query, str(e.value))


def test_a_time_of_the_log_is_its_last_event_at_or_before_it():
    f = run()
    bad = (len(f.log) + 1, "llmgw.ctl.x", b"not json")  # unreadable: quarantined by the fold, no time of its own
    _, rec = series.record([(0, "llmgw.ctl.x", b"{")] + f.log + [bad])
    times = [ev.decode(d).at for _, _, d in f.log]
    assert rec.first == times[0] and rec.t == times[-1]
    for i, t in enumerate(times):
        last = max(j for j, u in enumerate(times) if u <= t)
        assert series.seq_at(rec, t) == (f.log[last][0] if last < len(times) - 1 else bad[0]), i
    assert series.seq_at(rec, times[0] - 1) == 0  # before the log (the unreadable first event has no time)


def test_the_plots_show_a_models_tokens_per_owner_from_the_usage_reports():
    rec = series.Recorder()
    state = State()
    log = [
        ev.UsageReported(at=100.0, gateway="g1", since=40.0, rows=[
            ev.UsageRow(model="a", key="k1", owner="org/a", requests=2, tokens_in=30, tokens_out=10),
            ev.UsageRow(model="a", key="k2", owner="", requests=1, tokens_in=5, tokens_out=5),
            ev.UsageRow(model="b", key="k1", owner="org/a", requests=1, tokens_in=1000),
        ]),
        ev.UsageReported(at=160.0, gateway="g2", since=100.0, rows=[ev.UsageRow(model="a", owner="org/a", tokens_in=60)]),
    ]  # fmt: skip
    for seq, e in enumerate(log, 1):
        subject, data = ev.subject_for(e), ev.encode(e)
        apply(state, seq, subject, data)
        rec.observe(state, seq, subject, data)
    p = series.plots(rec, "a", 100.0, 160.0, 2)
    assert p["usage"] == {series.NO_OWNER: [None, round(10 / 30, 4), 0.0], "org/a": [None, round(40 / 30, 4), 2.0]}
    assert series.plots(rec, "c", 100.0, 160.0, 2)["usage"] == {}
