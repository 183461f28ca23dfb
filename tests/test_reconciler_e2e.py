"""End to end over a real nats-server: a rolling restart of a 4-replica model,
asked with `llmgw ctl restart --max-surge 1`, keeps 4 replicas ready
throughout, with the control plane, two simulated agents and the projector
as separate processes.

Throughout means at every event of the log: the test follows the log and
folds it as the control plane does, counting the model's ready replicas after
each message, so a dip between two polls could not go unseen."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from llmgw.bus.nats import NatsBus
from llmgw.core.contract import events as ev
from llmgw.core.folding.fold import apply
from llmgw.core.folding.state import State

from .conftest import REPO, run_llmgw

pytestmark = [pytest.mark.nats, pytest.mark.timeout(180)]

CATALOG = """\
models:
  - name: m
    min_replicas: 4
    drain_grace_s: 1
    profiles:
      - name: one
        gpus: 1
"""
OLD = ["m-1", "m-2", "m-3", "m-4"]


class Watch:
    """The log, followed and folded message by message."""

    def __init__(self) -> None:
        self.state = State()
        self.ready = 0  # the model's ready replicas now
        self.least = None  # the fewest seen since 4 were first ready
        self.dips: list[str] = []
        self.restarts: list[ev.Action] = []  # RestartReplica and StopReplica of the old ones

    def on_message(self, seq: int, subject: str, data: bytes) -> None:
        apply(self.state, seq, subject, data)
        self.ready = sum(1 for r in self.state.replicas.values() if r.model == "m" and r.state == "ready")
        if self.least is None and self.ready >= 4:
            self.least = self.ready
        elif self.least is not None:
            self.least = min(self.least, self.ready)
            if self.ready < 4:
                said = ev.decode(data)
                self.dips.append(f"seq {seq}: {self.ready} ready after {type(said).__name__}: {said}")
        if subject.startswith("llmgw.control.") and b"control.decided" in data:
            for a in ev.decode(data).actions:
                if isinstance(a, ev.RestartReplica) or (isinstance(a, ev.StopReplica) and a.replica in OLD):
                    self.restarts.append(a)

    def replaced(self) -> bool:
        reps = self.state.replicas.values()
        return not any(r.id in OLD for r in reps) and sum(1 for r in reps if r.state == "ready") == 4


async def until(predicate, timeout: float, what) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout:g}s: {what()}")
        await asyncio.sleep(0.05)


def test_a_rolling_restart_with_max_surge_1_keeps_four_replicas_ready_throughout(nats_server, processes, tmp_path):
    url = nats_server.url
    db = tmp_path / "readmodels.db"
    processes.start("control", "control", "--nats", url, "--state-dir", str(tmp_path / "state"))
    for name in ("gpu-1", "gpu-2"):  # 6 GPUs for 4 replicas: room for one beside them
        processes.start(
            name, "agent", "--simulate", "--name", name, "--gpus", "3", "--ready-after", "0.3", "--nats", url
        )
    # The projector: `llmgw ctl restart` checks the replicas against the read models.
    log = open(tmp_path / "projector.log", "ab")
    projector = subprocess.Popen(
        [sys.executable, "-m", "llmgw.projections", "--nats", url, "--db", str(db)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO,
    )  # fmt: skip
    log.close()
    processes.procs.append(projector)  # stopped by PID with the others
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)

    async def go() -> Watch:
        out = await asyncio.to_thread(run_llmgw, "ctl", "--nats", url, "apply", "-f", str(catalog), cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        watch = Watch()
        bus = await NatsBus.connect(url)
        follower = await bus.follow(1, watch.on_message)
        try:
            await until(lambda: watch.ready == 4, 60, lambda: f"{watch.ready} ready: {watch.state.replicas}")
            restart = await asyncio.to_thread(
                run_llmgw, "ctl", "--nats", url, "--db", str(db), "restart", *OLD, "--max-surge", "1", cwd=tmp_path,
            )  # fmt: skip
            assert restart.returncode == 0, restart.stderr
            await until(watch.replaced, 90, lambda: {r.id: (r.state, r.restart) for r in watch.state.replicas.values()})
            await asyncio.sleep(0.5)  # anything after the last replacement: no stop of a new one
        finally:
            await follower.stop()
            await bus.close()
        return watch

    watch = asyncio.run(go())
    assert watch.dips == [], "\n".join(watch.dips)
    assert watch.least is not None and watch.least >= 4
    assert watch.ready == 4 and watch.replaced()
    # Each replaced beside itself, one at a time, and drained once its replacement served.
    begun = [a.replica for a in watch.restarts if isinstance(a, ev.RestartReplica)]
    assert sorted(begun) == OLD and not any(a.in_place for a in watch.restarts if isinstance(a, ev.RestartReplica))
    stops = [a for a in watch.restarts if isinstance(a, ev.StopReplica)]
    assert sorted(a.replica for a in stops) == OLD
    assert {a.reason for a in stops} == {"restarted: its replacement serves"} and {a.drain_s for a in stops} == {1.0}
    assert watch.state.quarantine_count == 0 and watch.state.voided_count == 0
    assert not (set(watch.state.replicas) & set(OLD))
