"""Engine logs: where they are, and how to read them here or from afar.

An agent writes each shard's engine output to `<state dir>/logs/<shard>.log`
(the shard id made safe for a file name: `%2F` for `/`), appending across
restarts of the shard, each start headed by a `--- llmgw:` line. A replica's
logs are those of its shards (`<replica>.<rank>`) on each of its nodes.

Read locally with `read(state_dir, replica)`, or over NATS: every agent
answers core NATS requests on `llmgw.agent-logs.<node>` (not a JetStream
subject: logs are no part of the history), which is what `llmgw ctl logs`
uses. A request is JSON:

    {"replica": "smollm2-1", "lines": 100}                       the last 100 lines
    {"replica": "smollm2-1", "offsets": {"smollm2-1.0": 5120}}   what came after those offsets

and the answer `{"shards": {"smollm2-1.0": {"lines": [...], "offset": 6012}}}`
(or `{"error": "..."}`), so `--follow` is the same request repeated with the
offsets of the last answer (`follow`). A shard restarted with a new log
(rotated: smaller than the offset) is read again from its start.

    python -m llmgw.agent.logs REPLICA --state-dir DIR [--follow] [-n LINES]
    python -m llmgw.agent.logs REPLICA --node NODE [--nats URL] [--creds FILE] [--follow] [-n LINES]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote, unquote

from ..bus import auth

SUBJECT_PREFIX = "llmgw.agent-logs"
# An answer is a message the agent publishes, so it fits the agent's
# credential's payload limit (bus/auth.py AuthConfig.agent_max_payload:
# a larger one would be refused and the agent's connection closed), with
# room for the JSON around the lines and their escapes; `--follow` asks again
# for what is left.
MAX_ANSWER = auth.DEFAULTS.agent_max_payload - 4096
MAX_CHUNK = 16 * 1024  # bytes per shard in one answer
DEFAULT_LINES = 100


def subject(node: str) -> str:
    return f"{SUBJECT_PREFIX}.{node}"


def file_name(shard: str) -> str:
    return quote(shard, safe="-_.:") + ".log"


def logs_dir(state_dir: str | os.PathLike) -> Path:
    return Path(state_dir) / "logs"


def log_path(state_dir: str | os.PathLike, shard: str) -> Path:
    return logs_dir(state_dir) / file_name(shard)


def shards_of(folder: Path, replica: str) -> dict[str, Path]:
    """The log file of each shard of `replica` in a logs folder, by shard id."""
    pattern = re.compile(re.escape(replica) + r"\.\d+")
    out = {}
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return out
    for p in entries:
        if p.suffix == ".log":
            shard = unquote(p.name[: -len(".log")])
            if pattern.fullmatch(shard):
                out[shard] = p
    return out


def _last_lines(path: Path, lines: int) -> tuple[list[str], int]:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        start = max(0, size - MAX_CHUNK)
        f.seek(start)
        data = f.read(size - start)
    text = data.decode(errors="replace").splitlines()
    if start and text:
        text = text[1:]  # a line cut by where we started reading
    return text[-lines:] if lines > 0 else [], size


def _after(path: Path, offset: int) -> tuple[list[str], int]:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if offset > size:
            offset = 0  # rotated or truncated: read it again
        f.seek(offset)
        data = f.read(min(size - offset, MAX_CHUNK))
    # Only whole lines: the rest comes with the next read.
    cut = data.rfind(b"\n") + 1
    return data[:cut].decode(errors="replace").splitlines(), offset + cut


def read(
    state_dir: str | os.PathLike, replica: str, lines: int = DEFAULT_LINES, offsets: dict[str, int] | None = None
) -> dict:
    """The answer to a logs request, from the state dir of an agent on this machine."""
    shards = {}
    for shard, path in shards_of(logs_dir(state_dir), replica).items():
        try:
            if offsets is not None and shard in offsets:
                got, offset = _after(path, int(offsets[shard]))
            elif offsets is not None:
                got, offset = _after(path, 0)  # a shard that appeared while following
            else:
                got, offset = _last_lines(path, lines)
        except OSError as e:
            got, offset = [f"(cannot read {path}: {e.strerror})"], 0
        shards[shard] = {"lines": got, "offset": offset}
    return {"shards": shards}


def answer(state_dir: str | os.PathLike, request: bytes) -> bytes:
    """What an agent replies to a request on its logs subject."""
    try:
        req = json.loads(request or b"{}")
        replica = str(req["replica"])
        lines = int(req.get("lines", DEFAULT_LINES))
        offsets = req.get("offsets")
        if offsets is not None and not isinstance(offsets, dict):
            raise ValueError("offsets must be a mapping of shard to offset")
    except (ValueError, KeyError, TypeError) as e:
        return json.dumps({"error": f"a logs request is JSON with a replica: {e}"}).encode()
    out = json.dumps(read(state_dir, replica, lines, offsets), ensure_ascii=False).encode()
    if len(out) > MAX_ANSWER:
        return json.dumps({"error": f"the answer ({len(out)} bytes) is larger than an agent may send ({MAX_ANSWER}): ask for fewer lines"}).encode()
    return out


async def fetch(
    nc, node: str, replica: str, lines: int = DEFAULT_LINES, offsets: dict[str, int] | None = None, timeout: float = 5.0
) -> dict:
    """Ask the agent of `node` (nc: a connected nats-py client)."""
    req: dict = {"replica": replica, "lines": lines}
    if offsets is not None:
        req["offsets"] = offsets
    try:
        msg = await nc.request(subject(node), json.dumps(req).encode(), timeout=timeout)
    except Exception as e:  # no responders, timeout
        raise ConnectionError(f"the agent of node {node} did not answer ({type(e).__name__}: {e}): is it running?") from None
    out = json.loads(msg.data)
    if "error" in out:
        raise ValueError(out["error"])
    return out


async def fetch_all(
    nc, nodes: list[str], replica: str, lines: int = DEFAULT_LINES, offsets: dict[str, int] | None = None
) -> dict:
    """The answers of the agents of every node of a replica (a multi-node
    replica's shards are on several), merged: what `llmgw ctl logs` asks."""
    merged: dict = {"shards": {}}
    for node in nodes:
        merged["shards"].update((await fetch(nc, node, replica, lines, offsets))["shards"])
    return merged


async def follow(get, lines: int = DEFAULT_LINES, interval: float = 0.5) -> AsyncIterator[tuple[str, str]]:
    """(shard, line) as they come; `get(lines, offsets)` is `fetch` or `read` bound to a place."""
    answer_ = await get(lines, None)
    offsets = {}
    for shard, got in answer_["shards"].items():
        offsets[shard] = got["offset"]
        for line in got["lines"]:
            yield shard, line
    while True:
        await asyncio.sleep(interval)
        answer_ = await get(lines, offsets)
        for shard, got in answer_["shards"].items():
            offsets[shard] = got["offset"]
            for line in got["lines"]:
                yield shard, line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmgw.agent.logs", description="the engine logs of a replica")
    p.add_argument("replica")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--state-dir", help="the state dir of an agent on this machine")
    where.add_argument("--node", help="ask this node's agent over NATS")
    p.add_argument("--nats", default=os.environ.get("LLMGW_NATS", "nats://127.0.0.1:4222"))
    p.add_argument("--creds", help="NATS credential (default $LLMGW_CREDS, else the local llmgw up's)")
    p.add_argument("-n", "--lines", type=int, default=DEFAULT_LINES)
    p.add_argument("-f", "--follow", action="store_true")
    args = p.parse_args(argv)

    async def run() -> int:
        nc = None
        if args.node:
            # As every component connects: with a credential (an operator's may ask agents for logs).
            from ..bus.nats import NatsBus
            from ..ctl.locate import locate

            nc = (await NatsBus.connect(args.nats, name="llmgw-logs", creds=locate(args.nats, creds=args.creds).creds)).nc

            async def get(lines, offsets):
                return await fetch(nc, args.node, args.replica, lines, offsets)
        else:

            async def get(lines, offsets):
                return read(args.state_dir, args.replica, lines, offsets)

        try:
            if not args.follow:
                got = (await get(args.lines, None))["shards"]
                if not got:
                    print(f"no logs of {args.replica} here", file=sys.stderr)
                    return 1
                for shard, part in got.items():
                    for line in part["lines"]:
                        print(f"{shard}: {line}" if len(got) > 1 else line)
                return 0
            async for shard, line in follow(get, args.lines):
                print(f"{shard}: {line}", flush=True)
            return 0
        finally:
            if nc is not None:
                await nc.close()

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:
        return 130
    except (ConnectionError, OSError, ValueError) as e:
        print(f"llmgw logs: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
