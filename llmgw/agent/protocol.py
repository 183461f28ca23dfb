"""Which commands an agent acts on: one gate for the real and the simulated agent.

Every command that reaches an agent's subject passes, in this order:

1. The signature (bus/signing.py), with the key its operator configured:
   unsigned, signed with another key, signed for another node, or not
   decoding, it is refused. Why: any credential that could read the log
   made nats-server deliver its own command-shaped messages to
   `llmgw.cmd.<node>` (issue 35, finding 1), and the agent obeyed.
   An agent with no key configured (a dev NATS without auth) acts on
   unsigned commands, and says so loudly when it starts.
2. The term (core/commands.py): within one log, a command of an older
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

import logging
import time
from collections import Counter
from typing import Protocol

import msgspec

from ..bus import signing
from ..core import commands as cmds

log = logging.getLogger("llmgw.agent")

MAX_TERM_JUMP = 1000  # terms ahead of the highest seen (one log) that a command may be
# Refusals logged: at most REFUSAL_LOG_BURST of one reason every REFUSAL_LOG_EVERY_S, the rest counted.
REFUSAL_LOG_EVERY_S = 10.0
REFUSAL_LOG_BURST = 20


class TermKept(Protocol):
    """Where an agent keeps the highest term it has seen and its log (AgentState, SimulatedAgent)."""

    term: int
    log: str


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


def acted_key(cmd: cmds.StartShard | cmds.StopShard) -> tuple[str, int, str]:
    """What an agent acts on once, however often it arrives (redelivered,
    re-sent by a new leader): (shard, generation, "start" | "stop")."""
    return (cmd.shard, cmd.generation, "start" if isinstance(cmd, cmds.StartShard) else "stop")
