"""Which engine ports of this node another program holds.

The control plane numbers engine ports within the agent file's
`engine_ports` and cannot see this node's sockets: left alone, it handed a
port another program listened on to every placement here, each was refused,
and the model was parked (see llmgw/core/scheduling/ports.py). The agent finds them:

- at registration, by trying every port of the range (10,000 binds take a
  quarter of a second, so it is done off the event loop);
- when it refuses a start because the port is taken;
- and it looks again at those it said, once a heartbeat, to say when one is
  free again. (Only those: one taken later is found when a start meets it.)

A try is a bind without listen, held for microseconds: a program binding the
same port at that instant without SO_REUSEADDR could be refused, which is why
only the agent's own range is tried, and its own engines' ports are not.

A port one of this agent's own engines holds is never another program's,
whatever a bind says: it is left out, so that it is not kept from placement
once that engine exits.

`TakenPorts` is the agent's side of it: what it last said (its
registration's `ports_taken`, each NodePorts), kept at those three moments.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from ..core.contract import events as ev
from . import supervisor as sv
from .agentfile import PortRange

log = logging.getLogger("llmgw.agent")


def scan(host: str, ports: PortRange, ours: Iterable[int]) -> list[int]:
    """The ports of the range something listens on, but for our engines'."""
    mine = set(ours)
    return [p for p in range(ports.first, ports.last + 1) if p not in mine and sv.port_taken(host, p)]


def still_taken(host: str, said: Iterable[int], ours: Iterable[int]) -> list[int]:
    """Of the ports said taken, those another program still holds."""
    mine = set(ours)
    return sorted(p for p in said if p not in mine and sv.port_taken(host, p))


class TakenPorts:
    """The ports of the agent's range another program holds, as it last
    said them (`taken`), and what it says when that changes: a NodePorts
    through `say` (the agent's outbox, so it keeps its place among the
    agent's events). `own()` is the ports of the agent's own engines now."""

    def __init__(
        self, node: str, host: str, ports: PortRange, own: Callable[[], set[int]],
        say: Callable[[ev.Event], None], clock: Callable[[], float],
    ) -> None:  # fmt: skip
        self.node, self.host, self.ports = node, host, ports
        self.own, self.say, self.clock = own, say, clock
        self.taken: list[int] = []

    async def scan(self) -> None:
        """Before a registration: every port of the range, off the event loop."""
        found = await asyncio.to_thread(scan, self.host, self.ports, self.own())
        # An engine of ours started during the scan is not another program.
        self.taken = sorted(set(found) - self.own())
        if self.taken:
            log.info("ports of %s held by other programs: %s", self.ports, ", ".join(map(str, self.taken)))

    def refused(self, port: int) -> None:
        """A start refused for its port: said before the failure, so that the
        control plane keeps the port out and reads the failure as this node's.
        (One of our own engines on it, still draining, is not another program.)"""
        if port not in self.ports:
            log.warning("port %d, refused, is outside this agent's range %s: not said taken", port, self.ports)
        elif port in self.taken:
            log.warning("port %d, refused, was said taken already", port)
        elif port in self.own():
            log.warning("port %d, refused, is held by an engine of this agent (still stopping): not said taken", port)
        else:
            self.taken = sorted({*self.taken, port})
            self.say(ev.NodePorts(at=self.clock(), node=self.node, taken=list(self.taken)))

    def heartbeat(self) -> None:
        """Once a heartbeat: those of the ports said taken that are free again are said free."""
        if not self.taken:
            return
        now = still_taken(self.host, self.taken, self.own())
        if now != self.taken:
            log.info("ports free again: %s", ", ".join(str(p) for p in self.taken if p not in now))
            self.taken = now
            self.say(ev.NodePorts(at=self.clock(), node=self.node, taken=list(now)))
