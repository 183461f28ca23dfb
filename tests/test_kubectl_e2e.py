"""`llmgw ctl` for hands that know kubectl (issue 34, part 5), end to end:
every command a real `llmgw` process against a real `llmgw up` (embedded
nats-server, control plane, projector) and simulated agents, in a folder of
its own, found as a newcomer's shell finds it.

`get KIND NAME`, `-l` by label, owner, class and state, `--sort-by`, `-o
jsonpath=` and `-o custom-columns=`, `get owners` and `get apikeys` (no hash,
in any output), `get --watch -o json` as JSON lines from the first, `describe
model` with the load reports of a real gateway credential folded per minute,
and bash completing the names of the read models."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmgw.bus.nats import NatsBus
from llmgw.ctl.exits import Exit
from llmgw.core.contract import events as ev

from .scenario import publish
from .test_cli import Fleet
from .test_completion import complete_in_bash, llmgw_on_path

pytestmark = [pytest.mark.nats, pytest.mark.timeout(240)]

KEY = "sk-kubectl-e2e-0123456789"
CATALOG = f"""\
owners:
  - name: org
    guarantee: {{gpus: 4}}
    limit: {{gpus: 8}}
  - name: org/team
    guarantee: {{gpus: 1}}
models:
  - name: chat
    owner: org/team
    priority: critical
    min_replicas: 2
    profiles:
      - name: one
        gpus: 1
  - name: batch
    owner: org
    priority: opportunistic
    min_replicas: 1
    profiles:
      - name: two
        gpus: 2
api_keys:
  - name: team-key
    owner: org/team
    key: {KEY}
    requests_per_minute: 60
    tokens_per_minute: 10000
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = Fleet(tmp_path_factory.mktemp("kubectl"))
    try:
        deadline = time.monotonic() + 60
        while f.ctl("get", "nodes", "-o", "name").stdout.split() != ["node/sim-1", "node/sim-2"]:
            assert time.monotonic() < deadline, "the simulated nodes did not register"
            time.sleep(0.2)
        out = f.ctl("label", "sim-1", "rack=r1")
        assert out.returncode == 0, out.stderr
        out = f.ctl("apply", "-f", f.file("catalog.yaml", CATALOG), "--wait")
        assert out.returncode == 0, out.stderr
        yield f
    finally:
        f.stop()


def ok(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_get_kind_name_shows_one_object_and_an_unknown_name_is_exit_1(fleet):
    table = ok(fleet.ctl("get", "replica", "chat-1")).splitlines()
    assert table[0].split()[0] == "ID" and len(table) == 2 and table[1].startswith("chat-1 ")
    one = json.loads(ok(fleet.ctl("get", "rs", "-o", "json", "chat-2")))  # a name after a flag, as kubectl takes it
    assert one["id"] == "chat-2" and one["model"] == "chat"  # the object, not a list
    assert ok(fleet.ctl("get", "model", "chat", "batch", "-o", "name")).split() == ["model/chat", "model/batch"]
    assert ok(fleet.ctl("get", "node", "sim-1", "-o", "jsonpath={.location.rack}")) == "r1"
    out = fleet.ctl("get", "replica", "chat-9")
    assert out.returncode == Exit.NOT_FOUND and out.stdout == ""
    assert "there is no replica chat-9 (did you mean chat-" in out.stderr
    out = fleet.ctl("get", "replica", "chat-1", "chat-9")  # what is there is shown; what is not, said
    assert out.returncode == Exit.NOT_FOUND and "chat-1" in out.stdout and "no replica chat-9" in out.stderr
    decision = json.loads(ok(fleet.ctl("get", "decisions", "-o", "json", "--limit", "1")))[0]
    again = json.loads(ok(fleet.ctl("get", "decision", f"{decision['seq']}.{decision['idx']}", "-o", "json")))
    assert again == decision


def test_label_selectors_by_label_owner_class_and_state(fleet):
    names = lambda *a: ok(fleet.ctl("get", *a, "-o", "name")).split()  # noqa: E731
    assert names("rs", "-l", "model=chat") == ["replica/chat-1", "replica/chat-2"]
    assert names("rs", "-l", "owner=org") == ["replica/batch-1"]
    assert names("rs", "-l", "class=critical,state=ready") == ["replica/chat-1", "replica/chat-2"]
    assert names("rs", "-l", "class!=critical") == ["replica/batch-1"]
    assert names("mo", "-l", "priority in (opportunistic)") == ["model/batch"]
    assert names("mo", "-l", "state=ready") == ["model/batch", "model/chat"]
    assert names("no", "-l", "rack=r1") == ["node/sim-1"]  # a location, by its short kind
    assert names("no", "-l", "!rack") == ["node/sim-2"]
    on_sim_1 = names("rs", "-l", "node=sim-1")
    assert on_sim_1 and all(r in names("rs") for r in on_sim_1) and len(on_sim_1) < 3
    assert names("own", "-l", "parent=org") == ["owner/org/team"]
    out = fleet.ctl("get", "rs", "-l", "sate=ready")
    assert out.returncode == Exit.BAD_INPUT and "did you mean state" in out.stderr
    out = fleet.ctl("get", "rs", "-l", "state ready")
    assert out.returncode == Exit.BAD_INPUT and "cannot read the selector" in out.stderr


def test_sort_by_jsonpath_and_custom_columns(fleet):
    by_id = ok(fleet.ctl("get", "rs", "--sort-by", "{.id}", "-o", "name")).split()
    assert by_id == sorted(by_id)
    reverse = ok(fleet.ctl("get", "rs", "--sort-by", ".model", "-o", "jsonpath={.items[*].model}")).split()
    assert reverse == ["batch", "chat", "chat"]
    text = ok(fleet.ctl("get", "rs", "-o", 'jsonpath={range .items[*]}{.id}{"\\t"}{.state}{"\\n"}{end}', "-l", "model=chat"))
    assert text == "chat-1\tready\nchat-2\tready\n"
    columns = ok(fleet.ctl("get", "rs", "-o", "custom-columns=ID:.id,NODE:.nodes[0],PLACED:.placed_at_iso,X:.nope"))
    lines = [line.split() for line in columns.splitlines()]
    assert lines[0] == ["ID", "NODE", "PLACED", "X"] and len(lines) == 4
    assert all(line[1].startswith("sim-") and line[2].endswith("Z") and line[3] == "<none>" for line in lines[1:])
    bare = ok(fleet.ctl("get", "rs", "-o", "custom-columns=ID:.id", "--no-headers")).split()
    assert sorted(bare) == ["batch-1", "chat-1", "chat-2"]
    out = fleet.ctl("get", "rs", "--sort-by", ".nope")
    assert out.returncode == Exit.BAD_INPUT and "no replicas have it" in out.stderr
    out = fleet.ctl("get", "rs", "-o", "jsonpath={.items[")
    assert out.returncode == Exit.BAD_INPUT and "unclosed" in out.stderr


def test_owners_and_api_keys_are_listed_and_no_hash_is_ever_shown(fleet):
    owners = {o["name"]: o for o in json.loads(ok(fleet.ctl("get", "owners", "-o", "json")))}
    assert set(owners) == {"org", "org/team"}
    assert owners["org/team"]["models"] == ["chat"] and owners["org/team"]["api_keys"] == ["team-key"]
    assert owners["org"]["limit"]["gpus"] == 8
    table = ok(fleet.ctl("get", "owners"))
    assert "org/team" in table and "4 GPUs" in table
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    outputs = ("table", "wide", "json", "yaml", "name", "jsonpath={..*}", "custom-columns=ALL:.*")
    for output in outputs:
        text = ok(fleet.ctl("get", "apikeys", "-o", output))
        assert digest not in text and digest[:16] not in text and KEY not in text, output
    keys = json.loads(ok(fleet.ctl("get", "apikey", "team-key", "-o", "json")))
    assert keys == {"name": "team-key", "owner": "org/team", "requests_per_minute": 60, "tokens_per_minute": 10000,
                    "tokens_per_day": 0, "tokens_per_month": 0, "spend_per_day": 0.0, "spend_per_month": 0.0}
    assert ok(fleet.ctl("get", "keys", "--no-headers")).split() == ["team-key", "org/team", "60", "10000"]
    out = fleet.ctl("get", "owners", "--watch")
    assert out.returncode == Exit.BAD_INPUT and "read live from the log" in out.stderr


def test_watch_json_prints_json_lines_from_the_first_line_on(fleet):
    watcher, out_file = fleet.watch("watch.json", "get", "nodes", "--watch", "-o", "json")
    try:
        deadline = time.monotonic() + 30
        fleet.until_lines(watcher, out_file, 2)
        first = [json.loads(line) for line in out_file.read_text().splitlines()]  # every line JSON, the first too
        assert [(c["type"], c["object"]["name"]) for c in first] == [("ADDED", "sim-1"), ("ADDED", "sim-2")]
        ok(fleet.ctl("label", "sim-2", "row=row-2"))
        while not any('"MODIFIED"' in line for line in out_file.read_text().splitlines()):
            assert watcher.poll() is None and time.monotonic() < deadline + 30, out_file.read_text()
            time.sleep(0.1)
    finally:
        watcher.send_signal(signal.SIGINT)
        rc = watcher.wait(20)
    lines = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert any(c["type"] == "MODIFIED" and c["object"]["location"].get("row") == "row-2" for c in lines)
    assert rc == Exit.INTERRUPTED
    ok(fleet.ctl("label", "sim-2", "row-"))  # as it was, for the other tests


async def test_describe_model_folds_a_gateways_load_reports_per_minute(fleet):
    out = subprocess.run([sys.executable, "-m", "llmgw", "creds", "issue", "gateway", "gw-e2e"], cwd=fleet.folder,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    creds = fleet.folder / ".llmgw" / "creds" / "gateway-gw-e2e.creds"
    bus = await NatsBus.connect(fleet.up.url, name="gw-e2e", creds=str(creds))
    try:
        now = time.time()
        for i in range(6):  # what a gateway says of a model it serves, as its load changes
            await publish(bus, ev.ModelLoad(at=now + i * 0.01, gateway="gw-e2e", model="chat", in_flight=i % 4,
                                            queued=1 if i == 2 else 0, last_used=now, tokens_in=10, tokens_out=3))
        last = await bus.last_seq()
    finally:
        await bus.close()
    text = ok(fleet.ctl("describe", "model", "chat"))
    assert "load on chat from gateway" not in text
    folded = [line for line in text.splitlines() if "load " in line and "reports from gateway gw-e2e" in line]
    # One line for the minute (two, if the reports straddled a minute's end), numbers from the log.
    assert 1 <= len(folded) <= 2, text
    if len(folded) == 1:
        assert "6 reports from gateway gw-e2e; at most 3 in flight, 1 queued; 60 tokens in, 18 out" in folded[0]
        assert f"-{last}" in folded[0].split()[0]  # its events, first to last
    page = json.loads(ok(fleet.ctl("describe", "model", "chat", "-o", "json")))
    intervals = [e for e in page["history"] if e["type"] == "load.interval"]
    assert sum(e["load"]["reports"] for e in intervals) == 6 and sum(e["load"]["tokens_in"] for e in intervals) == 60
    assert not [e for e in page["history"] if e["type"] == "model.load"]


def test_bash_completes_the_names_in_the_read_models(fleet, tmp_path):
    env = llmgw_on_path(tmp_path)
    tab = lambda *w: complete_in_bash(env, fleet.folder, "llmgw", *w)  # noqa: E731
    assert tab("ctl", "get", "replica", "ch") == ["chat-1", "chat-2"]
    assert tab("ctl", "describe", "model", "") == ["batch", "chat"]
    assert tab("ctl", "logs", "b") == ["batch-1"]
    assert tab("ctl", "label", "") == ["sim-1", "sim-2"]

