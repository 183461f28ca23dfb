"""Engine ports another program holds on a node: what the fold keeps of them.

The control plane numbers engine ports itself (placement.py: the lowest free
one of the node's range) and cannot see a node's sockets; only its agent can.
Seen for real: with anything listening on 20000 on a node, every placement
there got 20000, the agent refused it ("taken by another process"), the
replica failed, the next placement got 20000 again, and five failures later
the model was parked though every other port was free: the loop the seeds
warn of for the ports of strays (adopt.go, reservePorts), with a program
that is not ours.

So the agent says which ports of its range other programs hold (at
registration, and in a NodePorts when it refuses a start for that reason or
sees one free again), and the fold:

- keeps them in `Node.taken`, apart from `Node.ports` (what our shards and
  strays hold), and placement skips both;
- voids a placement on one of them (a decision taken before the node said so);
- does not count the failure of a shard whose port another program holds
  towards parking its model: it is the node's fact, not the model's, and the
  replacement gets another port.
"""

from __future__ import annotations

from ..contract import events as ev
from ..contract import limits
from ..contract.bounds import MAX_PORT
from ..folding.state import Node, State


def port_range(node: Node) -> tuple[int, int]:
    """The first and last port engines may be given on a node: its agent's
    range, else the core's default (limits.CoreLimits)."""
    return (node.port_first or limits.LIMITS.engine_port_first, node.port_last or limits.LIMITS.engine_port_last)


def range_problem(first: int, last: int) -> str:
    """Why a node's port range is not one, or "" (0 and 0: the default range)."""
    if first == 0 and last == 0:
        return ""
    if not (1 <= first <= last <= MAX_PORT):
        return f"port range {first}-{last}: first and last must be ports (1-{MAX_PORT}), first not after last"
    return ""


def in_range(node: Node, ports: list[int]) -> list[int]:
    """The ports of a node's range among these, sorted, each once: only
    those could ever be handed out, so only those need keeping out."""
    first, last = port_range(node)
    return sorted({p for p in ports if first <= p <= last})


def node_ports(state: State, e: ev.NodePorts, seq: int) -> None:
    """The ports other programs hold on a node now, replacing what its agent
    said before. A node never registered has nothing to keep them from: its
    registration will say them. (Nothing is placed on a lost node, and the
    registration that brings it back says them again.)"""
    node = state.nodes.get(e.node)
    if node is None:
        return
    node.taken = in_range(node, e.taken)


def placement_problem(node: Node, port: int) -> str:
    """Why a decided port may not be used on this node, or "".

    Only a port another program holds makes a decision wrong. One outside
    the node's range (decided before it said another) is not voided: the
    range steers where placement looks, and an engine there binds all the
    same."""
    if node.taken and port in node.taken:
        return f"port {port} on {node.name} is held by another program"
    return ""


def held_by_another_program(node: Node | None, port: int) -> bool:
    """Whether a shard's port is one its node says another program holds:
    then its failure is the node's, not its model's."""
    return node is not None and bool(port) and port in node.taken
