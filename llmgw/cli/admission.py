"""`llmgw ctl node admit NODE`: an operator grants what a node claims.

A node's own `llmgw.io/pool` steers no placement (core/admission.py, issue
35: a node that claimed pool=secure got the pool-restricted model and every
prompt). Admitting a node is the operator saying its claim is true: the
claim, as the read models show it, is published as the operator's label
(NodeLabeled, the event `ctl label` publishes), so it counts from then on
and outlives re-registrations. A later claim of another pool needs
admitting again. `ctl label NODE pool=NAME` sets one without a claim.
"""

from __future__ import annotations

import time

from ..core import events as ev

ABOUT = {
    "ctl node": (
        "What an operator says of a node: `admit` counts what it claims of itself (its pool).",
        ["llmgw ctl node admit gpu-7"],
    ),
    "ctl node admit": (
        "Admit what a node claims of itself that placement does not count until an operator says so: its\n"
        "pool (llmgw.io/pool, from its agent file). `ctl describe node` shows such claims ('Claimed').\n"
        "Published as the operator's label, as `ctl label NODE pool=NAME` would.",
        ["llmgw ctl node admit gpu-7", "llmgw ctl describe node gpu-7"],
    ),
}


def add_parsers(verb, where_flags, wait_flags) -> None:
    node = verb("node", "admit what a node claims of itself (its pool)")
    subs = node.add_subparsers(dest="node_verb", required=True, metavar="ACTION", help="admit")
    admit = subs.add_parser("admit", help="count the node's claimed pool from now on (the operator's word)")
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
    claims = dict(row.get("unadmitted") or {})
    if not claims:
        print(f"node {args.node} claims nothing that is not admitted: nothing to do", flush=True)
        return OK
    seq = await _publish(where, ev.NodeLabeled(at=time.time(), node=args.node, set=claims))
    said = " ".join(f"{k}={v}" for k, v in sorted(claims.items()))
    print(f"node {args.node} admitted: {said} (event {seq})", flush=True)
    await _took_effect(args, where, seq, f"the admission of {args.node}", None)
    return OK
