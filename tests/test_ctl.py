"""`llmgw ctl` without a running fleet: the read models of the recorded
fleet-day log as `get` and `describe` show them, how a command finds the
local `llmgw up`, and its clear errors (exit status and one line) when NATS
or the read models cannot be reached or the projection is behind."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import yaml

from llmgw.cli.ctl_bus import wait_projected
from llmgw.cli.ctl_errors import BEHIND, UNREACHABLE, CtlError
from llmgw.ctl import views
from llmgw.ctl.locate import locate, write_up_file
from llmgw.ctl.readmodels import NoReadModels, ReadModels
from llmgw.projections import Projector
from llmgw.replay import logfile
from llmgw.replay.tool import fold_until
from llmgw.text import when

from .conftest import REPO, run_llmgw

LOG = REPO / "events" / "logs" / "fleet-day.jsonl"


@pytest.fixture
def fleet_day(tmp_path):
    """The read models of the recorded log, and the state it folds to."""
    records = logfile.read(LOG)
    db = tmp_path / "rm.db"

    async def project() -> None:
        p = Projector(None, db)
        await p.open("fleet-day")
        await p.project(records)
        await p.close()

    asyncio.run(project())
    return ReadModels(db), fold_until(records, None), records


def test_listings_are_the_folded_state(fleet_day):
    models, state, records = fleet_day
    assert models.position() == records[-1][0]
    assert [m["name"] for m in models.models()] == sorted(state.models)
    assert [n["name"] for n in models.nodes()] == sorted(state.nodes)
    replicas = models.replicas()
    assert [r["id"] for r in replicas] == sorted(state.replicas)
    for r in replicas:
        rep = state.replicas[r["id"]]
        assert (r["state"], r["reason"]) == (rep.state, rep.reason)
        assert r["nodes"] == [s.node for s in rep.shards] and r["endpoint"] == rep.shards[0].endpoint
    m = models.models()[0]
    assert (m["ready"], m["replicas"]) == (
        sum(r.state == "ready" for r in state.replicas.values()),
        len(state.replicas),
    )


def test_decisions_come_with_their_reasons_oldest_first(fleet_day):
    models, _, _ = fleet_day
    everything = models.decisions(limit=0)
    assert everything and all(d["reason"] for d in everything if d["kind"] != "stop-stray")
    assert [(d["seq"], d["idx"]) for d in everything] == sorted((d["seq"], d["idx"]) for d in everything)
    assert models.decisions(limit=2) == everything[-2:]
    assert {d["model"] for d in models.decisions(model="qwen-8b", limit=0)} == {"qwen-8b"}


def test_describe_a_replica_shows_how_it_got_there(fleet_day):
    models, state, _ = fleet_day
    rid = next(iter(state.replicas))
    page = {"name": rid, "replica": models.replica(rid), "history": models.history("replica", rid)}
    text = views.describe("replica", page, "text")
    rep = state.replicas[rid]
    # (the key column as wide as its longest key: Rejections)
    assert re.search(rf"^Replica: +{rid}$", text, re.M) and re.search(rf"^Endpoint: +{re.escape(rep.shards[0].endpoint)}$", text, re.M)
    # The placement with its reason, then each report of its shard, in order.
    place = text.index(f"place {rid} on {rep.shards[0].node}: {rep.reason}")
    assert place < text.index("starting") < text.index("loading") < text.rindex("ready")
    assert json.loads(views.describe("replica", page, "json"))["replica"]["id"] == rid


def test_describe_a_model_that_went_and_a_node(fleet_day):
    models, state, _ = fleet_day
    node = sorted(state.nodes)[0]
    page = {"name": node, "node": models.node(node), "history": models.history("node", node)}
    text = views.describe("node", page, "text")
    assert f"Node:       {node}" in text and "registered" in text
    assert models.known("node", node) and not models.known("node", "no-such-node")


def test_tables_for_people_json_and_yaml_for_tools(fleet_day):
    models, _, _ = fleet_day
    rows = models.replicas()
    table = views.render("replicas", rows, "table").splitlines()
    assert table[0].split() == ["ID", "MODEL", "PROFILE", "STATE", "RESTART", "NODES", "ENDPOINT", "REASON"]
    assert len(table) == len(rows) + 1
    # For tools: the rows, each time also in ISO 8601 UTC beside it.
    for out in (json.loads(views.render("replicas", rows, "json")), yaml.safe_load(views.render("replicas", rows, "yaml"))):
        assert [{k: v for k, v in r.items() if not k.endswith("_iso")} for r in out] == rows
        assert out[0]["placed_at_iso"].endswith("Z") and out[0]["placed_at_iso"][:19] == when(rows[0]["placed_at"])[:19].replace(" ", "T")
    assert views.render("models", [], "table") == "no models"
    watch = views.Watch("replicas", "json")
    change = json.loads(watch.change("MODIFIED", rows[0]))
    assert change["type"] == "MODIFIED" and change["object"]["id"] == rows[0]["id"]
    watch = views.Watch("replicas", "table")
    first = watch.first(rows).splitlines()
    deleted = watch.change("DELETED", rows[0])
    assert deleted.startswith("DELETED") and deleted.index(rows[0]["id"]) == first[0].index("ID")


def test_the_local_llmgw_up_is_found_and_flags_win(tmp_path, monkeypatch):
    state = tmp_path / "proj" / ".llmgw"
    state.mkdir(parents=True)
    (tmp_path / "proj" / "sub").mkdir()
    monkeypatch.delenv("LLMGW_NATS", raising=False)
    monkeypatch.delenv("LLMGW_DB", raising=False)
    monkeypatch.delenv("LLMGW_STATE_DIR", raising=False)
    write_up_file(state, nats="nats://127.0.0.1:14999", db=state / "readmodels.db")  # this process: alive
    monkeypatch.chdir(tmp_path / "proj" / "sub")  # found from a folder below, as git finds a repository
    where = locate()
    assert where.nats == "nats://127.0.0.1:14999" and where.db == (state / "readmodels.db").resolve()
    assert locate("nats://127.0.0.1:1").nats == "nats://127.0.0.1:1"
    monkeypatch.setenv("LLMGW_NATS", "nats://127.0.0.1:2")
    assert locate().nats == "nats://127.0.0.1:2"
    # llmgw up gone (its pid dead): its read models can still be read.
    (state / "up.json").write_text(json.dumps({"pid": 2**22 + 1, "nats": "nats://x:1", "db": "/nowhere"}))
    (state / "readmodels.db").write_bytes(b"")
    monkeypatch.delenv("LLMGW_NATS")
    where = locate()
    assert where.nats == "nats://127.0.0.1:4222" and where.db == state / "readmodels.db"
    assert "not running" in where.found


def test_no_read_models_is_a_clear_error_and_without_nats_they_are_shown_with_a_warning(tmp_path, fleet_day):
    with pytest.raises(NoReadModels, match="no read models at"):
        ReadModels(tmp_path / "missing.db").models()
    out = run_llmgw("ctl", "--db", str(tmp_path / "missing.db"), "--nats", "nats://127.0.0.1:1", "get", "models",
                    cwd=tmp_path)
    assert out.returncode == UNREACHABLE
    assert out.stderr.startswith("llmgw ctl: there are no read models at")
    # With the database but no NATS to say how far the log is: the rows, and a warning.
    models, _, records = fleet_day
    out = run_llmgw("ctl", "--db", str(models.path), "--nats", "nats://127.0.0.1:1", "get", "replicas", cwd=tmp_path)
    assert out.returncode == UNREACHABLE and "qwen-8b-3" in out.stdout  # shown, and the status says they may be old
    assert "cannot reach NATS at nats://127.0.0.1:1" in out.stderr and "the URL given by --nats" in out.stderr
    assert f"showing the read models as they are (event {records[-1][0]})" in out.stderr


def test_nats_unreachable_is_a_clear_error_and_a_bad_catalog_publishes_nothing(tmp_path):
    good = tmp_path / "c.yaml"
    good.write_text("models:\n  - name: m\n    profiles: [{name: p, gpus: 1}]\n")
    out = run_llmgw("ctl", "--nats", "nats://127.0.0.1:1", "apply", "-f", str(good), cwd=tmp_path)
    assert out.returncode == UNREACHABLE and "cannot reach NATS at nats://127.0.0.1:1" in out.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - name: m\n    profiles:\n      - name: p\n        gpus: -1\n")
    out = run_llmgw("ctl", "--nats", "nats://127.0.0.1:1", "apply", "-f", str(bad), cwd=tmp_path)
    assert out.returncode == 2  # refused before connecting: nothing could have been published
    assert f"{bad}:5: models.0.profiles.0.gpus" in out.stderr


def test_a_projection_that_stays_behind_is_said_so(fleet_day, capsys):
    models, _, records = fleet_day
    last = records[-1][0]
    asyncio.run(wait_projected(models.path, last, 1.0, what="x"))  # there already
    with pytest.raises(CtlError) as e:
        asyncio.run(wait_projected(models.path, last + 1, 1.3, what="the catalog"))
    assert e.value.status == BEHIND
    assert f"stand at event {last} and did not reach {last + 1} (the catalog)" in str(e.value)
    assert "waiting for the read models to reach event" in capsys.readouterr().err  # progress, on stderr


def test_the_quotas_table_renders_amounts_and_limits():
    # (A merge once left the quotas table calling a helper that no longer existed.)
    row = {"owner": "lab", "guarantee": {"gpus": 2}, "limits": {"gpus": 4, "cpu_cores": None},
           "usage": {"gpus": 1, "memory_gb": 16.0}, "borrowed": {}}
    text = views.render("quotas", [row], "table")
    assert "lab" in text and "2 GPUs, 0 cores, 0 GB" in text and "4 GPUs, - cores, - GB" in text
