"""Muted nodes: a node that spoke past its rate is not heard until an
operator unmutes it (NodeMuted, NodeUnmuted; the rate is counted by the
control plane's shell, control/rates.py, which records its decision).

Why muted and not only rate-limited at the server: the server keeps what a
node publishes, forever, and every reader of the log folds it. One node's
credential stored ~609,000 events in seconds (issue 35, finding 6); the
control plane fell 574,000 events behind and an operator's change waited
over two minutes. A muted node's messages are quarantined by their subject,
before they are decoded (fold.apply), so a flood costs a reader a dict
lookup per message, not a decode and a fold.

Why an operator unmutes (and not a cool-down): a node that floods is either
broken or in someone else's hands; either way a person should look before
its word steers placement again. The node's replicas are replaced elsewhere
meanwhile, as on a lost node; unmuted, it registers again (the control plane
asks a lost node that still beats to) and is given work from there.
"""

from __future__ import annotations

from ..contract import events as ev
from .state import State


def muted_reason(e: ev.NodeMuted) -> str:
    return f"muted: node {e.node} spoke at {e.rate:.0f} events/s, past its limit of {e.limit:.0f}/s"


def muted(state: State, e: ev.NodeMuted) -> ev.NodeLost:
    """The node is muted; what the fold applies next: the node lost, with why."""
    why = muted_reason(e)
    state.muted[e.node] = why
    return ev.NodeLost(at=e.at, node=e.node, reason=why, basis=e.basis)


def node_unmuted(state: State, e: ev.NodeUnmuted, seq: int) -> None:
    state.muted.pop(e.node, None)
