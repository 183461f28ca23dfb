"""Where a replica fits: first fit over the nodes, profiles in order of preference.

`Inventory` is a working copy of what is free, so that the placements of one
pass see each other: without it two placements decided in the same pass
could name the same GPU, and the second would be voided at fold time.
"""

from __future__ import annotations

from collections.abc import Iterable

from .events import ProfileSpec, ShardPlacement
from .state import State

PORT_BASE = 20000
PORT_LIMIT = 29999


class Inventory:
    """Free GPUs and taken ports per ready node, for one pass of decide."""

    def __init__(self, state: State) -> None:
        self.nodes = sorted(n for n, node in state.nodes.items() if node.state == "ready")
        self._state = state
        self._free: dict[str, list[tuple[int, float]]] = {}
        self._ports: dict[str, set[int]] = {}

    def free_gpus(self, node: str) -> list[tuple[int, float]]:
        free = self._free.get(node)
        if free is None:
            n = self._state.nodes[node]
            free = sorted((g.index, g.memory_gb) for g in n.gpus if g.index not in n.used)
            self._free[node] = free
        return free

    def taken_ports(self, node: str) -> set[int]:
        ports = self._ports.get(node)
        if ports is None:
            ports = set(self._state.nodes[node].ports)
            self._ports[node] = ports
        return ports

    def pick(self, node: str, profile: ProfileSpec) -> list[int] | None:
        """The lowest-numbered free GPUs on a node that suit the profile."""
        fit = [i for i, mem in self.free_gpus(node) if mem >= profile.gpu_memory_gb]
        if len(fit) < profile.gpus:
            return None
        return fit[: profile.gpus]

    def take(self, node: str, gpus: Iterable[int]) -> int:
        """Take GPUs and a port on a node; returns the port."""
        taken = set(gpus)
        self._free[node] = [g for g in self.free_gpus(node) if g[0] not in taken]
        ports = self.taken_ports(node)
        port = PORT_BASE
        while port in ports:
            port += 1
        if port > PORT_LIMIT:
            raise RuntimeError(f"no free port left on {node}")
        ports.add(port)
        return port


def first_fit(
    inv: Inventory, profile: ProfileSpec, replica: str, prefer_not: set[str]
) -> list[ShardPlacement] | None:
    """Shards for one replica of this profile, or None when it fits nowhere.

    Nodes that already run one of the model's replicas are tried last, so a
    model's replicas spread over nodes where they can.
    """
    order = [n for n in inv.nodes if n not in prefer_not] + [n for n in inv.nodes if n in prefer_not]
    chosen: list[tuple[str, list[int]]] = []
    for node in order:
        gpus = inv.pick(node, profile)
        if gpus is not None:
            chosen.append((node, gpus))
            if len(chosen) == profile.nodes:
                break
    if len(chosen) < profile.nodes:
        return None
    return [
        ShardPlacement(shard=f"{replica}.{rank}", node=node, rank=rank, gpus=gpus, port=inv.take(node, gpus))
        for rank, (node, gpus) in enumerate(chosen)
    ]


def why_no_fit(inv: Inventory, profiles: list[ProfileSpec]) -> str:
    """A reason a person can act on when no profile fits."""
    if not inv.nodes:
        return "no node is ready"
    parts = []
    for p in profiles:
        best = max(
            (sum(1 for _, mem in inv.free_gpus(n) if mem >= p.gpu_memory_gb) for n in inv.nodes), default=0
        )
        need = f"{p.gpus} free GPU(s)" + (f" with {p.gpu_memory_gb:g} GB" if p.gpu_memory_gb else "")
        nodes = f"{p.nodes} nodes" if p.nodes > 1 else "a node"
        parts.append(f"profile {p.name} needs {nodes} with {need}; the most any ready node has is {best}")
    return "no room: " + "; ".join(parts)
