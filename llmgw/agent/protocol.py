"""The command protocol of an agent: one module for the real agent
(node.py) and the simulated ones (simulated.py, fleet.py), so the two cannot
drift apart (issue 33: they had).

What both do, here and nowhere else:

- The gate (`Gate`): which commands an agent acts on at all (signature,
  then term fencing; below).
- At most once (`CommandProtocol.on_command`): a start or stop is acted on
  once per (shard, generation, kind) (`acted_key`), however often it is
  redelivered or re-sent by a new leader. It is remembered (`Memory`)
  before it is acted on: the real agent's memory is its state file
  (statefile.StateMemory), so this holds across its restarts, and a crash
  between remembering and acting leaves the shard unreported at the next
  registration, which fails it (the safe side). A simulated node keeps it
  in memory (`InMemory`): it has no engines to find again after a restart.
  A start that does not name this node at its rank is ignored (not
  remembered); a start whose stop was acted on already is remembered and
  not acted on.
- Generations (`start_plan`, `stop_plan`): a start of a shard that runs here
  at that generation or a newer one starts nothing; of an older one, it
  replaces it (stopped first, reported stopped, `replaced_reason`). A stop
  of a generation that does not run here is acknowledged as stopped and
  touches what does run.
- Restart in place (`wait_after`): a start waits for the shards it replaces
  (`StartShard.after`) to exit, at most `AFTER_WAIT_S`.
- Registration (`CommandProtocol.listen`): commands are followed first, then
  the agent registers (a command sent in answer to the registration must
  find it listening); it registers again after every reconnect (commands
  sent while it was away may be lost: the control plane re-sends on a
  registration) and when asked (`Reregister`). What it runs is listed
  when the registration is built.

What an agent does with a command admitted once is its own (`Actions`): the
real one runs engines, a simulated one pretends to.

The gate. Every command that reaches an agent's subject passes, in this order:

1. The signature (bus/signing.py), with the key its operator configured:
   unsigned, signed with another key, signed for another node, or not
   decoding, it is refused. Why: any credential that could read the log
   made nats-server deliver its own command-shaped messages to
   `llmgw.cmd.<node>` (issue 35, finding 1), and the agent obeyed.
   An agent with no key configured (a dev NATS without auth) acts on
   unsigned commands, and says so loudly when it starts.
2. The term (core/folding/commands.py): within one log, a command of an older
   term than the highest seen is a deposed leader's, and refused; one more
   than `max_term_jump` ahead of it is refused too. Why: a forged
   re-register of term 10**9 was kept as the highest term, in the real
   agent's state file, and every genuine command after it was "older"
   for ever. A genuine leader moves the term by one per election, and an
   agent hears a command at every placement on it. A command of another
   log (NATS made anew) begins the count again, as before. The bound is a
   second line only: without a key, a forger repeating itself steps the
   term up `max_term_jump` at a time; the signature is what stops it. Its
   cost: a node that hears no command over more than `max_term_jump`
   elections refuses the leader until its agent file allows more.

A refused command changes nothing (the term kept above all): it is logged
with why (at most `REFUSAL_LOG_BURST` per reason every `REFUSAL_LOG_EVERY_S`,
the rest counted, so a flood of forgeries cannot fill the agent's log)
and counted by reason (`Gate.refused`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Callable, Literal, Protocol

import msgspec

from ..bus import signing
from ..core.folding import commands as cmds

log = logging.getLogger("llmgw.agent")

MAX_TERM_JUMP = 1000  # terms ahead of the highest seen (one log) that a command may be
KEEP_ACTED = 4096  # commands remembered as acted on; far more than are ever outstanding at once
# The longest a shard started in place of others waits for them to exit
# (their drain grace and stop timeout); then it starts, and a port still
# taken fails it with that reason.
AFTER_WAIT_S = 300.0
# Refusals logged: at most REFUSAL_LOG_BURST of one reason every REFUSAL_LOG_EVERY_S, the rest counted.
REFUSAL_LOG_EVERY_S = 10.0
REFUSAL_LOG_BURST = 20


Acted = tuple[str, int, str]  # (shard, generation, "start" | "stop"): see acted_key


class TermKept(Protocol):
    """Where an agent keeps the highest term it has seen and its log."""

    term: int
    log: str


class Memory(TermKept, Protocol):
    """What the protocol remembers of an agent: the highest term seen (and
    its log), and the commands acted on (at least the last KEEP_ACTED)."""

    def acted(self, key: Acted) -> bool: ...

    def remember(self, key: Acted | None = None) -> None:
        """Keep the term and log, and `key` as acted on: kept for good (where
        the agent keeps anything) before it returns, as it is acted on next."""


class InMemory:
    """Memory held in memory: a simulated node's, and the unit tests'. A
    restart forgets it, as it forgets the (pretended) engines."""

    def __init__(self, keep: int = KEEP_ACTED) -> None:
        self.term = 0
        self.log = ""
        self.keep = keep
        self.saves = 0  # remember() calls: how often a real agent would write its state file
        self._acted: dict[Acted, None] = {}  # oldest first

    def acted(self, key: Acted) -> bool:
        return key in self._acted

    def remember(self, key: Acted | None = None) -> None:
        self.saves += 1
        if key is not None:
            self._acted[key] = None
            while len(self._acted) > self.keep:
                del self._acted[next(iter(self._acted))]


def term_refusal(term: int, log_id: str, seen_term: int, seen_log: str, max_jump: int) -> str:
    """Why a command of `term` in log `log_id` is refused by an agent that has
    seen `seen_term` in `seen_log` ("" : it is not). `max_jump` 0: no bound ahead."""
    if log_id != seen_log:
        return ""  # another log: its terms count afresh
    if term < seen_term:
        return f"a leader of term {seen_term} has spoken"
    if max_jump and term > seen_term + max_jump:
        return (f"more than {max_jump} terms past the highest seen ({seen_term}), which max_term_jump allows "
                "(a genuine leader that far ahead: raise max_term_jump in the agent file)")
    return ""


class Gate:
    """One agent's command gate (node, key, bound on the term's jump)."""

    def __init__(self, node: str, key: signing.Verifier | None, *, max_term_jump: int = MAX_TERM_JUMP) -> None:
        self.node = node
        self.key = key
        self.max_term_jump = max_term_jump
        self.refused: Counter[str] = Counter()  # by reason: unsigned, bad signature, malformed, stale term, far term
        self._said: dict[str, tuple[float, int, int]] = {}  # by reason: (window began, logged in it, unlogged)

    def say_how(self, who: str = "") -> None:
        """Said once when the agent starts (a fleet's: once for all its nodes): whose commands it obeys."""
        who = who or f"node {self.node}"
        if self.key is not None:
            log.info("%s: acting only on commands signed with the control plane's key %s (%s)", who,
                     self.key.public_key, self.key.source)
            return
        log.warning(
            "%s: NO COMMAND KEY CONFIGURED: acting on unsigned commands, which anyone who can make NATS deliver "
            "to llmgw.cmd.<node> can forge. Give the control plane's key (creds/commands.pub) with --command-key "
            "or the agent file's command_key", who,
        )  # fmt: skip

    def admit(self, data: bytes, kept: TermKept) -> cmds.Command | None:
        """The command to act on, or None (refused, logged and counted). On
        admission, `kept` holds its term and log (the caller saves it if it changed)."""
        try:
            body = self.key.open(self.node, data) if self.key is not None else signing.unsigned_body(data)
        except signing.Refused as e:
            return self._refuse(e.kind, f"ignoring a command: {e}")
        try:
            cmd = cmds.decode(body)
        except msgspec.MsgspecError as e:
            return self._refuse("malformed", f"ignoring a command that does not decode: {e}")
        why = term_refusal(cmd.term, cmd.log, kept.term, kept.log, self.max_term_jump)
        if why:
            kind = "stale term" if cmd.term < kept.term else "far term"
            return self._refuse(kind, f"ignoring a {type(cmd).__name__} of term {cmd.term}: {why}")
        kept.term, kept.log = cmd.term, cmd.log
        return cmd

    def _refuse(self, kind: str, why: str) -> None:
        self.refused[kind] += 1
        now = time.monotonic()
        began, said, held = self._said.get(kind, (-REFUSAL_LOG_EVERY_S, 0, 0))
        if now - began >= REFUSAL_LOG_EVERY_S:
            began, said = now, 0
        if said < REFUSAL_LOG_BURST:
            log.warning("node %s: %s%s", self.node, why, f" ({held} more refused unlogged before)" if held else "")
            said, held = said + 1, 0
        else:
            held += 1
        self._said[kind] = (began, said, held)
        return None


def acted_key(cmd: cmds.StartShard | cmds.StopShard) -> Acted:
    """What an agent acts on once, however often it arrives (redelivered,
    re-sent by a new leader): (shard, generation, "start" | "stop")."""
    return (cmd.shard, cmd.generation, "start" if isinstance(cmd, cmds.StartShard) else "stop")


# --------------------------------------------------------------------------- generations


def start_plan(running: int | None, cmd: cmds.StartShard) -> Literal["start", "replace", "runs already"]:
    """What a start does, given the generation of its shard running here
    (None: none). A newer or the same one wins: a start never goes back."""
    if running is None:
        return "start"
    return "runs already" if running >= cmd.generation else "replace"


def stop_plan(running: int | None, cmd: cmds.StopShard) -> Literal["stop", "not here"]:
    """What a stop does, given the generation of its shard running here: it
    stops that generation only (a stop of an older one, redelivered late,
    never stops its successor); any other is acknowledged as stopped."""
    return "stop" if running == cmd.generation else "not here"


def replaced_reason(cmd: cmds.StartShard) -> str:
    """The stop reason of an older generation that `cmd` replaces."""
    return f"generation {cmd.generation} replaces it"


async def wait_after(
    cmd: cmds.StartShard, here: Callable[[str], bool], *, poll: float = 0.05, limit: float = AFTER_WAIT_S
) -> bool:
    """Until none of the shards `cmd` replaces in place (`after`) is `here`:
    their GPUs and port are its own once they have exited, which their drain
    may take. False: `limit` passed first (it starts anyway)."""
    deadline = time.monotonic() + limit
    while any(here(s) for s in cmd.after):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll)
    return True


# --------------------------------------------------------------------------- commands, once each


class Actions(Protocol):
    """What an agent does with a command the protocol admitted, once. Each
    returns at once (it schedules the work): the protocol runs in the bus's
    callback."""

    def start_shard(self, cmd: cmds.StartShard) -> None: ...

    def stop_shard(self, cmd: cmds.StopShard) -> None: ...

    def register(self, why: str) -> None:
        """Publish a registration, complete (what runs, built when published), after what was said before."""


# What became of a command (CommandProtocol.outcomes counts them):
# refused: by the gate (Gate.refused says why); register: Reregister;
# start, stop: acted on; duplicate: acted on already; another node: a start
# not naming this node at its rank; stopped before: a start whose stop came first.
Outcome = Literal["refused", "register", "start", "stop", "duplicate", "another node", "stopped before"]


class CommandProtocol:
    """One agent's side of the command protocol: the gate, at most once,
    registration. `memory` may be replaced (the real agent's, once its state
    file is read)."""

    def __init__(
        self, node: str, key: signing.Verifier | None, memory: Memory, actions: Actions, *,
        max_term_jump: int = MAX_TERM_JUMP,
    ) -> None:  # fmt: skip
        self.node = node
        self.gate = Gate(node, key, max_term_jump=max_term_jump)
        self.memory = memory
        self.actions = actions
        self.outcomes: Counter[Outcome] = Counter()

    @property
    def duplicates(self) -> int:
        """Commands ignored as acted on already."""
        return self.outcomes["duplicate"]

    async def listen(self, bus, *, on_reconnect: bool = True):
        """Follow this node's commands, then register; again after every
        reconnect of `bus` (unless `on_reconnect` is False: a fleet registers
        its nodes itself, a bounded number at a time). The follower."""
        follower = await bus.follow_commands(self.node, self.on_command)
        hooks = getattr(bus, "on_reconnect", None)
        if on_reconnect and hooks is not None:
            hooks.append(self._reconnected)
        self.actions.register("started")
        return follower

    async def _reconnected(self) -> None:
        self.actions.register("reconnected")

    def stopped_since(self, cmd: cmds.StartShard) -> bool:
        """Its stop was acted on after the start was (while it waited for its turn): it is not started."""
        return self.memory.acted((cmd.shard, cmd.generation, "stop"))

    def on_command(self, data: bytes) -> Outcome:
        """Admit, remember and act on one command as it came off the bus."""
        mem = self.memory
        was = (mem.term, mem.log)
        cmd = self.gate.admit(data, mem)
        if cmd is None:
            self.outcomes["refused"] += 1
            return "refused"  # nothing changed, the term kept least of all
        outcome = self._judge(cmd)
        self.outcomes[outcome] += 1
        if outcome in ("start", "stop", "stopped before"):
            # Remembered before acting: at most once (see the module's doc).
            mem.remember(acted_key(cmd))  # type: ignore[arg-type]
        elif (cmd.term, cmd.log) != was:
            mem.remember()  # a later term, or another log
        if isinstance(cmd, cmds.Reregister):
            log.info("node %s: asked to register again: %s", self.node, cmd.reason)
            self.actions.register(f"asked: {cmd.reason}")
        elif outcome == "start":
            self.actions.start_shard(cmd)  # type: ignore[arg-type]
        elif outcome == "stop":
            self.actions.stop_shard(cmd)  # type: ignore[arg-type]
        return outcome

    def _judge(self, cmd: cmds.Command) -> Outcome:
        if isinstance(cmd, cmds.Reregister):
            return "register"
        key = acted_key(cmd)
        if self.memory.acted(key):
            log.debug("%s of %s generation %d: acted on already", key[2], cmd.shard, cmd.generation)
            return "duplicate"
        if isinstance(cmd, cmds.StopShard):
            return "stop"
        named = cmd.nodes[cmd.rank] if 0 <= cmd.rank < len(cmd.nodes) else None
        if named != self.node:
            log.warning("ignoring a start of %s meant for node %s, not %s", cmd.shard, named, self.node)
            return "another node"
        return "stopped before" if self.stopped_since(cmd) else "start"


class Recorded:
    """Actions that only record what they were asked, in order (verb and
    command, or the registration's why): the protocol's unit tests run on
    it and InMemory, with no bus, engine nor clock."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def start_shard(self, cmd: cmds.StartShard) -> None:
        self.calls.append(("start", cmd))

    def stop_shard(self, cmd: cmds.StopShard) -> None:
        self.calls.append(("stop", cmd))

    def register(self, why: str) -> None:
        self.calls.append(("register", why))
