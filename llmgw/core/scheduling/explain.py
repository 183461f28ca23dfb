"""Why a model's replicas go where they go, or why they fit nowhere: every
node, for every profile, asked the same questions placement asks (fit.py)
on the same working copy (placement.Inventory), so that `explain`, a model's
waiting reason (`why_no_fit`) and placement itself cannot disagree.

Apart from placement.py, whose search it reads: placement answers where,
this module says why, for `ctl explain-placement`, the console and the
waiting reason decide gives a model.
"""

from __future__ import annotations

from ..contract.events import ProfileSpec
from .fit import FABRIC, Explanation, NodeFit, ProfileFit, Reason, needs, render_refusals
from .placement import Inventory, replicas_per_node
from .refusals import count_refusals
from ..folding.state import State


def profile_fit(inv: Inventory, p: ProfileSpec, spread: dict[str, int] | None = None) -> ProfileFit:
    """Every node, for one profile, as it stands in this inventory."""
    nodes = []
    fitting: dict[str, int] = {}
    for name in inv.names():
        v = inv.view(name)
        rs = inv.reasons(v, p)
        nodes.append(NodeFit(node=name, reasons=rs, runs=spread.get(name, 0) if spread else 0))
        if not rs:
            fitting[v.fabric] = fitting.get(v.fabric, 0) + 1
    fabrics: tuple[Reason, ...] = ()
    if p.nodes > 1 and p.keep_within and fitting:  # facility: one domain for all its shards
        kept = inv.keep_within_reason(p, [nf.node for nf in nodes if nf.fits])
        if kept is not None:
            return ProfileFit(profile=p.name, needs=needs(p), fits=False, nodes=tuple(nodes), fabrics=(kept,))
    if p.nodes == 1:
        fits = bool(fitting)
    else:
        fits = any(n >= p.nodes for n in fitting.values())
        if fitting and not fits:
            most = max(fitting.values())
            where = min(f for f, n in fitting.items() if n == most)
            need = f"{p.nodes} nodes that fit in one fabric"
            fabrics = (Reason(rule=FABRIC, need=need, have=f"{most} in {where}"),)
    return ProfileFit(profile=p.name, needs=needs(p), fits=fits, nodes=tuple(nodes), fabrics=fabrics)


def profile_refusals(inv: Inventory, p: ProfileSpec) -> str:
    """How many nodes refuse one profile for each rule, in words."""
    return render_refusals(count_refusals(inv, p))


def why_no_fit(inv: Inventory, profiles: list[ProfileSpec], say=profile_refusals) -> str:
    """The reason a model waits, when none of its profiles fits: for each
    profile, how many nodes refuse it for each rule (`explain`'s counts,
    counted by class: refusals.py)."""
    if not inv.has_ready():
        # Those cordoned (admission.py) are ready but passed over: say why (a
        # scan of the nodes, only when none is placeable, which is rare).
        cordoned = sorted((n, node.cordon) for n, node in inv._state.nodes.items() if node.cordon and node.state == "ready")
        if cordoned:
            return f"no node is ready: {len(cordoned)} cordoned (first: {cordoned[0][0]} {cordoned[0][1]})"
        return "no node is ready"
    return "no room: " + "; ".join(say(inv, p) for p in profiles)


def explain(state: State, model: str) -> Explanation:
    """For every profile of a model, in order, and every node: why the node is
    refused, or that it fits; and where the next replica would go. Taken on
    the state as it is, as the next pass of decide would see it (but for what
    that pass places for other models first)."""
    m = state.models.get(model)
    if m is None:
        return Explanation(model=model, problem=f"no model {model} in the catalog")
    # The replicas decide keeps (not stopping, not failed, on a profile the
    # catalog still has as it is): the ones spread steers away from.
    kept = [
        r
        for r in state.replicas.values()
        if r.model == model and r.state not in ("stopping", "failed") and m.fingerprints.get(r.profile) == r.fingerprint
    ]
    spread = replicas_per_node(kept)
    inv = Inventory(state)
    fits = tuple(profile_fit(inv, p, spread) for p in m.spec.profiles)
    chosen, where = "", ()
    for p in m.spec.profiles:
        shards = inv.place(p, f"{model}-next", spread)
        if shards is not None:
            chosen, where = p.name, tuple(s.node for s in shards)
            break
    return Explanation(model=model, profiles=fits, chosen=chosen, where=where)
