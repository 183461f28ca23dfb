"""`llmgw ctl node unmute NODE`: hear a muted node again.

The control plane mutes a node that speaks past its rate (control/rates.py,
NodeMuted); only an operator lifts that (core/muting.py says why). The
unmute is an event on the log (NodeUnmuted); the node then registers again
(the control plane asks a lost node whose heartbeat it sees) and is given
work from there.
"""

from __future__ import annotations

import time

from ..core import events as ev
from ..core.catalog import NAME_RE

ABOUT = {
    "ctl node": (
        "Act on one node. `unmute`: hear again a node the control plane muted for speaking past its rate.",
        ["llmgw ctl node unmute gpu-7 --reason 'agent fixed'"],
    ),
    "ctl node unmute": (
        "Hear a node again that the control plane muted for speaking past its rate (`llmgw ctl get decisions`\n"
        "and the control plane's log say when and at what rate). Until then everything its agent publishes is\n"
        "quarantined unread and its replicas run elsewhere; unmuted, it registers again and is given work.",
        ["llmgw ctl node unmute gpu-7 --reason 'agent fixed'"],
    ),
}


def add_parsers(verb, where_flags) -> None:
    """The `node` verb, on ctl's subparsers (`verb(name, help)` makes one)."""
    node = verb("node", "act on one node: unmute it")
    subs = node.add_subparsers(dest="node_verb", metavar="ACTION", required=True, help="unmute")
    unmute = subs.add_parser("unmute", help="hear a node again that was muted for speaking past its rate")
    where_flags(unmute)
    unmute.add_argument("node", metavar="NODE", help="the muted node")
    unmute.add_argument("--reason", default="", metavar="TEXT", help="why, kept in the log")


async def cmd_node(args, where) -> int:
    from .ctl import BAD_INPUT, OK, CtlError, _publish

    if not NAME_RE.match(args.node):
        raise CtlError(f"node unmute: {args.node!r} is not a node name (letters, digits, _ and -, at most 64)", BAD_INPUT)
    seq = await _publish(where, ev.NodeUnmuted(at=time.time(), node=args.node, reason=args.reason[:4096]))
    print(f"node {args.node} unmuted (event {seq}): its agent is heard again, and registers anew", flush=True)
    return OK
