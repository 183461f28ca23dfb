"""The control plane's /metrics (llmgw/control/metrics.py), scraped over HTTP
from a real `llmgw up` (its own process, free ports), and the Grafana
dashboard under deploy/dashboards/ naming only metrics that exist."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.core.contract import events as ev
from llmgw.bus.server import free_port
from llmgw.control.metrics import WAITING_KINDS

from .conftest import run_llmgw
from .test_up import start_up, stop_up, tools_creds

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "deploy" / "dashboards"

CATALOG = """\
models:
  - name: small
    min_replicas: 2
    profiles:
      - name: one
        gpus: 1
        gpu_memory_gb: 24
  - name: huge
    min_replicas: 1
    profiles:
      - name: many
        gpus: 64
"""


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def wait_for(url: str, check, timeout: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout
    last: dict = {}
    while time.monotonic() < deadline:
        try:
            last = scrape(url)
        except OSError:  # the control plane not serving yet
            last = {}
        if last and check(last):
            return last
        time.sleep(0.5)
    raise AssertionError(f"/metrics never showed it; last scrape: {sorted(last.items())[:80]}")


def test_waiting_kinds_are_the_kinds_decide_says():
    from llmgw.core.folding.state import Model
    from llmgw.core.rules.waits import model_kind

    spec = ev.ModelSpec(name="m", profiles=[ev.ProfileSpec(name="p")])
    assert model_kind(Model(spec=spec)) == ""
    assert model_kind(Model(spec=spec, waiting="x", parked="parked: 5 replicas in a row failed")) == "parked"
    assert model_kind(Model(spec=spec, waiting="no room: tp4 needs 4 GPUs", waiting_kind="no_room")) == "no_room"
    assert model_kind(Model(spec=spec, waiting="no node is ready", waiting_kind="no_node")) == "no_node"
    assert model_kind(Model(spec=spec, waiting="something new", waiting_kind="a-kind-from-later")) == "other"
    assert set(WAITING_KINDS) >= {"parked", "no_room", "preempting", "over_limit", "held", "backing_off", "other"}


@pytest.mark.nats
@pytest.mark.timeout(300)
def test_up_serves_the_control_planes_metrics_and_they_follow_an_apply(tmp_path, processes):
    metrics_port = free_port()
    proc, lines = start_up(tmp_path, free_port(), extra=("--no-agent", "--no-demo", "--no-gateway", "--metrics-port", str(metrics_port)))
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        assert f"control plane metrics (Prometheus): {url}" in "".join(lines)
        before = wait_for(url, lambda m: ("llmgw_control_leading", ()) in m and m[("llmgw_control_leading", ())] == 1)
        assert before[("llmgw_control_replicas", (("state", "ready"),))] == 0
        assert before[("llmgw_control_nodes", (("state", "ready"),))] == 0
        assert before.get(("llmgw_control_decisions_total", (("kind", "place"),)), 0) == 0
        assert before[("llmgw_control_pass_seconds_count", ())] >= 0

        creds = tools_creds(tmp_path)
        nats = re.search(r"NATS \(JetStream\) at (\S+)", "".join(lines)).group(1)
        agent = processes.start(
            "agent", "agent", "--simulate", "--name", "gpu-1", "--gpus", "8", "--nats", nats,
            "--creds", run_issue(tmp_path, "agent", "gpu-1"), "--ready-after", "0.1",
        )  # fmt: skip
        catalog = tmp_path / "catalog.yaml"
        catalog.write_text(CATALOG)
        applied = run_llmgw("ctl", "apply", "-f", str(catalog), "--nats", nats, "--creds", creds, cwd=tmp_path)
        assert applied.returncode == 0, applied.stderr

        def placed(m) -> bool:
            return (
                m.get(("llmgw_control_replicas", (("state", "ready"),))) == 2
                and m.get(("llmgw_control_models_waiting", (("kind", "no_room"),))) == 1
            )

        after = wait_for(url, placed)
        assert agent.poll() is None
        assert after[("llmgw_control_nodes", (("state", "ready"),))] == 1
        assert after[("llmgw_control_gpus", (("state", "used"),))] == 2
        assert after[("llmgw_control_gpus", (("state", "free"),))] == 6
        assert after[("llmgw_control_models", ())] == 2
        assert after[("llmgw_control_decisions_total", (("kind", "place"),))] >= 2
        assert after[("llmgw_control_decisions_total", (("kind", "wait"),))] >= 1
        assert after[("llmgw_control_pass_seconds_count", ())] > before[("llmgw_control_pass_seconds_count", ())]
        assert after[("llmgw_control_log_position", ())] > before[("llmgw_control_log_position", ())]
        assert after[("llmgw_control_log_lag_events", ())] >= 0
        assert ("llmgw_control_snapshot_age_seconds", ()) in after
        assert ("llmgw_control_voided_decisions_total", ()) in after
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/other", timeout=10)
        names = {name for name, _ in after}
        # The dashboard's control-plane queries name only what the control plane exports.
        missing = {m for m in dashboard_metrics() if m.startswith("llmgw_control_")} - names - histogram_bases(names)
        assert not missing, missing
    finally:
        assert stop_up(proc) == 0


def run_issue(tmp_path, role: str, name: str) -> str:
    out = run_llmgw("creds", "issue", role, name, "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\t")[0]


def histogram_bases(names: set[str]) -> set[str]:
    return {n.rsplit("_", 1)[0] for n in names if n.endswith(("_bucket", "_sum", "_count"))}


def dashboard_metrics() -> set[str]:
    """Every metric name in the dashboards' queries (llmgw_… words in each `expr`)."""
    names: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                names.update(re.findall(r"\bllmgw_[a-z_]+\b", node["expr"]))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for f in sorted(DASHBOARDS.glob("*.json")):
        walk(json.loads(f.read_text()))
    return names


def gateway_metric_names() -> set[str]:
    """What the gateway's /metrics writes, with a row of every kind."""
    from llmgw.gateway.metrics import Metrics

    m = Metrics()
    m.answered("m", "m-1", 200, 0.01)
    m.first_token("m", "m-1", 0.005)
    m.used("m", "m-1", 3, 4)
    m.retried("m")
    m.edge("max_connections")
    text = m.render({"m": (1, 2)}, [("m", "m-1", 1, False)], connections=3).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_dashboards_are_grafana_json_naming_only_exported_gateway_metrics():
    files = sorted(DASHBOARDS.glob("*.json"))
    assert files, "no dashboard under deploy/dashboards/"
    for f in files:
        board = json.loads(f.read_text())
        assert board["title"] and board["panels"], f
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                assert target["expr"].strip(), (f, panel["title"])
    named = dashboard_metrics()
    assert any(n.startswith("llmgw_control_") for n in named) and any(n.startswith("llmgw_gateway_") for n in named)
    exported = gateway_metric_names()
    missing = {n for n in named if n.startswith("llmgw_gateway_")} - exported - histogram_bases(exported)
    assert not missing, missing
    unknown = {n for n in named if not n.startswith(("llmgw_gateway_", "llmgw_control_"))}
    assert not unknown, unknown
