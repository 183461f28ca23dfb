"""The facility end to end (issue 14), through `llmgw up` over a real
nats-server with simulated agents in racks and PDUs, every step through
`llmgw ctl`: a node labeled, `get nodes` by domain, a catalog whose power
cap binds, `ctl facility`, a hold with --drain that moves what has room
elsewhere (its replacement first) and leaves, with its reason, what has
none, and the release."""

from __future__ import annotations

import json
import time

import pytest

from .test_ctl_e2e import Up, ctl

pytestmark = pytest.mark.nats

CATALOG = """\
facility:
  budgets:
    pdu/pb: 600
models:
  - name: chat
    min_replicas: 4
    profiles:
      - name: one
        gpus: 1
"""


def replicas(up: Up) -> list[dict]:
    out = ctl(up, "get", "replicas", "-o", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def until(check, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"not in time: {what}"
        time.sleep(0.3)


def test_label_cap_hold_drain_and_release_through_ctl(tmp_path, processes):
    up = Up(tmp_path)
    try:
        racks = {"gpu-1": ("r1", "pa"), "gpu-2": ("r1", "pa"), "gpu-3": ("r2", "pb"), "gpu-4": None}
        for n, where in racks.items():
            labels = [f"--label=llmgw.io/rack={where[0]}", f"--label=llmgw.io/pdu={where[1]}"] if where else []
            # Each GPU limited to 500 W (its derived draw), measured at 300 W once in use.
            processes.start(n, "agent", "--simulate", "--name", n, "--gpus", "2", "--nats", up.url, "--gpu-power", "500",
                            "--watts-per-gpu", "300", "--power-interval", "0.2", *labels, env=up.env)
        until(lambda: len(json.loads(ctl(up, "get", "nodes", "-o", "json").stdout or "[]")) == 4, "four nodes")

        # Label: the operator's location, in the log, shown and selectable.
        out = ctl(up, "label", "gpu-4", "rack=r3", "pdu=pc")
        assert out.returncode == 0, out.stderr
        assert "node gpu-4 labeled rack=r3 pdu=pc" in out.stdout
        out = ctl(up, "get", "nodes", "--domain", "rack/r3", "-o", "name")
        assert out.stdout.split() == ["node/gpu-4"], out.stdout + out.stderr
        table = ctl(up, "get", "nodes").stdout
        assert "LOCATION" in table and "rack=r3,pdu=pc" in table and "rack=r1,pdu=pa" in table
        out = ctl(up, "label", "gpu-4", "cabinet=c1")
        assert out.returncode == 2 and "not a location" in out.stderr

        # A cap that binds: pdu/pb (gpu-3) has room for one 500 W shard, not two.
        catalog = tmp_path / "catalog.yaml"
        catalog.write_text(CATALOG)
        out = ctl(up, "apply", "-f", str(catalog), "--wait", "--timeout", "60")
        assert out.returncode == 0, out.stderr
        assert "facility configured: 1 power cap(s)" in out.stdout
        where = sorted(r["nodes"][0] for r in replicas(up))
        assert where.count("gpu-3") == 1 and len(where) == 4, where
        out = ctl(up, "explain-placement", "chat")
        assert "gpu-3: pdu/pb would draw" in out.stdout and "of 600 W" in out.stdout, out.stdout
        out = ctl(up, "facility", "-o", "json")
        rows = {r["domain"]: r for r in json.loads(out.stdout)}
        assert rows["pdu/pb"]["cap_w"] == 600 and rows["pdu/pb"]["nodes"] == 1
        assert rows["rack/r1"]["nodes"] == 2 and rows["rack/r3"]["nodes"] == 1
        # Measured once ready: 300 W on gpu-3's one GPU in use.
        until(lambda: any(r["domain"] == "pdu/pb" and r["draw_w"] == 300
                          for r in json.loads(ctl(up, "facility", "-o", "json").stdout)), "gpu-3's measured draw")

        # Hold rack/r1 with --drain: gpu-4 has room for one of its two
        # replicas; the other has nowhere to go (gpu-3's PDU is capped) and stays.
        on_r1 = sorted(r["id"] for r in replicas(up) if r["nodes"][0] in ("gpu-1", "gpu-2"))
        assert len(on_r1) == 2
        out = ctl(up, "facility", "hold", "rack/r1", "--drain", "--reason", "maintenance", "--wait", "--timeout", "60")
        assert out.returncode == 0, out.stderr
        assert "rack/r1 held" in out.stdout
        reps = replicas(up)
        ready = [r for r in reps if r["state"] == "ready"]
        assert len(ready) == 4, reps  # never below desired: replaced beside, then stopped
        stays = [r for r in reps if r["restart"].startswith("refused")]
        assert len(stays) == 1 and stays[0]["id"] in on_r1
        assert "rack/r1 is held for draining: maintenance" in stays[0]["restart_reason"]
        moved = [r for r in reps if r["nodes"][0] == "gpu-4" and r["id"] not in on_r1]
        assert moved
        # What its placement met on the way: gpu-3's PDU at its cap.
        page = ctl(up, "describe", "replica", moved[-1]["id"]).stdout
        assert "Rejections: pdu/pb would draw" in page, page
        listing = ctl(up, "facility").stdout
        assert "rack/r1" in listing and "drain since" in listing and "maintenance" in listing

        # Released: placement may use it again.
        out = ctl(up, "facility", "release", "rack/r1")
        assert out.returncode == 0, out.stderr
        rows = {r["domain"]: r for r in json.loads(ctl(up, "facility", "-o", "json").stdout)}
        assert not rows["rack/r1"]["held"]
        out = ctl(up, "facility", "release", "rack/r1")
        assert out.returncode != 0 and "is not held" in out.stderr
    finally:
        up.stop()
