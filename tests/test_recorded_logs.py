"""The recorded logs under events/logs/ replay and verify, with no NATS at
all: old logs must keep folding as the code grows (the log is forever)."""

from pathlib import Path

import pytest

from llmgw.core.simulation.history import history, verify
from llmgw.replay import logfile
from llmgw.replay.tool import fold_until

LOGS = sorted((Path(__file__).resolve().parent.parent / "events" / "logs").glob("*.jsonl"))


def test_there_is_a_recorded_log():
    assert LOGS


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_every_recorded_decision_is_decided_again_the_same(path):
    checked, differences = verify(logfile.read(path))
    assert checked > 0
    assert differences == []


def test_the_fleet_day_ends_as_it_was_recorded():
    records = logfile.read(LOGS[0].parent / "fleet-day.jsonl")
    state = fold_until(records, None)
    assert state.nodes["gpu-2"].state == "lost"
    assert {r.id: r.state for r in state.replicas.values()} == {"qwen-8b-3": "ready"}
    assert set(state.models) == {"qwen-8b"}
    assert state.quarantine_count == 1
    # Why did qwen-8b-2 stop? Its history says, with the reason.
    lines = [e for _, e in history(records, ("replica", "qwen-8b-2"))]
    assert any("node gpu-2 lost" in getattr(a, "reason", "") for e in lines for a in getattr(e, "actions", []))


def test_a_log_file_round_trips_byte_for_byte(tmp_path):
    records = logfile.read(LOGS[0])
    copy = tmp_path / "copy.jsonl"
    logfile.write(copy, records + [(len(records) + 1, "llmgw.agent.x.y", b"\x00\xffbinary junk")])
    again = logfile.read(copy)
    assert again[:-1] == records
    assert again[-1][2] == b"\x00\xffbinary junk"
