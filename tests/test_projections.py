"""The SQLite read models: rows for what the log says, exact across restarts
and crashes, and equal to a rebuild from the whole log.

Most tests run the real shell (control plane, simulated agents, projector)
over the in-memory bus; the last one runs the projector as its own process
against a real nats-server and kills it with SIGKILL in the middle of a burst.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.agent.simulated import SimulatedAgent
from llmgw.bus.memory import MemoryBus
from llmgw.control.plane import ControlPlane
from llmgw.core.contract import events as ev
from llmgw.core.contract.catalog import fingerprint
from llmgw.core.folding.fold import apply
from llmgw.core.folding.state import State
from llmgw.projections import Projector, migrate, position, rebuild, wait_for_position
from llmgw.projections.db import connect
from llmgw.projections.migrate import MIGRATIONS_DIR, MigrationError
from llmgw.projections.rows import COLUMNS, all_entity_rows
from llmgw.replay import logfile

from .conftest import REPO
from .scenario import model, publish, until

ENTITY_TABLES = ("models", "nodes", "replicas", "shards", "quotas", "domains")


def query(db: Path, sql: str, *args) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def tables(db: Path) -> dict[str, list[tuple]]:
    """Every row of every table, sorted; schema_migrations without the time
    each migration was applied (the one wall-clock value in the database)."""
    conn = sqlite3.connect(db)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        out = {name: sorted(conn.execute(f"SELECT * FROM {name}").fetchall(), key=repr) for name in names}
        out["schema_migrations"] = sorted(conn.execute("SELECT version, name FROM schema_migrations").fetchall())
        return out
    finally:
        conn.close()


def replay(bus: MemoryBus) -> State:
    state = State()
    for i, (subject, data) in enumerate(bus.log, 1):
        apply(state, i, subject, data)
    return state


def assert_rows_are_the_state(db: Path, state: State) -> None:
    """The entity tables hold exactly the rows of everything in the state."""
    want = all_entity_rows(state)
    for table in ENTITY_TABLES:
        got = query(db, f"SELECT {', '.join(COLUMNS[table])} FROM {table}")
        assert sorted(got) == sorted(getattr(want, table).values()), table


class Fleet:
    """A control plane, simulated agents and a projector over one MemoryBus."""

    def __init__(self, db: Path, nodes: dict[str, int], **projector) -> None:
        self.bus = MemoryBus()
        self.stop = asyncio.Event()
        self.plane = ControlPlane(self.bus, tick=0.02, node_grace=0.5)
        self.agents = {
            name: SimulatedAgent(self.bus, name, gpus, loading_after=0.01, ready_after=0.01, heartbeat=0.1)
            for name, gpus in nodes.items()
        }
        self.agent_stops = {name: asyncio.Event() for name in nodes}
        self.db = db
        self.projector = Projector(self.bus, db, **projector)
        self.tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> "Fleet":
        self.tasks.append(asyncio.create_task(self.plane.run(self.stop)))
        for name, agent in self.agents.items():
            self.tasks.append(asyncio.create_task(agent.run(self.agent_stops[name])))
        self.projector_task = asyncio.create_task(self.projector.run(self.stop))
        for agent in self.agents.values():
            await asyncio.wait_for(agent.registered.wait(), 10)
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop.set()
        for s in self.agent_stops.values():
            s.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks, self.projector_task), 20)

    def ready(self, model_name: str) -> int:
        return sum(r.state == "ready" and r.model == model_name for r in self.plane.state.replicas.values())

    async def projected(self) -> int:
        last = await self.bus.last_seq()
        assert await self.projector.wait_for(last, timeout=10)
        return last


# --------------------------------------------------------------------------- rows


async def test_rows_for_models_nodes_replicas_shards_and_decisions_with_reasons(tmp_path):
    db = tmp_path / "rm.db"
    async with Fleet(db, {"n1": 4, "n2": 4}) as fleet:
        await publish(fleet.bus, ev.ModelApplied(at=1.0, model=model("m", min_replicas=3, gpus=2, owner="team-a")))
        await publish(fleet.bus, ev.ModelApplied(at=1.0, model=model("big", gpus=8)))
        await until(lambda: fleet.ready("m") == 3)
        await until(lambda: fleet.plane.state.models["big"].waiting != "")
        await fleet.projected()

        models = {r[0]: r for r in query(db, "SELECT name, owner, min_replicas, max_replicas, waiting FROM models")}
        assert models["m"] == ("m", "team-a", 3, 3, "")
        assert models["big"][4] == fleet.plane.state.models["big"].waiting != ""
        profiles = query(
            db, "SELECT json_extract(profiles, '$[0].gpus'), json_extract(profiles, '$[0].fingerprint') FROM models "
            "WHERE name = 'm'"
        )
        assert profiles == [(2, fleet.plane.state.models["m"].fingerprints["default"])]

        nodes = query(db, "SELECT name, state, gpus_total, gpus_used FROM nodes ORDER BY name")
        assert [n[:3] for n in nodes] == [("n1", "ready", 4), ("n2", "ready", 4)]
        assert sum(n[3] for n in nodes) == 6
        # Which shard holds each GPU.
        held = query(
            db, "SELECT n.name, json_extract(g.value, '$.index'), json_extract(g.value, '$.shard') "
            "FROM nodes n, json_each(n.gpus) g WHERE json_extract(g.value, '$.shard') != ''"
        )
        shards = query(db, "SELECT id, node, gpus FROM shards")
        assert sorted(held) == sorted((node, i, sid) for sid, node, gpus in shards for i in json.loads(gpus))

        replicas = query(db, "SELECT id, model, state, ready_at > 0 FROM replicas ORDER BY id")
        assert replicas == [("m-1", "m", "ready", 1), ("m-2", "m", "ready", 1), ("m-3", "m", "ready", 1)]
        ready = query(db, "SELECT count(*) FROM shards WHERE state = 'ready' AND endpoint LIKE 'http://127.0.0.1:%'")
        assert ready == [(3,)]

        placed = query(db, "SELECT replica, node, reason, voided FROM decisions WHERE kind = 'place' ORDER BY seq, idx")
        assert [p[0] for p in placed] == ["m-1", "m-2", "m-3"]
        assert all(p[1] in ("n1", "n2") and "m has" in p[2] and p[3] == "" for p in placed)
        waits = query(db, "SELECT model, reason FROM decisions WHERE kind = 'wait' ORDER BY seq")
        assert {m for m, _ in waits} == {"big"} and all(r.startswith("no room: ") for _, r in waits)
        assert waits[-1][1] == fleet.plane.state.models["big"].waiting

        # The history of one replica, as `describe` will read it.
        history = query(
            db,
            "SELECT e.type, e.summary FROM entities x JOIN event_mentions m ON m.entity = x.id "
            "JOIN events e ON e.seq = m.seq WHERE x.kind = 'replica' AND x.name = 'm-1' ORDER BY e.seq",
        )
        assert history[0][0] == "control.decided" and "place m-1" in history[0][1]
        assert [t for t, _ in history[1:]] == ["shard.status"] * 3
        assert history[-1][1].startswith("shard m-1.0 on ") and history[-1][1].endswith(" ready")
        assert_rows_are_the_state(db, fleet.plane.state)


async def test_removing_a_model_stops_its_replicas_and_their_rows_go(tmp_path):
    db = tmp_path / "rm.db"
    async with Fleet(db, {"n1": 4}) as fleet:
        await publish(fleet.bus, ev.ModelApplied(at=1.0, model=model("m", min_replicas=2)))
        await publish(fleet.bus, ev.ModelApplied(at=1.0, model=model("keep")))
        await until(lambda: fleet.ready("m") == 2 and fleet.ready("keep") == 1)
        await fleet.projected()
        assert query(db, "SELECT count(*) FROM replicas WHERE model = 'm'") == [(2,)]

        await publish(fleet.bus, ev.ModelRemoved(at=2.0, name="m"))
        await until(lambda: not any(r.model == "m" for r in fleet.plane.state.replicas.values()))
        await fleet.projected()
        assert query(db, "SELECT name FROM models") == [("keep",)]
        assert query(db, "SELECT id FROM replicas") == [("keep-1",)]
        assert query(db, "SELECT id FROM shards") == [("keep-1.0",)]
        assert query(db, "SELECT gpus_used FROM nodes") == [(1,)]
        stops = query(db, "SELECT replica, node, reason, voided FROM decisions WHERE kind = 'stop' ORDER BY replica")
        assert stops == [(f"m-{i}", "n1", "model m was removed from the catalog", "") for i in (1, 2)]
        # The history stays: the replica is gone, what happened to it is not.
        assert query(db, "SELECT count(*) FROM events WHERE summary LIKE 'shard m-1.0 on n1 stopped%'") == [(1,)]
        assert_rows_are_the_state(db, fleet.plane.state)


async def test_voided_decisions_and_lost_nodes_are_decisions_with_their_reasons(tmp_path):
    bus, db = MemoryBus(), tmp_path / "rm.db"
    spec = model("m", min_replicas=2)
    fp = fingerprint(spec.profiles[0])

    def place(rid: str, gpu: int, port: int) -> ev.PlaceReplica:
        shard = ev.ShardPlacement(shard=f"{rid}.0", node="n1", rank=0, gpus=[gpu], port=port)
        return ev.PlaceReplica(
            replica=rid, model="m", profile="default", fingerprint=fp, shards=[shard], reason="wanted"
        )

    await publish(bus, ev.ModelApplied(at=1.0, model=spec))
    await publish(bus, ev.NodeRegistered(at=2.0, node="n1", gpus=[ev.Gpu(index=0)]))
    # Two writers decided on the same state: the second placement finds GPU 0 taken.
    await publish(bus, ev.Decided(at=3.0, basis=2, actions=[place("m-1", 0, 9000)]))
    second = [ev.ModelWaiting(model="m", reason="full"), place("m-2", 0, 9001)]
    await publish(bus, ev.Decided(at=3.1, basis=2, actions=second))
    await publish(bus, ev.NodeLost(at=4.0, node="n1", reason="no heartbeat for 12s"))
    projector = Projector(bus, db, max_batch=1)
    await projector.start()
    try:
        assert await projector.wait_for(5)
    finally:
        await projector.close()
    rows = query(db, "SELECT seq, idx, at, kind, model, replica, node, reason, voided FROM decisions ORDER BY seq, idx")
    assert rows == [
        (3, 0, 3.0, "place", "m", "m-1", "n1", "wanted", ""),
        (4, 0, 3.1, "wait", "m", "", "", "full", ""),
        (4, 1, 3.1, "place", "m", "m-2", "n1", "wanted", "GPU 0 on n1 is held by m-1.0"),
        (5, 0, 4.0, "node-lost", "", "", "n1", "no heartbeat for 12s", ""),
    ]
    assert query(db, "SELECT id, state, reason FROM replicas") == [
        ("m-1", "failed", "shard m-1.0 on n1 failed: node n1 lost: no heartbeat for 12s")
    ]
    assert query(db, "SELECT name, state, reason, gpus_used FROM nodes") == [("n1", "lost", "no heartbeat for 12s", 0)]
    assert query(db, "SELECT name, waiting FROM models") == [("m", "full")]
    assert_rows_are_the_state(db, replay(bus))


async def test_quarantined_events_are_listed(tmp_path):
    bus, db = MemoryBus(), tmp_path / "rm.db"
    await publish(bus, ev.NodeRegistered(at=1.0, node="n1", gpus=[ev.Gpu(index=0)]))
    await bus.publish("llmgw.agent.n1.shard.status", b"\x00\xff not json", msg_id="garbage")
    spoof = ev.ShardStatus(at=2.0, node="n2", replica="m-1", shard="m-1.0", generation=1, state="ready")
    await publish(bus, spoof, subject="llmgw.agent.n1.shard.status")
    await bus.publish("llmgw.agent.n1.node.rebooted", b'{"type":"node.rebooted","v":1,"at":3.5}', msg_id="unknown")
    await publish(bus, ev.ModelApplied(at=4.0, model=model("bad name!")))
    projector = Projector(bus, db)
    await projector.start()
    try:
        assert await projector.wait_for(5)
    finally:
        await projector.close()
    quarantined = query(db, "SELECT seq, subject, error FROM quarantined ORDER BY seq")
    assert [q[:2] for q in quarantined] == [
        (2, "llmgw.agent.n1.shard.status"),
        (3, "llmgw.agent.n1.shard.status"),
        (4, "llmgw.agent.n1.node.rebooted"),
        (5, "llmgw.ctl.model.applied"),
    ]
    assert "malformed" in quarantined[0][2]
    assert "may not speak for node n2" in quarantined[1][2]
    assert "node.rebooted" in quarantined[2][2]
    assert "$.model.name" in quarantined[3][2]  # refused by the contract's bounds (core/contract/bounds.py)
    # Every message is in the history, quarantined or not.
    events = query(db, "SELECT seq, at, type FROM events ORDER BY seq")
    assert events == [(1, 1.0, "node.registered"), (2, None, ""), (3, 2.0, "shard.status"), (4, 3.5, "node.rebooted"),
                      (5, 4.0, "model.applied")]
    assert query(db, "SELECT name FROM models") == []


# --------------------------------------------------------------------------- migrations


async def test_migrations_are_versioned_and_applied_once(tmp_path):
    sql = tmp_path / "sql"
    sql.mkdir()
    shutil.copy(MIGRATIONS_DIR / "0001_initial.sql", sql)
    db = tmp_path / "rm.db"
    conn = await connect(db)
    try:
        assert await migrate(conn, sql) == [1]
        assert await migrate(conn, sql) == []
        (sql / "0002_more.sql").write_text("CREATE TABLE extra (x INTEGER);\nINSERT INTO extra VALUES (7);\n")
        assert await migrate(conn, sql) == [2]
        assert await migrate(conn, sql) == []
        assert await conn.execute_fetchall("SELECT x FROM extra") == [(7,)]
        # A migration that fails leaves nothing behind, not even half of itself.
        (sql / "0003_broken.sql").write_text("CREATE TABLE half (x);\nINSERT INTO no_such_table VALUES (1);\n")
        with pytest.raises(MigrationError, match="0003_broken.sql"):
            await migrate(conn, sql)
        assert await conn.execute_fetchall("SELECT name FROM sqlite_master WHERE name = 'half'") == []
        (sql / "0003_broken.sql").unlink()
        versions = await conn.execute_fetchall(
            "SELECT version, name, applied_at > 0 FROM schema_migrations ORDER BY version"
        )
        assert versions == [(1, "initial", 1), (2, "more", 1)]
        # Two files claiming one version: which one ran would be a guess.
        (sql / "0002_other.sql").write_text("SELECT 1;")
        with pytest.raises(MigrationError, match="two migrations with version 2"):
            await migrate(conn, sql)
    finally:
        await conn.close()
    # The real directory, twice, through the projector.
    bus = MemoryBus()
    for _ in range(2):
        p = Projector(bus, tmp_path / "real.db")
        await p.open()
        await p.close()
    real = sorted(int(f.name[:4]) for f in MIGRATIONS_DIR.glob("*.sql"))
    assert real[:2] == [1, 2]
    assert query(tmp_path / "real.db", "SELECT version FROM schema_migrations ORDER BY version") == [(v,) for v in real]


# --------------------------------------------------------------------------- exactness


async def test_rows_followed_live_equal_a_rebuild_from_the_log(tmp_path):
    """Small batches, a restart half-way, a lost node, a changed profile, a
    removed model: whatever the batches were, the rows are those of the log."""
    db = tmp_path / "live.db"
    async with Fleet(db, {"n1": 4, "n2": 4, "n3": 2}, max_batch=3) as fleet:
        bus = fleet.bus
        await publish(bus, ev.ModelApplied(at=1.0, model=model("a", min_replicas=3, gpus=2)))
        await publish(bus, ev.ModelApplied(at=1.0, model=model("b", min_replicas=2)))
        await until(lambda: fleet.ready("a") == 3 and fleet.ready("b") == 2)

        # The projector stops and starts again: it folds what it wrote, writes the rest.
        await fleet.projected()
        await fleet.projector.close()
        await fleet.projector_task
        stood_at = position(db)
        await publish(bus, ev.ModelApplied(at=2.0, model=model("b", min_replicas=2, profiles=[
            ev.ProfileSpec(name="default", gpus=1, args=["--changed"])])))
        fleet.projector = Projector(bus, db, max_batch=5)
        fleet.projector_task = asyncio.create_task(fleet.projector.run(fleet.stop))
        await until(lambda: fleet.projector.position > stood_at)

        # A node goes silent and is lost; its replicas move.
        doomed = next(n for n in ("n3", "n2", "n1") if any(
            s.node == n for r in fleet.plane.state.replicas.values() for s in r.shards))
        fleet.agent_stops[doomed].set()
        await until(lambda: fleet.plane.state.nodes[doomed].state == "lost", timeout=5)
        await publish(bus, ev.ModelRemoved(at=3.0, name="a"))
        await until(lambda: not any(r.model == "a" for r in fleet.plane.state.replicas.values()))
        await until(lambda: fleet.ready("b") == 2)
        last = await fleet.projected()

    assert fleet.projector.batches >= 3  # in batches of at most 5 after the restart
    state = replay(fleet.bus)
    assert_rows_are_the_state(db, state)
    assert position(db) == last
    assert await rebuild(fleet.bus, tmp_path / "rebuilt.db") == last
    live, rebuilt = tables(db), tables(tmp_path / "rebuilt.db")
    assert live.keys() == rebuilt.keys()
    for table in live:
        assert live[table] == rebuilt[table], table
    assert len(live["decisions"]) > 10 and any(r[3] == "node-lost" for r in live["decisions"])
    assert len(live["events"]) == last


async def test_a_recorded_log_projects_alike_in_batches_of_one_and_whole(tmp_path):
    records = logfile.read(REPO / "events" / "logs" / "fleet-day.jsonl")
    bus = MemoryBus()
    bus.log = [(subject, data) for _, subject, data in records]
    one = Projector(bus, tmp_path / "one.db", max_batch=1)
    await one.start()
    try:
        assert await one.wait_for(len(records))
    finally:
        await one.close()
    await rebuild(bus, tmp_path / "whole.db")
    assert tables(tmp_path / "one.db") == tables(tmp_path / "whole.db")
    assert_rows_are_the_state(tmp_path / "whole.db", replay(bus))


async def test_rebuild_replaces_the_database_whole_and_a_stale_one_is_rebuilt(tmp_path):
    bus, db = MemoryBus(), tmp_path / "rm.db"
    await publish(bus, ev.ModelApplied(at=1.0, model=model("m")))
    await rebuild(bus, db)
    assert query(db, "SELECT name FROM models") == [("m",)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rm.db"]  # no temp file, no -wal left
    # Rows made from another log are not trusted: the projector rebuilds them.
    other = MemoryBus()
    await publish(other, ev.ModelApplied(at=1.0, model=model("x")))
    await publish(other, ev.ModelApplied(at=1.0, model=model("y")))
    p = Projector(other, db)
    await p.start()
    try:
        assert await p.wait_for(2)
    finally:
        await p.close()
    assert query(db, "SELECT name FROM models ORDER BY name") == [("x",), ("y",)]
    assert await wait_for_position(db, 2, timeout=1)
    assert not await wait_for_position(db, 3, timeout=0.1)


# --------------------------------------------------------------------------- a real server, a real crash


def _start_projector(url: str, db: Path, log: Path) -> subprocess.Popen:
    out = open(log, "ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "llmgw.projections", "--nats", url, "--db", str(db), "--max-batch", "500"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO,
        )
    finally:
        out.close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.nats
async def test_a_projector_killed_mid_burst_resumes_exactly(nats_server, tmp_path):
    from llmgw.bus.nats import NatsBus

    db, log = tmp_path / "rm.db", tmp_path / "projector.log"
    bus = await NatsBus.connect(nats_server.url, name="test")
    procs: list[subprocess.Popen] = []
    stop = asyncio.Event()
    plane = ControlPlane(bus, tick=0.05, node_grace=1e9)  # no agents beat: nothing is lost
    plane_task = asyncio.create_task(plane.run(stop))
    try:
        await bus.ensure_streams()
        for i in range(4):
            await publish(bus, ev.NodeRegistered(at=1.0, node=f"n{i}", gpus=[ev.Gpu(index=g) for g in range(4)]))
        await publish(bus, ev.ModelApplied(at=1.0, model=model("m", min_replicas=4)))
        await until(lambda: len(plane.state.replicas) == 4)
        procs.append(_start_projector(nats_server.url, db, log))

        # The burst: 10,000 events, shard reports for the placed shards with,
        # every 1,000, the model rescaled so the control plane decides too.
        n, sent = 10_000, 0

        async def burst() -> None:
            nonlocal sent
            states = itertools.cycle(["starting", "loading", "ready"])
            while sent < n:
                if sent % 1000 == 0:
                    k = 2 + (sent // 1000) % 5
                    await publish(bus, ev.ModelApplied(at=2.0, model=model("m", min_replicas=k, max_replicas=k)))
                    sent += 1
                shards = [(r.id, s) for r in list(plane.state.replicas.values()) for s in r.shards]
                reports = [
                    ev.ShardStatus(at=3.0, node=s.node, replica=rid, shard=s.id, generation=s.generation,
                                   state="stopped" if s.state == "stopping" else next(states))
                    for rid, s in shards * (100 // max(len(shards), 1))
                ][: n - sent]
                await asyncio.gather(*(publish(bus, e) for e in reports))
                sent += len(reports)

        publisher = asyncio.create_task(burst())
        # Killed while it works through a backlog, in transactions of 500
        # events: mid-burst, and most likely mid-transaction. The backlog is
        # made by pausing it (SIGSTOP) while the burst goes on.
        await until(lambda: sent >= n // 4 and position(db) > 0 or publisher.done(), timeout=30)
        os.kill(procs[0].pid, signal.SIGSTOP)
        paused_at = position(db)
        await until(lambda: sent >= n * 3 // 4 or publisher.done(), timeout=30)
        os.kill(procs[0].pid, signal.SIGCONT)
        await until(lambda: position(db) > paused_at, timeout=30)
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].wait(10)
        killed_at = position(db)
        await publisher
        assert 0 < killed_at < await bus.last_seq()
        last = await bus.last_seq()
        assert last > 10_000

        procs.append(_start_projector(nats_server.url, db, log))
        assert await wait_for_position(db, last, timeout=60), f"stuck at {position(db)} of {last}:\n{log.read_text()}"
        _stop(procs[1])
        assert f"stand at seq {killed_at}" in log.read_text()  # it resumed where its last commit stood

        rebuilt = tmp_path / "rebuilt.db"
        assert await rebuild(bus, rebuilt) == last
        live, fresh = tables(db), tables(rebuilt)
        for table in live:
            assert live[table] == fresh[table], table
        assert len(live["events"]) == last
        assert {r[3] for r in live["decisions"]} >= {"place", "stop"}
    finally:
        stop.set()
        await asyncio.wait_for(plane_task, 10)
        for p in procs:
            _stop(p)
        await bus.close()
