"""`ctl apply --dry-run` over a real nats-server, with the control plane and
simulated agents as processes: the stream is left untouched, and what the
dry run says is what the control plane then decides when the same file is
applied for real (the same placement, the same victims). And `ctl get policy`."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmgw.bus.nats import NatsBus
from llmgw.core.contract import events as ev

from .conftest import run_llmgw
from .test_e2e_nats import live, wait_for

pytestmark = pytest.mark.nats

BASE = """\
policy:
  min_lifetime_s: 0
  hold_s: 5
owners:
  - name: research
    guarantee: {gpus: 4}
  - name: product
    guarantee: {gpus: 4}
models:
  - name: batch
    owner: research
    priority: opportunistic
    min_replicas: 8
    drain_grace_s: 0
    profiles:
      - name: one
        gpus: 1
"""
JUDGE = """\
  - name: judge
    owner: product
    priority: critical
    drain_grace_s: 0
    profiles:
      - name: pair
        gpus: 2
"""


def last_seq(url: str) -> int:
    async def go():
        bus = await NatsBus.connect(url)
        try:
            return await bus.last_seq()
        finally:
            await bus.close()

    return asyncio.run(go())


def test_a_dry_run_publishes_nothing_and_says_what_applying_then_does(nats_server, processes, tmp_path):
    url = nats_server.url
    processes.start("control", "control", "--nats", url, "--state-dir", str(tmp_path / "state"))
    for name, rack in (("gpu-1", "r1"), ("gpu-2", "r2")):
        processes.start(name, "agent", "--simulate", "--name", name, "--gpus", "4", "--ready-after", "0.2",
                        f"--label=llmgw.io/rack={rack}", "--nats", url)
    wait_for(url, lambda s: len(s.nodes) == 2)
    base, full = tmp_path / "base.yaml", tmp_path / "full.yaml"
    base.write_text(BASE)
    full.write_text(BASE + JUDGE)
    out = run_llmgw("ctl", "--nats", url, "apply", "-f", str(base))
    assert out.returncode == 0, out.stderr
    wait_for(url, lambda s: sum(r.model == "batch" and r.state == "ready" for r in s.replicas.values()) == 8)

    policy = run_llmgw("ctl", "--nats", url, "get", "policy", "-o", "json")
    assert policy.returncode == 0, policy.stderr
    rows = {r["field"]: r for r in json.loads(policy.stdout)}
    assert rows["min_lifetime_s"]["value"] == 0 and rows["min_lifetime_s"]["default"] == 120
    assert rows["max_victims"]["value"] == 3 and rows["hold_s"]["value"] == 5

    before = last_seq(url)
    text = run_llmgw("ctl", "--nats", url, "apply", "-f", str(full), "--dry-run")
    assert text.returncode == 0, text.stderr
    assert "nothing is published" in text.stdout and "model judge created" in text.stdout
    assert "policy configured" not in text.stdout  # unchanged: not in the diff
    dry = run_llmgw("ctl", "--nats", url, "apply", "-f", str(full), "--dry-run", "-o", "json")
    assert dry.returncode == 0, dry.stderr
    assert last_seq(url) == before  # the stream untouched
    report = json.loads(dry.stdout)
    assert report["basis"] == before
    assert [c["name"] for c in report["changes"]] == ["judge"]
    assert {"field": "priority", "before": None, "after": "critical"} in report["changes"][0]["fields"]
    pre = next(h for h in report["happenings"] if h["kind"] == "preempt")
    place = next(h for h in report["happenings"] if h["kind"] == "place" and h["model"] == "judge")
    assert report["settled"]

    # A facility hold, dry: the batch replicas on rack r1 have nowhere to go
    # (the fleet is full), so they stay, and nothing is published.
    hold = run_llmgw("ctl", "--nats", url, "facility", "hold", "rack/r1", "--drain", "--dry-run", "-o", "json")
    assert hold.returncode == 0, hold.stderr
    assert json.loads(hold.stdout)["basis"] == before
    release = run_llmgw("ctl", "--nats", url, "facility", "release", "rack/r1", "--dry-run")
    assert release.returncode == 1 and "not held" in release.stderr  # NOT_FOUND: it is not held
    assert last_seq(url) == before

    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE.replace("hold_s: 5", "hold_secs: 5"))
    refused = run_llmgw("ctl", "--nats", url, "apply", "-f", str(bad), "--dry-run")
    assert refused.returncode == 2 and f"{bad}:3: policy.hold_secs" in refused.stderr
    assert last_seq(url) == before

    out = run_llmgw("ctl", "--nats", url, "apply", "-f", str(full))
    assert out.returncode == 0, out.stderr
    wait_for(url, lambda s: any(r.model == "judge" and r.state == "ready" for r in s.replicas.values()))
    _, records = live(url)
    decided = [a for seq, _, data in records if seq > before for e in [ev.decode(data)] if type(e) is ev.Decided
               for a in e.actions]
    real_pre = next(a for a in decided if type(a) is ev.Preempt)
    real_place = next(a for a in decided if type(a) is ev.PlaceReplica and a.model == "judge")
    assert [(v["replica"], v["tier"]) for v in pre["victims"]] == [(v.replica, v.tier) for v in real_pre.victims]
    assert place["replica"] == real_place.replica
    assert place["shards"] == [f"{s.node}:{'+'.join(map(str, s.gpus))}" for s in real_place.shards]
