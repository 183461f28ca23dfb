"""`llmgw ctl node admit NODE`: an operator grants what a node claims.

A node's own `llmgw.io/pool` steers no placement (core/admission.py, issue
35: a node that claimed pool=secure and 8 H100s got the pool-restricted
model and every prompt). Admitting a node is the operator saying its claims
are true: what the read models show it claims, its pool and its GPUs, is
published as one NodeAdmitted. Its pool is the operator's from then on (as
`ctl label NODE pool=NAME` would set it, which needs no claim); its GPUs
are the most it may claim under the policy `admission: manual`, where a
node is placed on only once admitted. A later claim of another pool, or of
more GPUs, needs admitting again.
"""

from __future__ import annotations

import time

from ..core import events as ev
from ..core.nodeindex import POOL_LABEL

ABOUT = {
    "ctl node": (
        "What an operator says of a node: `admit` grants what it claims of itself (its pool, its GPUs).",
        ["llmgw ctl node admit gpu-7"],
    ),
    "ctl node admit": (
        "Admit what a node claims of itself that placement does not count until an operator says so: its\n"
        "pool (llmgw.io/pool, from its agent file), which becomes the operator's as `ctl label NODE pool=NAME`\n"
        "would set it, and its GPUs (how many, which models): under the policy admission: manual a node is\n"
        "placed on only once admitted, and only while it claims no more. `ctl describe node` shows what it\n"
        "claims and is not admitted ('Claimed'), and why it is passed over ('Reason').",
        ["llmgw ctl node admit gpu-7", "llmgw ctl describe node gpu-7"],
    ),
}


def add_parsers(verb, where_flags, wait_flags) -> None:
    node = verb("node", "admit what a node claims of itself (its pool, its GPUs)")
    subs = node.add_subparsers(dest="node_verb", required=True, metavar="ACTION", help="admit")
    admit = subs.add_parser("admit", help="grant the node's claimed pool and GPUs (the operator's word)")
    where_flags(admit)
    admit.add_argument("node", metavar="NODE", help="the node (`llmgw ctl get nodes` lists them)")
    wait_flags(admit, "(nothing more to wait for: the read models show the labels)")


async def cmd_node(args, where) -> int:
    from ..ctl.config import CONFIG
    from .ctl import NOT_FOUND, OK, CtlError, _fresh, _publish, _took_effect, did_you_mean

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
