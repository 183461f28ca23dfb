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
"""

from __future__ import annotations

from collections.abc import Iterable

from . import supervisor as sv
from .agentfile import PortRange


def scan(host: str, ports: PortRange, ours: Iterable[int]) -> list[int]:
    """The ports of the range something listens on, but for our engines'."""
    mine = set(ours)
    return [p for p in range(ports.first, ports.last + 1) if p not in mine and sv.port_taken(host, p)]


def still_taken(host: str, said: Iterable[int], ours: Iterable[int]) -> list[int]:
    """Of the ports said taken, those another program still holds."""
    mine = set(ours)
    return sorted(p for p in said if p not in mine and sv.port_taken(host, p))
