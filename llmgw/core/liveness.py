"""Which nodes have gone quiet. Heartbeats never enter the log; what they
mean does, as a recorded `NodeLost`, so replay needs no heartbeats."""

from __future__ import annotations

from .state import State

REVOKED = "credential revoked"


def lost_nodes(state: State, last_seen: dict[str, float], watching_since: float, now: float, grace: float):
    """(node, reason) for each ready node not heard from within `grace` seconds,
    or whose agent's credential was revoked (it can no longer speak at all).

    A node counts as seen when the watcher started, when it registered, and at
    each heartbeat, all in the control plane's own clock: a restarted control
    plane gives every node a full grace before calling it lost.
    """
    out = []
    for name, node in state.nodes.items():
        if node.state != "ready":
            continue
        if name in state.revoked_nodes:
            out.append((name, REVOKED))
            continue
        seen = max(last_seen.get(name, watching_since), watching_since)
        if now - seen > grace:
            out.append((name, f"no heartbeat for {now - seen:.0f}s (grace {grace:g}s)"))
    return out
