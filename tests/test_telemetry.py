"""Each pass of the control plane and each decision it takes is an
OpenTelemetry span with the model, replica and reason as attributes: seen
from outside, in the spans a real `llmgw control` process exports."""

from __future__ import annotations

import json
import signal

import pytest

from .conftest import run_llmgw
from .test_e2e_nats import wait_for

pytestmark = pytest.mark.nats


def test_passes_and_decisions_are_spans_with_their_reasons(nats_server, processes, tmp_path):
    spans_file = tmp_path / "spans.jsonl"
    url = nats_server.url
    control = processes.start("control", "control", "--nats", url, "--state-dir", str(tmp_path / "state"),
                              env={"LLMGW_TRACE_FILE": str(spans_file)})
    processes.start("gpu-1", "agent", "--simulate", "--name", "gpu-1", "--gpus", "4", "--nats", url)
    catalog = tmp_path / "c.yaml"
    catalog.write_text("models:\n  - name: chat\n    min_replicas: 2\n    profiles: [{name: one, gpus: 1}]\n")
    assert run_llmgw("ctl", "--nats", url, "apply", "-f", str(catalog)).returncode == 0
    wait_for(url, lambda s: sum(r.state == "ready" for r in s.replicas.values()) == 2)
    control.send_signal(signal.SIGTERM)  # spans are flushed as it exits
    assert control.wait(15) == 0

    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    assert {s["service"] for s in spans} == {"llmgw-control"}
    passes = {s["span_id"]: s for s in spans if s["name"] == "control.pass"}
    places = [s for s in spans if s["name"] == "decision place"]
    assert sorted(s["attributes"]["llmgw.replica"] for s in places) == ["chat-1", "chat-2"]
    for s in places:
        a = s["attributes"]
        assert a["llmgw.model"] == "chat" and a["llmgw.node"] == "gpu-1"
        assert a["llmgw.reason"].startswith("chat has ") and a["llmgw.decision"].startswith("place ")
        parent = passes[s["parent_id"]]  # under the pass that decided it
        assert parent["attributes"]["llmgw.landed"] is True and parent["attributes"]["llmgw.actions"] >= 1
