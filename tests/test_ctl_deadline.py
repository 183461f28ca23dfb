"""`llmgw ctl` keeps its word (issue 35, finding 8): every --timeout is a
deadline for the whole command, whatever NATS does, and a busy JetStream API
is tried again within it, then said in one line (exit 3), never a traceback.

Seen before: after NATS went away, two `ctl apply --timeout 15` hung for more
than 6 minutes; during a flood, `ctl apply` died with a traceback.

Over real processes: a real nats-server with JWT auth, the real `llmgw ctl`
as a child process with the operator's credential; NATS stopped (SIGSTOP:
frozen, its sockets open, the worst case; SIGKILL: gone) by its PID in the
middle of an apply, or never there; a JetStream API that drops requests
(nats-server's request_queue_limit) under a flood of API requests."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from llmgw.bus.nats import NatsBus
from llmgw.bus.server import NatsServer, free_port

pytestmark = pytest.mark.nats

TIMEOUT = 5.0
# What the command may take past its --timeout: the backstop's grace, a close,
# and the start of a Python process (about 1 s here, loaded).
MARGIN = 4.0
MODELS = 300  # enough publishes for the apply to be mid-way when NATS is stopped


def catalog(folder, models: int = MODELS) -> str:
    path = folder / "catalog.yaml"
    path.write_text("models:\n" + "".join(
        f"  - name: m{i}\n    min_replicas: 0\n    profiles:\n      - name: one\n        gpus: 1\n" for i in range(models)
    ))  # fmt: skip
    return str(path)


def ctl(folder, nats: str, creds: str, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("LLMGW_STATE_DIR", "LLMGW_CREDS", "LLMGW_DB", "LLMGW_NATS")}
    return subprocess.Popen(
        [sys.executable, "-m", "llmgw", "ctl", *args, "--nats", nats, "--creds", creds],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=folder, env=env,
        start_new_session=True,
    )  # fmt: skip


def finished(proc: subprocess.Popen, started: float) -> tuple[int, str, str, float]:
    """Its exit, output and time; killed (and the test failed) if it outlives --timeout and the margin."""
    try:
        out, err = proc.communicate(timeout=TIMEOUT + MARGIN + 5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"ctl still ran {TIMEOUT + MARGIN + 5:g}s after it started (--timeout {TIMEOUT:g}):\n{err}")
    return proc.returncode, out, err, time.monotonic() - started


def one_line_exit_3(rc: int, err: str, took: float) -> None:
    assert rc == 3, err
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert took < TIMEOUT + MARGIN, f"took {took:.1f}s for --timeout {TIMEOUT:g}"


async def make_streams(server: NatsServer) -> None:
    bus = await NatsBus.connect(server.url, name="test-control", creds=server.creds("control"))
    try:
        await bus.ensure_streams()
    finally:
        await bus.close()


def test_apply_against_a_nats_that_was_never_there_is_one_line_exit_3(tmp_path):
    from llmgw.bus.keystore import Keystore

    creds = str(Keystore(tmp_path / "creds").init().ensure("operator"))
    started = time.monotonic()
    proc = ctl(tmp_path, f"nats://127.0.0.1:{free_port()}", creds, "apply", "-f", catalog(tmp_path, 1),
               "--timeout", str(TIMEOUT))
    rc, _, err, took = finished(proc, started)
    one_line_exit_3(rc, err, took)
    assert "cannot reach NATS" in err


@pytest.mark.parametrize("how", [signal.SIGSTOP, signal.SIGKILL], ids=["frozen", "killed"])
async def test_apply_whose_nats_is_stopped_midway_returns_within_its_timeout(tmp_path, auth_nats, how):
    await make_streams(auth_nats)
    watcher = await NatsBus.connect(auth_nats.url, name="test-watch", creds=str(auth_nats.auth.issue_unrestricted(tmp_path / "all.creds")))
    seen = asyncio.Event()
    count = 0

    async def on_applied(msg) -> None:
        nonlocal count
        count += 1
        if count == 5 and not seen.is_set():  # mid-way: five of the catalog's models published
            os.kill(auth_nats.proc.pid, how)
            seen.set()

    await watcher.nc.subscribe("llmgw.ctl.model.applied", cb=on_applied)
    await watcher.nc.flush()
    started = time.monotonic()
    proc = ctl(tmp_path, auth_nats.url, auth_nats.creds("operator"), "apply", "-f", catalog(tmp_path), "--timeout", str(TIMEOUT))
    try:
        await asyncio.wait_for(seen.wait(), TIMEOUT + MARGIN)
        rc, out, err, took = await asyncio.to_thread(finished, proc, started)
    finally:
        if how == signal.SIGSTOP and auth_nats.proc.poll() is None:
            os.kill(auth_nats.proc.pid, signal.SIGCONT)  # so that the fixture's SIGTERM stops it
        watcher.nc._closing = True
        await watcher.nc.close()
    one_line_exit_3(rc, err, took)
    assert "did not answer" in err or "cannot reach" in err or "NATS" in err, err
    assert "model m0 created" in out  # it was mid-way: what it published before says so


async def _flood(url: str, creds: str, stop: asyncio.Event) -> int:
    """JetStream API requests (stream info) as fast as they are answered or dropped, until `stop`."""
    import nats

    nc = await nats.connect(url, user_credentials=creds)
    inbox = nc.new_inbox()  # (no one listens: the answers, if any, go nowhere)
    sent = 0
    try:
        while not stop.is_set():
            for _ in range(200):
                await nc.publish("$JS.API.STREAM.INFO.LLMGW", b"", reply=inbox)
                await nc.publish("$JS.API.CONSUMER.INFO.LLMGW.none", b"", reply=inbox)
            sent += 400
            await nc.flush()
            await asyncio.sleep(0)
    finally:
        await nc.close()
    return sent


@pytest.fixture
def busy_nats(tmp_path):
    """A nats-server with auth whose JetStream API takes few requests at once
    (request_queue_limit): under a flood it drops them, so a client's API
    calls go unanswered, as a real one's did under the flood of finding 6."""
    from llmgw.bus.keystore import Keystore

    keys = Keystore(tmp_path / "creds").init()
    port = free_port()
    with NatsServer(tmp_path / "nats", port, auth=keys) as server:  # the streams made by a server at ease
        asyncio.run(make_streams(server))
    # A request that finds one waiting has them all dropped: at ease, one at a time, each is answered.
    server = NatsServer(tmp_path / "nats", port, auth=keys, jetstream={"request_queue_limit": 1}).start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_busy_jetstream_api_is_tried_again_then_said_in_one_line(tmp_path, busy_nats):
    flooder = str(busy_nats.auth.issue_unrestricted(tmp_path / "flood.creds"))
    operator = busy_nats.creds("operator")

    # Busy all along: tried again while --timeout lasts, then one line, exit 3. (That a call the
    # bus answers late is tried again until it answers: the test below, with the 429 itself.)
    stop = asyncio.Event()
    flood = asyncio.create_task(_flood(busy_nats.url, flooder, stop))
    await asyncio.sleep(0.5)
    started = time.monotonic()
    try:
        proc = ctl(tmp_path, busy_nats.url, operator, "apply", "-f", catalog(tmp_path, 3), "--timeout", str(TIMEOUT))
        rc, out, err, took = await asyncio.to_thread(finished, proc, started)
    finally:
        stop.set()
        sent = await flood
    assert sent > 1000
    assert "queue limit reached" in (busy_nats.store_dir / "nats-server.log").read_text()  # it was busy for real
    one_line_exit_3(rc, err, took)
    assert "did not answer" in err, err


def test_the_retry_takes_the_real_429_and_gives_up_at_the_deadline():
    """nats-server answers a JetStream API call it is too busy for with 429
    "too many requests" (the error a `ctl apply` died of with a traceback).
    The flood above makes it drop requests rather than answer 429, and no
    flood here produced a 429 for real, so the retry is given nats-py's own
    error for that answer (no NATS faked: the error type and fields are the
    client's, as `APIError.from_error` makes them from the server's JSON)."""
    from nats.js.errors import APIError

    from llmgw.bus import BusUnavailable
    from llmgw.ctl import deadline

    busy = APIError(code=429, err_code=10167, description="too many requests")
    calls = 0

    async def busy_twice():
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise busy
        return "answered"

    async def always_busy():
        raise busy

    async def main():
        async with deadline.running(3.0):
            assert await deadline.retrying("a test", busy_twice) == "answered"
        assert calls == 3
        started = time.monotonic()
        with pytest.raises(BusUnavailable) as e:
            async with deadline.running(1.5):
                await deadline.retrying("a publish", always_busy)
        assert time.monotonic() - started < 1.5 + 0.5
        assert "\n" not in str(e.value) and "too many requests" in str(e.value) and "429" in str(e.value)
        # Not the bus being busy: said at once, not tried again.
        with pytest.raises(APIError):
            async with deadline.running(3.0):
                await deadline.retrying("a test", _refused)

    async def _refused():
        raise APIError(code=400, err_code=10052, description="bad request")

    asyncio.run(main())
