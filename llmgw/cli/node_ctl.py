"""`llmgw ctl node admit|unmute NODE`: what an operator says of one node.

`admit` grants what a node claims of itself. A node's own `llmgw.io/pool`
steers no placement (core/rules/admission.py, issue 35: a node that claimed
pool=secure and 8 H100s got the pool-restricted model and every prompt).
Admitting a node is the operator saying its claims are true: what the read
models show it claims, its pool and its GPUs, is published as one
NodeAdmitted. Its pool is the operator's from then on (as `ctl label NODE
pool=NAME` would set it, which needs no claim); its GPUs are the most it may
claim under the policy `admission: manual`, where a node is placed on only
once admitted. A later claim of another pool, or of more GPUs, needs
admitting again.

`unmute` hears a muted node again. The control plane mutes a node that
speaks past its rate (control/rates.py, NodeMuted); only an operator lifts
that (core/folding/muting.py says why). The unmute is an event on the log
(NodeUnmuted); the node then registers again (the control plane asks a lost
node whose heartbeat it sees) and is given work from there.
"""

from __future__ import annotations

import time

from ..core.contract import events as ev
from ..core.contract.catalog import NAME_RE
from ..core.folding.nodeindex import POOL_LABEL

ABOUT = {
    "ctl node": (
        "What an operator says of one node. `admit`: grant what it claims of itself (its pool, its GPUs);\n"
        "`unmute`: hear again a node the control plane muted for speaking past its rate.",
        ["llmgw ctl node admit gpu-7", "llmgw ctl node unmute gpu-7 --reason 'agent fixed'"],
    ),
    "ctl node admit": (
        "Admit what a node claims of itself that placement does not count until an operator says so: its\n"
        "pool (llmgw.io/pool, from its agent file), which becomes the operator's as `ctl label NODE pool=NAME`\n"
        "would set it, and its GPUs (how many, which models): under the policy admission: manual a node is\n"
        "placed on only once admitted, and only while it claims no more. `ctl describe node` shows what it\n"
        "claims and is not admitted ('Claimed'), and why it is passed over ('Reason').",
        ["llmgw ctl node admit gpu-7", "llmgw ctl describe node gpu-7"],
    ),
    "ctl node unmute": (
        "Hear a node again that the control plane muted for speaking past its rate (`llmgw ctl get decisions`\n"
        "and the control plane's log say when and at what rate). Until then everything its agent publishes is\n"
        "quarantined unread and its replicas run elsewhere; unmuted, it registers again and is given work.",
        ["llmgw ctl node unmute gpu-7 --reason 'agent fixed'"],
    ),
}


def add_parsers(verb, where_flags, wait_flags) -> None:
    """The `node` verb, on ctl's subparsers (`verb(name, help)` makes one)."""
    node = verb("node", "act on one node: admit what it claims, or unmute it")
    subs = node.add_subparsers(dest="node_verb", metavar="ACTION", required=True, help="admit, unmute")
    admit = subs.add_parser("admit", help="grant the node's claimed pool and GPUs (the operator's word)")
    where_flags(admit)
    admit.add_argument("node", metavar="NODE", help="the node (`llmgw ctl get nodes` lists them)")
    wait_flags(admit, "(nothing more to wait for: the read models show the labels)")
    unmute = subs.add_parser("unmute", help="hear a node again that was muted for speaking past its rate")
    where_flags(unmute)
    unmute.add_argument("node", metavar="NODE", help="the muted node")
    unmute.add_argument("--reason", default="", metavar="TEXT", help="why, kept in the log")


async def cmd_node(args, where) -> int:
    if args.node_verb == "admit":
        return await _admit(args, where)
    return await _unmute(args, where)


async def _admit(args, where) -> int:
    from ..ctl.config import CONFIG
    from .ctl_bus import _fresh, _publish
    from .ctl_effect import _took_effect
    from .ctl_errors import NOT_FOUND, OK, CtlError, did_you_mean

    models = (await _fresh(where, CONFIG.catch_up_timeout_s)).models
    row = models.node(args.node)
    if row is None:
        raise CtlError(f"node admit: there is no node {args.node}{did_you_mean(args.node, models.names('node'))} "
                       f"(`llmgw ctl get nodes` lists them)", NOT_FOUND)
    pool = (row.get("unadmitted") or {}).get(POOL_LABEL, "")
    models = sorted({g["model"] for g in row["gpus"]})
    seq = await _publish(where, ev.NodeAdmitted(at=time.time(), node=args.node, gpus=len(row["gpus"]),
                                                gpu_models=models, pool=pool))
    said = f"{len(row['gpus'])} GPU(s) ({', '.join(models) or 'no model'})" + (f", {POOL_LABEL}={pool}" if pool else "")
    print(f"node {args.node} admitted: {said} (event {seq})", flush=True)
    await _took_effect(args, where, seq, f"the admission of {args.node}", None)
    return OK


async def _unmute(args, where) -> int:
    from .ctl_bus import _publish
    from .ctl_errors import BAD_INPUT, OK, CtlError

    if not NAME_RE.match(args.node):
        raise CtlError(f"node unmute: {args.node!r} is not a node name (letters, digits, _ and -, at most 64)", BAD_INPUT)
    seq = await _publish(where, ev.NodeUnmuted(at=time.time(), node=args.node, reason=args.reason[:4096]))
    print(f"node {args.node} unmuted (event {seq}): its agent is heard again, and registers anew", flush=True)
    return OK
