"""Engine processes: start, find again, watch, stop, and say how they ended.

Each engine runs under `llmgw.agent.runner`, started here in a session (and
so a process group) of its own: a Ctrl-C or SIGTERM meant for the agent does
not reach it, and it outlives an agent restart. Its output goes to a log file
per shard under the agent's state dir, opened for appending, each start
headed by a line that says what was started. Nothing here knows the bus: the
agent service (`node.py`) decides, this module does the system calls.

A process is "ours" only while its pid is alive, not a zombie, and its
/proc/<pid>/cmdline is exactly the command line recorded when it was
started (pids are reused; the runner's command line names the shard and
its generation).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .engines import Launch

LOG_ROTATE_BYTES = 64 << 20
TAIL_LINES = 3
TAIL_CHARS = 600

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # engines are never behind a proxy


@dataclass
class Proc:
    pid: int  # the runner's
    argv: list[str]  # the runner's command line, as /proc must show it
    log: Path
    status: Path
    popen: subprocess.Popen | None = None  # None: adopted (not our child)


def runner_argv(launch: Launch, status: Path, shard: str, generation: int, python: str = sys.executable) -> list[str]:
    return [
        python, "-m", "llmgw.agent.runner", "--status", str(status), "--shard", shard, "--generation", str(generation),
        "--", *launch.argv,
    ]  # fmt: skip


def spawn(launch: Launch, *, log: Path, status: Path, shard: str, generation: int, python: str = sys.executable) -> Proc:
    log.parent.mkdir(parents=True, exist_ok=True)
    status.parent.mkdir(parents=True, exist_ok=True)
    status.unlink(missing_ok=True)
    if log.exists() and log.stat().st_size > LOG_ROTATE_BYTES:
        log.replace(log.with_suffix(".log.1"))
    argv = runner_argv(launch, status, shard, generation, python)
    # The agent's alone (0600): an engine may print its key (SGLang prints its arguments).
    with open(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        env_words = " ".join(f"{k}={v}" for k, v in launch.env.items())
        head = f"--- llmgw: {shard} generation {generation} started at {stamp}: {env_words} {' '.join(launch.argv)}\n"
        if launch.key:  # logs are read by operators (over NATS too): the key is not theirs
            head = head.replace(launch.key, "<engine key>")
        out.write(head.encode())
        out.flush()
        popen = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **launch.env, "PYTHONUNBUFFERED": "1"},
            close_fds=True,
        )
    return Proc(pid=popen.pid, argv=argv, log=log, status=status, popen=popen)


def cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [w.decode(errors="surrogateescape") for w in raw.split(b"\0")[:-1]] if raw else []


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The state follows the command name, which is in parentheses and may hold spaces.
            return f.read().rpartition(b")")[2].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def is_ours(pid: int, argv: list[str]) -> bool:
    """The process `pid` is alive and runs exactly `argv` (so it is the one we started)."""
    if pid <= 0:
        return False
    return cmdline(pid) == argv and not _zombie(pid)


def alive(proc: Proc) -> bool:
    if proc.popen is not None:
        return proc.popen.poll() is None
    return is_ours(proc.pid, proc.argv)


def read_status(proc: Proc) -> dict:
    try:
        return json.loads(proc.status.read_text())
    except (OSError, ValueError):
        return {}


def engine_pid(proc: Proc) -> int:
    """The engine's own pid (the runner's child), 0 until it is known."""
    return int(read_status(proc).get("engine") or 0)


def tail(log: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last non-empty lines of a log (read from its end: logs grow large)."""
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    out = [line.rstrip() for line in text.splitlines() if line.strip()]
    return out[-lines:]


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "ended without a recorded exit status (its runner was killed)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "?"
        return f"killed by signal {-returncode} ({name})"
    return f"exited with code {returncode}"


def exit_reason(proc: Proc, *, while_away: bool = False) -> str:
    """How the engine ended, and the last lines of its log: a failed shard's reason."""
    rc = read_status(proc).get("returncode")
    if rc is not None:
        words = f"engine {describe_exit(rc)}"
    elif proc.popen is not None and proc.popen.returncode is not None:
        # The runner ended without recording the engine's end: it was killed
        # itself, and the engine with it (PR_SET_PDEATHSIG).
        words = f"engine's runner {describe_exit(proc.popen.returncode)}, and the engine with it"
    else:
        words = f"engine {describe_exit(None)}"
    if while_away:
        words += " while its agent was away"
    lines = [line for line in tail(proc.log) if not line.startswith("--- llmgw:")]
    if lines:
        text = " | ".join(lines)
        words += f"; last log lines: {text[-TAIL_CHARS:]}"
    return words


def reap(proc: Proc) -> None:
    if proc.popen is not None:
        proc.popen.poll()


def signal_runner(proc: Proc, sig: int) -> None:
    if proc.pid <= 0:  # 0 or -1 would signal our own group, or everything
        return
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass


def kill_group(proc: Proc) -> None:
    """SIGKILL the runner's whole process group: the engine and anything it started."""
    if proc.pid <= 0:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def wait_exit(proc: Proc, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(proc):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def terminate(proc: Proc, timeout: float) -> None:
    """SIGTERM (the runner passes it on), then SIGKILL to the group after `timeout`."""
    if not alive(proc):
        return
    signal_runner(proc, signal.SIGTERM)
    if not await wait_exit(proc, timeout):
        kill_group(proc)
        await wait_exit(proc, 5.0)
    reap(proc)


# --------------------------------------------------------------------------- HTTP


def _get(url: str, timeout: float, key: str = "") -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with _opener.open(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


async def http_get(host: str, port: int, path: str, timeout: float = 2.0, key: str = "") -> tuple[int, bytes] | None:
    """(status, body) of a GET (with the engine's `key`), or None when nothing answers (refused, reset, timed out)."""
    url = f"http://{_url_host(host)}:{port}{path}"
    try:
        return await asyncio.to_thread(_get, url, timeout, key)
    except (OSError, ValueError, urllib.error.URLError):
        return None


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def inflight(metrics: bytes, names: tuple[str, ...]) -> int | None:
    """The sum of the named gauges in Prometheus text (None: none of them there)."""
    total, seen = 0.0, False
    for line in metrics.decode(errors="replace").splitlines():
        if not line or line[0] == "#":
            continue
        name, _, rest = line.partition(" ")
        name = name.partition("{")[0]
        if name in names:
            try:
                total += float(rest.split()[0])
                seen = True
            except (ValueError, IndexError):
                continue
    return int(total) if seen else None


def port_taken(host: str, port: int) -> bool:
    """Something already listens on (host, port): an engine there would fail to bind."""
    bind = "0.0.0.0" if host in ("", "0.0.0.0") else host
    with socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind, port))
        except OSError:
            return True
    return False
