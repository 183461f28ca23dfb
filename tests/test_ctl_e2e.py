"""The operator's path end to end, through `llmgw up` over a real nats-server:
a catalog with an error (a clear message, nothing published), then a correct
one with --wait, replicas ready in `get -o json`, `describe` telling how each
got there; then the projector killed with SIGKILL in the middle of a burst of
10,000 events, restarted by `llmgw up`, and its rows identical to a rebuild.

Every command runs in the folder where `llmgw up` runs, with no --nats and
no --db: they find it as a newcomer's shell would."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmgw.bus import read_log
from llmgw.bus.nats import NatsBus
from llmgw.bus.server import free_port
from llmgw.core.contract import events as ev
from llmgw.projections import position

from .conftest import run_llmgw
from .scenario import publish, until
from .test_projections import tables

pytestmark = pytest.mark.nats

CATALOG = """\
models:
  - name: chat
    min_replicas: 2
    profiles:
      - name: one
        gpus: 1
  - name: big
    min_replicas: 1
    profiles:
      - name: four
        gpus: 4
api_keys:
  - name: team
    owner: org/team
    key: sk-e2e-0123456789abcdef
"""


class Up:
    """`llmgw up` in a folder of its own, its output in a file (a pipe nobody
    reads would fill and stall the children that inherit it)."""

    def __init__(self, folder: Path, *more: str) -> None:
        self.folder = folder
        self.port = free_port()
        self.out = folder / "up.out"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                # Simulated agents only: no local agent, so no demo model either.
                [sys.executable, "-m", "llmgw", "up", "--nats-port", str(self.port), "--no-agent", "--no-gateway", "--console-port", str(free_port()), *more],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=folder, start_new_session=True,
            )
        self.url = f"nats://127.0.0.1:{self.port}"
        self.db = folder / ".llmgw" / "readmodels.db"
        self.env = {"LLMGW_STATE_DIR": str(folder / ".llmgw")}  # how a command elsewhere finds it
        deadline = time.monotonic() + 30
        while "Ctrl-C stops everything" not in self.text():
            assert self.proc.poll() is None and time.monotonic() < deadline, f"llmgw up did not come up:\n{self.text()}"
            time.sleep(0.05)

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def pids(self, child: str) -> list[int]:
        return [int(p) for p in re.findall(rf"{child}: pid (\d+)", self.text())]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def ctl(up: Up, *args: str) -> subprocess.CompletedProcess:
    return run_llmgw("ctl", *args, cwd=up.folder)


async def test_apply_get_describe_and_a_projector_killed_mid_burst_through_llmgw_up(tmp_path, processes):
    up = Up(tmp_path)
    bus = None
    try:
        for n in ("gpu-1", "gpu-2", "gpu-3"):
            # Their credentials from the key store of that llmgw up, as in its folder.
            processes.start(n, "agent", "--simulate", "--name", n, "--gpus", "4", "--nats", up.url, env=up.env)
        bus = await NatsBus.connect(up.url, name="test", creds=str(up.folder / ".llmgw" / "creds" / "operator.creds"))
        await bus.wait_for_streams(timeout=20)
        # The three registrations and the control plane's election first: one
        # landing later would look like something the bad catalog published.
        deadline = time.monotonic() + 30
        while await bus.last_seq() < 4:
            assert time.monotonic() < deadline, "the simulated agents did not register"
            await asyncio.sleep(0.05)

        # A catalog with an error: the file, the line and the field; nothing published.
        bad = tmp_path / "bad.yaml"
        bad.write_text(CATALOG.replace("min_replicas: 1", "min_replicas: one"))
        before = await bus.last_seq()
        out = ctl(up, "apply", "-f", str(bad), "--wait")
        assert out.returncode == 2
        assert f"{bad}:8: models.1.min_replicas: Input should be a valid integer" in out.stderr
        assert await bus.last_seq() == before

        # Someone watching the replicas meanwhile, as a tool would (JSON lines).
        watch_out = tmp_path / "watch.out"
        with open(watch_out, "wb") as f:
            watcher = subprocess.Popen(
                [sys.executable, "-m", "llmgw", "ctl", "get", "replicas", "--watch", "-o", "json"],
                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path, start_new_session=True,
            )
        processes.procs.append(watcher)  # stopped at the end whatever happens
        # Its first listing: none yet (JSON lines from the first on: nothing on stdout, a word on stderr).
        await until(lambda: "no replicas yet; watching" in watch_out.read_text(), timeout=20)

        # The correct one, with --wait: what `get` shows next includes it.
        good = tmp_path / "catalog.yaml"
        good.write_text(CATALOG)
        out = ctl(up, "apply", "-f", str(good), "--wait")
        assert out.returncode == 0, out.stderr
        assert "model chat created" in out.stdout and "model big created" in out.stdout
        assert "api key team created for org/team" in out.stdout
        log = await read_log(bus)
        assert not any(b"sk-e2e-0123456789abcdef" in data for _, _, data in log)  # only its hash travels
        models = json.loads(ctl(up, "get", "models", "-o", "json").stdout)
        assert {m["name"] for m in models} == {"chat", "big"}
        again = ctl(up, "apply", "-f", str(good), "--wait")  # only what changed is published
        assert "model chat unchanged" in again.stdout and "api key team unchanged" in again.stdout
        assert "created" not in again.stdout

        # Ready, as the read models tell it.
        deadline = time.monotonic() + 60
        while True:
            replicas = json.loads(ctl(up, "get", "replicas", "-o", "json").stdout)
            if len(replicas) == 3 and all(r["state"] == "ready" for r in replicas):
                break
            assert time.monotonic() < deadline, replicas
            await asyncio.sleep(0.3)
        assert sorted(r["id"] for r in replicas) == ["big-1", "chat-1", "chat-2"]
        assert all(r["endpoint"].startswith("http://127.0.0.1:") for r in replicas)
        for r in replicas:
            text = ctl(up, "describe", "replica", r["id"]).stdout
            node = r["nodes"][0]
            # How it got there: placed (with the reason), then started, loaded, ready.
            placed = text.index(f"place {r['id']} on {node}: {r['model']} has")
            assert placed < text.index("starting") < text.index("loading") < text.rindex("ready")
        await until(lambda: watch_out.read_text().count('"state": "ready"') >= 3, timeout=10)
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(10) == 130
        changes = [json.loads(line) for line in watch_out.read_text().splitlines() if line.startswith("{")]
        assert {c["type"] for c in changes} >= {"ADDED", "MODIFIED"}
        assert {c["object"]["id"] for c in changes if c["object"]["state"] == "ready"} == {"big-1", "chat-1", "chat-2"}
        table = ctl(up, "get", "decisions").stdout
        assert "place chat-1 on" in table and "chat has 0 of 2 replicas" in table

        # The burst: 10,000 operator events (a hundred models re-applied over
        # and over); the projector killed with SIGKILL half-way.
        [projector] = up.pids("projector")
        start = await bus.last_seq()
        n, sent = 10_000, 0

        async def burst() -> None:
            nonlocal sent
            while sent < n:
                chunk = [
                    ev.ModelApplied(
                        at=time.time(),
                        model=ev.ModelSpec(name=f"burst-{i % 100}", min_replicas=0, aliases=[f"v{i}"],
                                           profiles=[ev.ProfileSpec(name="p", gpus=1)]),
                    )
                    for i in range(sent, sent + 250)
                ]
                await asyncio.gather(*(publish(bus, e) for e in chunk))
                sent += len(chunk)

        publisher = asyncio.create_task(burst())
        await until(lambda: position(up.db) > start + 1000 or publisher.done(), timeout=60)
        assert not publisher.done(), "the burst ended before the projector could be killed in its middle"
        os.kill(projector, signal.SIGKILL)
        killed_at = position(up.db)
        await publisher
        last = await bus.last_seq()
        assert start < killed_at < last and last - start >= n

        # llmgw up starts it again; it resumes from its last commit.
        await until(lambda: len(up.pids("projector")) == 2, timeout=30)
        out = ctl(up, "get", "models", "-o", "json", "--timeout", "60")
        assert out.returncode == 0 and position(up.db) >= last, out.stderr
        assert len(json.loads(out.stdout)) == 102

        # The fleet is quiet after the burst (no model of it wants a
        # replica): the live rows and a rebuild describe the same log.
        settled = await bus.last_seq()
        await asyncio.sleep(1.0)
        assert await bus.last_seq() == settled and position(up.db) == settled
        rebuilt = tmp_path / "rebuilt.db"
        out = run_llmgw("projections", "rebuild", "--db", str(rebuilt), cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert f"up to event {settled}" in out.stdout
        live, fresh = tables(up.db), tables(rebuilt)
        for name in live:
            assert live[name] == fresh[name], name
        assert len(live["events"]) == settled
    finally:
        if bus is not None:
            await bus.close()
        processes.stop_all()
        up.stop()
