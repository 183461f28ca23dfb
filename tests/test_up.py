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

import openai
import pytest

from llmgw.bus.server import free_port

from .conftest import engine_ports, run_llmgw

pytestmark = pytest.mark.nats


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
            "--gateway-port", str(gateway_port or free_port()), "--engine-ports", engine_ports(), *extra,
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


def nats_pid_of(tmp_path) -> int:
    """The nats-server that this test's `llmgw up` started, from the pid file in its state dir."""
    return int((tmp_path / "state" / "nats" / "nats-server.pid").read_text())


def test_up_serves_nats_runs_the_control_plane_and_ctrl_c_stops_everything(tmp_path):
    port = free_port()
    proc, lines = start_up(tmp_path, port)
    try:
        text = "".join(lines)
        assert f"NATS (JetStream) at nats://127.0.0.1:{port}" in text
        control_pid = int(re.search(r"control plane: pid (\d+)", text).group(1))
        nats_pid = nats_pid_of(tmp_path)
        catalog = tmp_path / "c.yaml"
        catalog.write_text("models:\n  - name: m\n    profiles: [{name: p, gpus: 1}]\n")
        out = run_llmgw("ctl", "--nats", f"nats://127.0.0.1:{port}", "apply", "-f", str(catalog))
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
        out = run_llmgw("replay", "--nats", f"nats://127.0.0.1:{port}", "--json")
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
        out = run_llmgw("up", "--nats-port", str(port), "--gateway-port", str(free_port()), "--state-dir",
                        str(tmp_path / "s"), "--no-agent", timeout=30)
        assert out.returncode == 2
        assert f"port {port} on 127.0.0.1 is taken" in out.stderr
        # The gateway's too, before anything is started.
        out = run_llmgw("up", "--nats-port", str(free_port()), "--gateway-port", str(port), "--state-dir",
                        str(tmp_path / "s2"), "--no-agent", timeout=30)
        assert out.returncode == 2
        assert f"the gateway's port {port} is taken: give another with --gateway-port" in out.stderr
