"""Real processes for the chaos tests and `benchmarks/chaos.py`: nats-server
(one, or a 3-server cluster from deploy/nats/ on free loopback ports),
`llmgw control` processes, simulated agents; and what the log then says
(who led when, who decided, how many replicas were ready at every event,
whether a GPU was ever held twice, which nodes were declared lost).

Everything here starts its own processes, on free ports, and stops them by
PID; nothing waits without a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.bus import COMMAND_STREAM, read_log, signing
from llmgw.bus.nats import NatsBus
from llmgw.bus.server import NatsServer, free_port, nats_server_binary
from llmgw.core.folding import commands as cmds
from llmgw.core.contract import events as ev
from llmgw.core.folding.fold import apply
from llmgw.core.folding.state import State, gpus_in_use

REPO = Path(__file__).resolve().parent.parent


def catalog(min_replicas: int, name: str = "m", gpus: int = 1, extra: str = "") -> str:
    return (
        f"models:\n  - name: {name}\n    min_replicas: {min_replicas}\n    profiles:\n"
        f"      - name: p\n        gpus: {gpus}\n{extra}"
    )


class Cluster:
    """Three nats-servers from deploy/nats/cluster-N.conf, rewritten to free
    loopback ports and a store of their own each, without the configs' auth
    and TLS (tests/test_auth_cluster.py runs those)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = [free_port() for _ in range(3)]
        self.routes = [free_port() for _ in range(3)]
        self.procs: list[subprocess.Popen | None] = [None, None, None]

    @property
    def url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.ports)

    def _conf(self, i: int) -> Path:
        text = (REPO / "deploy" / "nats" / f"cluster-{i + 1}.conf").read_text()
        routes = "\n".join(f"    nats://127.0.0.1:{p}" for p in self.routes)
        text = re.sub(r"^listen: \S+", f"listen: 127.0.0.1:{self.ports[i]}", text, flags=re.M)  # the clients' (top level)
        text = re.sub(r"http: .*\n", "", text)
        text = re.sub(r"store_dir: .*", f"store_dir: {json.dumps(str(self.root / f'n{i + 1}'))}", text)
        text = re.sub(r"^(\s+)listen: \S+", lambda m: f"{m.group(1)}listen: 127.0.0.1:{self.routes[i]}", text, flags=re.M)  # the routes' (cluster block)
        text = re.sub(r"routes: \[[^\]]*\]", f"routes: [\n{routes}\n  ]", text, flags=re.S)
        # The cluster's mechanics only (elections, failover): its auth and TLS
        # are tested on the same configs by tests/test_auth_cluster.py.
        text = re.sub(r'include "auth\.conf"\n', "", text)
        text = re.sub(r"\n\s*tls \{[^}]*\}", "", text)
        path = self.root / f"cluster-{i + 1}.conf"
        path.write_text(text)
        return path

    def start(self, i: int | None = None) -> "Cluster":
        self.root.mkdir(parents=True, exist_ok=True)
        for j in range(3) if i is None else [i]:
            log = open(self.root / f"nats-{j + 1}.log", "ab")
            self.procs[j] = subprocess.Popen(
                [nats_server_binary(), "-c", str(self._conf(j))], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            log.close()
        for j in range(3) if i is None else [i]:
            wait_port(self.ports[j])
        return self

    def kill9(self, i: int) -> None:
        p = self.procs[i]
        if p is not None and p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)

    def stop(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            if p is not None:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def stream_leader(self, stream: str = "LLMGW") -> int:
        """Which of the three leads a stream (its index), asked of JetStream."""

        async def ask() -> str:
            bus = await NatsBus.connect(self.url)
            try:
                info = await bus.js.stream_info(stream)
                return info.cluster.leader
            finally:
                await bus.close()

        name = asyncio.run(ask())
        return int(name.rsplit("-", 1)[1]) - 1


def wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                if s.recv(5) == b"INFO ":
                    return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing answers on port {port}")


class Fleet:
    """Processes started for one run, each in a session of its own, stopped by PID."""

    def __init__(self, root: Path, url: str) -> None:
        self.root, self.url = root, url
        self.procs: dict[str, subprocess.Popen] = {}
        root.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, *args: str, module: str = "llmgw") -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=self.root,
        )  # fmt: skip
        log.close()
        self.procs[name] = proc
        return proc

    def control(self, name: str, lease_ttl: float = 2.0, node_grace: float = 10.0, replicas: int = 1) -> subprocess.Popen:
        return self.start(
            name, "control", "--nats", self.url, "--state-dir", str(self.root / name), "--lease-ttl", str(lease_ttl),
            "--node-grace", str(node_grace), "--stream-replicas", str(replicas),
        )  # fmt: skip

    @property
    def db(self) -> Path:
        return self.root / "read-models.sqlite"

    def projector(self) -> subprocess.Popen:
        return self.start("projector", "--nats", self.url, "--db", str(self.db), module="llmgw.projections")

    def agent(self, name: str, gpus: int = 8) -> subprocess.Popen:
        return self.start(name, "agent", "--simulate", "--name", name, "--gpus", str(gpus), "--ready-after", "0.2",
                          "--nats", self.url)

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "llmgw", "ctl", "--nats", self.url, "--db", str(self.db), *args], capture_output=True, text=True,
            timeout=timeout, stdin=subprocess.DEVNULL, cwd=self.root,
        )  # fmt: skip

    def apply(self, text: str) -> subprocess.CompletedProcess:
        path = self.root / f"catalog-{time.monotonic_ns()}.yaml"
        path.write_text(text)
        return self.ctl("apply", "-f", str(path))

    def kill9(self, name: str) -> float:
        """SIGKILL by PID; the wall clock at the kill."""
        proc = self.procs[name]
        at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        return at

    def by_pid(self, pid: int) -> str:
        return next(n for n, p in self.procs.items() if p.pid == pid)

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def pid_of(leader_id: str) -> int:
    """A control plane's id is host-pid-random (control.plane.control_plane_id)."""
    return int(leader_id.rsplit("-", 2)[1])


# --------------------------------------------------------------------------- reading what happened


def records(url: str) -> list[tuple[int, str, bytes]]:
    async def go():
        bus = await NatsBus.connect(url)
        try:
            return await read_log(bus)
        finally:
            await bus.close()

    return asyncio.run(go())


def fold(recs) -> State:
    state = State()
    for seq, subject, data in recs:
        apply(state, seq, subject, data)
    return state


def commands_sent(url: str) -> list[tuple[str, cmds.Command]]:
    """Every command still in the command stream: (node, command)."""

    async def go():
        bus = await NatsBus.connect(url)
        try:
            info = await bus.js.stream_info(COMMAND_STREAM)
            want = info.state.messages
            got: list[tuple[str, cmds.Command]] = []
            if not want:
                return got
            done = asyncio.Event()

            async def cb(msg) -> None:
                # (signed by the control plane: the command inside its envelope, bus/signing.py)
                got.append((msg.subject.rsplit(".", 1)[1], cmds.decode(signing.unsigned_body(msg.data))))
                if len(got) >= want or msg.metadata.num_pending == 0:
                    done.set()

            from nats.js.api import ConsumerConfig, DeliverPolicy

            sub = await bus.js.subscribe("llmgw.cmd.>", stream=COMMAND_STREAM, ordered_consumer=True, cb=cb,
                                         config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
            try:
                await asyncio.wait_for(done.wait(), 30)
            finally:
                await sub.unsubscribe()
            return got
        finally:
            await bus.close()

    return asyncio.run(go())


@dataclass
class Story:
    """What a log says about leadership, readiness and placement."""

    elections: list[tuple[int, int, str, float]] = field(default_factory=list)  # (seq, term, leader, at)
    decisions_by_non_leaders: int = 0
    decisions: list[tuple[int, str, float]] = field(default_factory=list)  # (seq, leader, at) of each Decided
    gpu_twice: list[str] = field(default_factory=list)
    nodes_lost: list[str] = field(default_factory=list)
    min_ready_after: dict[int, int] = field(default_factory=dict)  # from a seq on: the fewest ready replicas seen

    def first_decision_of(self, leader: str) -> float | None:
        return next((at for _, who, at in self.decisions if who == leader), None)


def story(recs, model: str = "m", watch_from: tuple[int, ...] = ()) -> Story:
    s = Story()
    state = State()
    for seq, subject, data in recs:
        apply(state, seq, subject, data)
        try:
            e = ev.decode(data)
        except Exception:
            continue
        if isinstance(e, ev.LeaderElected) and state.term == e.term:
            s.elections.append((seq, e.term, e.leader, e.at))
        elif isinstance(e, ev.Decided):
            s.decisions.append((seq, e.leader, e.at))
            if e.leader != state.leader:
                s.decisions_by_non_leaders += 1
        elif isinstance(e, ev.NodeLost):
            s.nodes_lost.append(f"{e.node}: {e.reason}")
        held = gpus_in_use(state)
        if len({(n, g) for n, g, _ in held}) != len(held):
            s.gpu_twice.append(f"after event {seq}")
        ready = sum(1 for r in state.replicas.values() if r.model == model and r.state == "ready")
        for start in watch_from:
            if seq >= start:
                s.min_ready_after[start] = min(s.min_ready_after.get(start, ready), ready)
    return s


def wait_until(what: str, predicate, timeout: float, every: float = 0.3):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        time.sleep(every)


def ready_count(url: str, model: str = "m") -> int:
    state = fold(records(url))
    return sum(1 for r in state.replicas.values() if r.model == model and r.state == "ready")


def leader_now(fleet: Fleet) -> dict | None:
    """`ctl get leader -o json`: the leader's row, with every row under "rows"."""
    out = fleet.ctl("get", "leader", "-o", "json")
    if out.returncode != 0:
        return None
    rows = json.loads(out.stdout)
    leader = next((r for r in rows if r["role"] == "leader"), None)
    if leader is not None:
        leader["rows"] = rows
    return leader


def verify(url: str, root: Path) -> str:
    exported = root / f"log-{time.monotonic_ns()}.jsonl"
    subprocess.run([sys.executable, "-m", "llmgw", "replay", "--nats", url, "--export", str(exported)], check=True,
                   capture_output=True, timeout=120)
    out = subprocess.run([sys.executable, "-m", "llmgw", "replay", str(exported), "--verify"], capture_output=True,
                         text=True, timeout=300)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr


def single_server(root: Path) -> NatsServer:
    return NatsServer(root / "nats", free_port()).start()
