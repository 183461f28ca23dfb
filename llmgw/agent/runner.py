"""The process an engine runs under: it records how the engine ended.

    python -m llmgw.agent.runner --status FILE --shard ID --generation G -- ENGINE ARGV...

The agent starts this in a session of its own (so engines outlive an agent
restart), with the shard's log file as stdout and stderr. It starts the
engine as its child, writes the engine's pid to the status file, passes on
SIGTERM, SIGINT and SIGHUP, and when the engine exits writes its exit code
(negative: the signal that ended it) there, then exits the same way.

Why a process of its own: an agent that restarted is no longer the engine's
parent and cannot learn how it ended; this file tells it, so a shard that
died while its agent was away fails with its exit code or signal and its
last log lines like any other. The engine gets SIGKILL if the runner dies
(PR_SET_PDEATHSIG), so killing the runner kills the engine, and the agent
escalates to SIGKILL on the whole process group.

The shard and generation in the command line make it unique: an adopting
agent checks /proc/<pid>/cmdline against what it recorded.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1


def write_status(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # not Linux: the agent's SIGKILL to the group still reaches it
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llmgw.agent.runner")
    p.add_argument("--status", required=True)
    p.add_argument("--shard", default="")
    p.add_argument("--generation", default="")
    p.add_argument("engine", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    engine = args.engine[1:] if args.engine[:1] == ["--"] else args.engine
    if not engine:
        p.error("no engine command after --")
    status = {"runner": os.getpid(), "engine": 0, "started_at": time.time(), "argv": engine}
    try:
        child = subprocess.Popen(engine, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    except OSError as e:
        print(f"llmgw: cannot start {engine[0]}: {e.strerror or e}", file=sys.stderr, flush=True)
        write_status(args.status, {**status, "returncode": 127, "exited_at": time.time()})
        return 127
    write_status(args.status, {**status, "engine": child.pid})

    def forward(signum, frame) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            rc = child.wait()
            break
        except InterruptedError:  # pragma: no cover (PEP 475 retries)
            continue
    write_status(args.status, {**status, "engine": child.pid, "returncode": rc, "exited_at": time.time()})
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
