"""`llmgw replay FILE` as people and tools use it, on a recorded log, with no NATS."""

import datetime as dt
import json

import msgspec

from llmgw.replay import logfile

from .conftest import REPO, run_llmgw

DAY = str(REPO / "events" / "logs" / "fleet-day.jsonl")


def test_the_state_as_a_table_for_people():
    out = run_llmgw("replay", DAY)
    assert out.returncode == 0
    assert "NODES" in out.stdout and "gpu-2  lost" in out.stdout
    assert "QUARANTINED: 1 event(s)" in out.stdout


def test_at_a_time_gives_the_state_of_that_moment():
    records = logfile.read(DAY)
    times = [msgspec.json.decode(data)["at"] for _, s, data in records if not s.endswith(".status")]
    lost_at = next(msgspec.json.decode(d)["at"] for _, s, d in records if s.endswith("node.lost"))
    before = dt.datetime.fromtimestamp(lost_at - 0.001, dt.timezone.utc).isoformat()
    state = json.loads(run_llmgw("replay", DAY, "--json", "--at", before).stdout)
    assert state["nodes"]["gpu-2"]["state"] == "ready"
    state = json.loads(run_llmgw("replay", DAY, "--json", "--at", str(lost_at)).stdout)
    assert state["nodes"]["gpu-2"]["state"] == "lost"
    assert min(times) <= lost_at <= max(times)


def test_the_history_of_a_node_says_why_it_was_lost():
    out = run_llmgw("replay", DAY, "--node", "gpu-2")
    assert "node gpu-2 registered" in out.stdout
    assert "node gpu-2 lost: no heartbeat" in out.stdout
    rows = json.loads(run_llmgw("replay", DAY, "--node", "gpu-2", "--json").stdout)
    assert rows[-1]["event"]["type"] in ("node.lost", "control.decided", "shard.status")


def test_verify_exits_zero_on_an_honest_log_and_five_on_a_forged_one(tmp_path):
    assert run_llmgw("replay", DAY, "--verify").returncode == 0
    records = logfile.read(DAY)
    forged = []
    for seq, subject, data in records:
        if subject.endswith("control.decided"):
            data = data.replace(b"has 0 of 2 replicas", b"was forged")
        forged.append((seq, subject, data))
    path = tmp_path / "forged.jsonl"
    logfile.write(path, forged)
    out = run_llmgw("replay", str(path), "--verify")
    assert out.returncode == 5 and "1 differ" in out.stdout  # 5: a check found differences (llmgw/ctl/exits.py)


def test_a_missing_or_broken_file_is_a_clear_error(tmp_path):
    out = run_llmgw("replay", str(tmp_path / "nope.jsonl"))
    assert out.returncode == 1 and "nope.jsonl" in out.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"seq": 1}\n')
    out = run_llmgw("replay", str(bad))
    assert "line 1 of the log file is not a log record" in out.stderr


def test_a_what_if_window_past_the_end_of_the_log_says_so_and_exits_2():
    """Issue 34: `--from 1200` on a short log printed 1970 dates and zeros."""
    records = logfile.read(DAY)
    last_seq = records[-1][0]
    catalog = str(REPO / "deploy" / "catalog.example.yaml")
    out = run_llmgw("replay", DAY, "--what-if", catalog, "--from", str(last_seq + 1000))
    assert out.returncode == 2 and out.stdout == ""
    assert f"--from {last_seq + 1000} is past the end of the log (the log ends at event {last_seq}, " in out.stderr
    out = run_llmgw("replay", DAY, "--what-if", catalog, "--to", "2999-01-01T00:00:00")
    assert out.returncode == 2 and "--to 2999-01-01T00:00:00 is past the end of the log" in out.stderr
    out = run_llmgw("replay", DAY, "--what-if", catalog, "--from", "20", "--to", "10")
    assert out.returncode == 2 and "--from 20 is after --to 10" in out.stderr
    out = run_llmgw("replay", DAY, "--what-if", catalog, "--from", "2", "--to", str(last_seq))
    assert out.returncode in (0, 5) and "1970" not in out.stdout, out.stderr  # within the log: a report
