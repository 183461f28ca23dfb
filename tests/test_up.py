"""`llmgw up` as a newcomer runs it: one command, a clear error when its port
is taken, Ctrl-C stops everything it started, and a second run resumes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import openai
import pytest

from llmgw.bus.server import free_port

from .conftest import engine_ports, run_llmgw

pytestmark = pytest.mark.nats


def tools_creds(tmp_path) -> str:
    """The tools' credential `llmgw up --state-dir tmp_path/state` made."""
    return str(tmp_path / "state" / "creds" / "operator.creds")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; it only waits for its parent to notice.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def start_up(tmp_path, port: int, gateway_port: int = 0, extra: tuple = ("--no-agent",)) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "llmgw", "up", "--nats-port", str(port), "--state-dir", str(tmp_path / "state"),
            "--gateway-port", str(gateway_port or free_port()), "--console-port", str(free_port()), "--engine-ports", engine_ports(), *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        cwd=tmp_path,
    )
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("Ctrl-C stops everything"):
            return proc, lines
    proc.kill()
    raise AssertionError("llmgw up did not come up:\n" + "".join(lines))


def nats_pid_of(state: Path) -> int:
    """The pid of the nats-server of `llmgw up --state-dir state`, from its pid file
    (not by looking through /proc: other programs' servers are none of ours)."""
    return int((state / "nats" / "nats-server.pid").read_text().strip())


def test_up_serves_nats_runs_the_control_plane_and_ctrl_c_stops_everything(tmp_path):
    port = free_port()
    proc, lines = start_up(tmp_path, port)
    try:
        text = "".join(lines)
        assert f"NATS (JetStream) at nats://127.0.0.1:{port}" in text
        control_pid = int(re.search(r"control plane: pid (\d+)", text).group(1))
        nats_pid = nats_pid_of(tmp_path / "state")
        catalog = tmp_path / "c.yaml"
        catalog.write_text("models:\n  - name: m\n    profiles: [{name: p, gpus: 1}]\n")
        out = run_llmgw("ctl", "--nats", f"nats://127.0.0.1:{port}", "--creds", tools_creds(tmp_path), "apply", "-f", str(catalog))
        assert out.returncode == 0, out.stderr
        # The gateway it runs serves the catalog's models (the official SDK as client).
        url = re.search(r"gateway \(OpenAI API\): (http://\S+)", text).group(1)
        gateway_pid = int(re.search(r"gateway: pid (\d+)", text).group(1))
        client = openai.OpenAI(base_url=url, api_key="unused", timeout=5, max_retries=0)
        deadline = time.monotonic() + 30
        while True:
            try:
                if "m" in [m.id for m in client.models.list()]:
                    break
            except openai.APIConnectionError:
                pass
            assert time.monotonic() < deadline, "the gateway never listed the model"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    assert not pid_alive(control_pid) and not pid_alive(nats_pid) and not pid_alive(gateway_pid)

    # Again: the same log, resumed.
    proc, lines = start_up(tmp_path, port)
    try:
        out = run_llmgw("replay", "--nats", f"nats://127.0.0.1:{port}", "--creds", tools_creds(tmp_path), "--json")
        assert "m" in json.loads(out.stdout)["models"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def test_up_restarts_a_control_plane_that_died(tmp_path):
    port = free_port()
    proc, lines = start_up(tmp_path, port)
    try:
        control_pid = int(re.search(r"control plane: pid (\d+)", "".join(lines)).group(1))
        os.kill(control_pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        restarted = ""
        while time.monotonic() < deadline and "control plane: pid" not in restarted:
            restarted = proc.stdout.readline()
        assert "control plane: pid" in restarted
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def test_up_says_clearly_when_its_port_is_taken(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = run_llmgw("up", "--nats-port", str(port), "--gateway-port", str(free_port()), "--console-port", str(free_port()), "--state-dir",
                        str(tmp_path / "s"), "--no-agent", timeout=30)
        assert out.returncode == 2
        assert f"port {port} on 127.0.0.1 is taken" in out.stderr
        # The gateway's too, before anything is started.
        out = run_llmgw("up", "--nats-port", str(free_port()), "--gateway-port", str(port), "--console-port", str(free_port()), "--state-dir",
                        str(tmp_path / "s2"), "--no-agent", timeout=30)
        assert out.returncode == 2
        assert f"the gateway's port {port} is taken: give another with --gateway-port" in out.stderr


def test_free_ports_are_outside_the_kernels_ephemeral_range_and_never_given_twice():
    # A port from a bind to port 0 was at times a client socket's before our
    # server bound it (a test's gateway refused while another `llmgw up` ran):
    # free_ports gives none the kernel hands to outbound connections, none of
    # the engines' default range, none twice.
    from llmgw.bus.server import first_ephemeral_port, free_ports
    from llmgw.core.contract.limits import LIMITS

    firsts = [free_ports(16) for _ in range(20)]
    ports = [p for first in firsts for p in range(first, first + 16)] + [free_port() for _ in range(50)]
    assert len(ports) == len(set(ports))
    for p in ports:
        assert p < first_ephemeral_port() and not LIMITS.engine_port_first <= p <= LIMITS.engine_port_last
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))


# ------------------------------------------------- a rerun serves, one up per folder


def wait_for_log(processes, name: str, text: str, proc: subprocess.Popen, timeout: float) -> str:
    """The process's log once it holds `text` (a generous deadline: it came at all)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = processes.log(name)
        if text in log:
            return log
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{name} never said {text!r} (exit {proc.poll()}):\n{processes.log(name)[-4000:]}")


def stop_up(proc: subprocess.Popen) -> int:
    """Ctrl-C, as in a terminal, then wait for it: it stops its engines, then NATS."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    return proc.wait(60)


def ask(client: openai.OpenAI, timeout: float, said: Callable[[], str] = str) -> str:
    """The demo model's answer through the gateway, asked until it comes (or
    the deadline: then the failure shows `said()`, what `up` logged)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
            )
            return r.choices[0].message.content or ""
        except (openai.APIConnectionError, openai.APITimeoutError, openai.APIStatusError) as e:
            assert time.monotonic() < deadline, f"the model never answered through the gateway: {e}\n{said()}"
            time.sleep(0.5)


def whole_log(nats: str, creds: str | None = None) -> list[tuple[int, str, bytes]]:
    import asyncio

    from llmgw.bus import read_log
    from llmgw.bus.nats import NatsBus

    async def fetch():
        bus = await NatsBus.connect(nats, name="test-up", creds=creds)
        try:
            return await read_log(bus)
        finally:
            await bus.close()

    return asyncio.run(fetch())


@pytest.mark.timeout(600)  # the sum of its generous deadlines; it takes well under a minute
def test_a_rerun_of_up_right_after_ctrl_c_serves_again_and_places_nothing_twice(tmp_path, processes):
    # Issue 11: the rerun's replica stayed "placing" for ever (fold 7), and a
    # rerun at once was refused "port taken" by the gateway's own connections
    # in TIME_WAIT. The real engine, the openai SDK, the same ports both times.
    from llmgw.core.folding.fold import apply
    from llmgw.core.folding.state import State

    from .conftest import demo_gguf
    from .test_agent_e2e import placements
    from .test_properties import assert_no_gpu_given_twice

    demo_gguf()  # in the cache before `up` looks for it
    nats_port, gateway_port = free_port(), free_port()
    nats = f"nats://127.0.0.1:{nats_port}"
    argv = ("up", "--state-dir", str(tmp_path / "state"), "--nats-port", str(nats_port),
            "--gateway-port", str(gateway_port), "--console-port", str(free_port()), "--name", "node-a", "--engine-ports", engine_ports())  # fmt: skip
    first = processes.start("up-1", *argv)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key="unused", timeout=30, max_retries=0)
    try:
        said = wait_for_log(processes, "up-1", "smollm2 is ready", first, 180)
        # Issue 35: its control plane signs every command and its agent obeys only what was signed.
        assert "commands are signed with the key" in said and "acting only on commands signed with" in said
        assert ask(client, 60, lambda: processes.log("up-1")[-8000:])
        seq_before = json.loads(run_llmgw("replay", "--nats", nats, "--creds", tools_creds(tmp_path), "--json").stdout)["seq"]
    finally:
        # The client's connection still open: the gateway closes it, so the
        # TIME_WAIT is on the gateway's own port, which the rerun must take.
        assert stop_up(first) == 0, processes.log("up-1")[-4000:]
    assert (tmp_path / "state" / "up.lock").read_text().strip() == str(first.pid)  # left behind, blocks nothing

    second = processes.start("up-2", *argv)
    try:
        wait_for_log(processes, "up-2", "Ctrl-C stops everything", second, 60)
        assert "is taken" not in processes.log("up-2")
        # CI once saw the model parked here, five starts refused "port taken"
        # (not seen since): the logs of both runs say which program held it.
        assert ask(client, 120, lambda: f"up-1 said:\n{processes.log('up-1')[-4000:]}\nup-2 said:\n{processes.log('up-2')[-8000:]}")
        records = whole_log(nats, tools_creds(tmp_path))
    finally:
        client.close()
        assert stop_up(second) == 0, processes.log("up-2")[-4000:]
    assert records[-1][0] > seq_before, "the rerun's log did not go on from the first's"
    placed = placements(records)
    assert len(placed) == len(set(placed)), f"a replica id placed twice: {placed}"
    state = State()
    for seq, subject, data in records:
        apply(state, seq, subject, data)
        assert_no_gpu_given_twice(state)  # nor a port
    assert len([r for r in state.replicas.values() if r.model == "smollm2" and r.state == "ready"]) <= 1


def test_a_second_up_on_the_same_folder_refuses_naming_the_first(tmp_path):
    # Issue 11: a second `up` on one folder started a second NATS, projector
    # and agent on the same files; the first died on an IntegrityError and the
    # second deleted up.json on exit.
    port = free_port()
    proc, lines = start_up(tmp_path, port)
    try:
        up_file = tmp_path / "state" / "up.json"
        before = up_file.read_text()
        assert json.loads(before)["pid"] == proc.pid
        other_nats, other_gateway = free_port(), free_port()
        second = subprocess.Popen(
            [sys.executable, "-m", "llmgw", "up", "--nats-port", str(other_nats), "--gateway-port", str(other_gateway),
             "--console-port", str(free_port()), "--state-dir", str(tmp_path / "state"), "--no-agent"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=tmp_path,
        )  # fmt: skip
        try:
            stdout, stderr = second.communicate(timeout=30)
        finally:
            stop_up(second)  # had it started anything, it stops it all
        assert second.returncode == 3, stderr
        assert f"is in use by another llmgw up (pid {proc.pid})" in stderr
        assert "Traceback" not in stderr and stderr.count("\n") == 1
        assert "pid" not in stdout  # it started nothing
        # The first is untouched and still serves: its file, its NATS, its gateway.
        assert up_file.read_text() == before
        assert proc.poll() is None
        out = run_llmgw("replay", "--nats", f"nats://127.0.0.1:{port}", "--creds", tools_creds(tmp_path), "--json")
        assert out.returncode == 0, out.stderr
        url = re.search(r"gateway \(OpenAI API\): (http://\S+)", "".join(lines)).group(1)
        client = openai.OpenAI(base_url=url, api_key="unused", timeout=5, max_retries=0)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                assert time.monotonic() < deadline, "the first's gateway stopped answering"
                time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    # Gone with its holder: the same folder starts again.
    proc, _ = start_up(tmp_path, port)
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
