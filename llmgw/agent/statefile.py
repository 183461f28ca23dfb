"""What an agent must remember across its own restarts, in one file.

`<state dir>/agent.json` holds the engines this agent started (enough to
find each again and report it: its shard, generation, port, state and the
runner's pid and command line) and the commands it has acted on (shard,
generation, kind), so that a command redelivered or re-sent after a restart
is still acted on once, and the highest leader's term it has seen, so that
a deposed leader's command is refused after a restart too.

It holds the engines' keys, so it is the agent's alone (mode 0600).

Written whole or not at all (a temporary file, fsync, rename, fsync of the
folder): a crash leaves the old file or the new one, never half of one. An
unreadable file is set aside (`agent.json.bad`) and the agent starts from
nothing, which is safe: it registers with nothing running, the control plane
fails what it believed ran here, and an engine still running unseen holds
its port, so a second copy of it fails to start rather than serve twice.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec

from .protocol import KEEP_ACTED, Acted

log = logging.getLogger("llmgw.agent")

FILE = "agent.json"


class ShardRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    shard: str
    replica: str
    model: str
    profile: str
    generation: int
    rank: int = 0
    gpus: list[int] = []
    port: int = 0
    host: str = "127.0.0.1"
    endpoint: str = ""
    state: str = "starting"  # starting, loading, ready
    pid: int = 0  # the runner's; 0: not started yet
    argv: list[str] = []  # the runner's command line
    log: str = ""
    status: str = ""
    health: str = "/health"
    metrics: str = ""
    inflight: list[str] = []
    started_at: float = 0.0
    stopping: bool = False
    stop_reason: str = ""
    failure: str = ""  # set when the agent stops it as failed (not healthy in time, stopped answering)
    fingerprint: str = ""  # of the profile it was started with: reported at registration (adoption)
    identity: str = ""  # the name its engine was given to answer to (engines.identity)
    key: str = ""  # its engine's key (engines.py): kept so that an adopting agent still has it


class AgentState(msgspec.Struct, kw_only=True, omit_defaults=True):
    node: str = ""
    shards: dict[str, ShardRecord] = {}
    # (shard, generation, "start" | "stop"), oldest first.
    acted: list[tuple[str, int, str]] = []
    # The highest leader's term of a command seen: one of an older term is
    # from a deposed leader and never acted on, after a restart too.
    term: int = 0
    log: str = ""  # the log that term counts in (commands.StartShard.log)


class StateFile:
    def __init__(self, state_dir: str | os.PathLike) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / FILE

    def load(self) -> AgentState:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return AgentState()
        try:
            return msgspec.json.decode(data, type=AgentState)
        except msgspec.MsgspecError as e:
            bad = self.path.with_suffix(".json.bad")
            log.error("%s cannot be read (%s): set aside as %s; starting from nothing", self.path, e, bad.name)
            os.replace(self.path, bad)
            return AgentState()

    def save(self, state: AgentState) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        del state.acted[:-KEEP_ACTED]
        tmp = self.path.with_suffix(".json.tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # a tmp left by an older run may have had another mode
            f.write(msgspec.json.format(msgspec.json.encode(state)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class StateMemory:
    """The command protocol's memory (protocol.Memory) in the state file:
    each remember() writes the file whole before the command is acted on,
    so a command is acted on once across the agent's restarts too, and a
    deposed leader stays fenced after one."""

    def __init__(self, file: StateFile, state: AgentState) -> None:
        self.file = file
        self.state = state
        self._acted = set(state.acted)

    @property
    def term(self) -> int:
        return self.state.term

    @term.setter
    def term(self, value: int) -> None:
        self.state.term = value

    @property
    def log(self) -> str:
        return self.state.log

    @log.setter
    def log(self, value: str) -> None:
        self.state.log = value

    def acted(self, key: Acted) -> bool:
        return key in self._acted

    def remember(self, key: Acted | None = None) -> None:
        if key is not None:
            self._acted.add(key)
            self.state.acted.append(key)
        self.file.save(self.state)  # (keeps the last KEEP_ACTED)
        if len(self._acted) > len(self.state.acted):
            self._acted = set(self.state.acted)
