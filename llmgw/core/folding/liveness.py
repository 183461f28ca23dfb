"""Which nodes have gone quiet. Heartbeats never enter the log; what they
mean does, as a recorded `NodeLost`, so replay needs no heartbeats.

A node is lost on evidence only. Silence is evidence only while the
heartbeats could have been read: the shell passes as `watching_since` the
latest of when it began to watch, when its connection came back and when
the heartbeat bucket last became readable again, and asks nothing at all
while the bus is unhealthy. And most of the fleet falling silent at once is
the bus, not the nodes: then nobody is declared lost (`mass_silence`).
"""

from __future__ import annotations

from ..contract import limits
from .state import State

REVOKED = "credential revoked"


def lost_nodes(state: State, last_seen: dict[str, float], watching_since: float, now: float, grace: float):
    """(node, reason) for each ready node not heard from within `grace` seconds,
    or whose agent's credential was revoked (it can no longer speak at all).

    A node counts as seen when the watcher started (or the bus became
    healthy again), when it registered, and at each heartbeat, all in the
    control plane's own clock: a restarted control plane gives every node a
    full grace before calling it lost. The reason says what was seen.
    """
    out = []
    ready = [name for name, node in state.nodes.items() if node.state == "ready"]
    heard = 0
    for name in ready:
        if name in state.revoked_nodes:
            out.append((name, REVOKED))
            continue
        seen = max(last_seen.get(name, watching_since), watching_since)
        if now - seen > grace:
            last = last_seen.get(name)
            what = f"last heartbeat {now - last:.0f}s ago" if last is not None else "no heartbeat since watching began"
            out.append((name, f"no heartbeat for {now - seen:.0f}s (grace {grace:g}s; {what}; heartbeats readable "
                              f"for {now - watching_since:.0f}s"))
        else:
            heard += 1
    for i, (name, reason) in enumerate(out):
        if reason != REVOKED:
            out[i] = (name, f"{reason}; {heard} of {len(ready)} ready nodes heard)")
    return out


def mass_silence(state: State, lost: list, fraction: float | None = None) -> str:
    """Why these nodes are not to be declared lost now ("" : they are): more
    than `fraction` of the ready nodes (None: limits.LIMITS.mass_silence),
    and more than one, silent at once."""
    if fraction is None:
        fraction = limits.LIMITS.mass_silence
    ready = sum(1 for node in state.nodes.values() if node.state == "ready")
    lost = [(name, reason) for name, reason in lost if reason != REVOKED]  # (revoked: evidence of its own)
    if len(lost) > 1 and len(lost) > fraction * ready:
        return (f"{len(lost)} of {ready} ready nodes silent at once: taken as trouble of the bus, "
                f"not of the nodes; none declared lost")
    return ""
