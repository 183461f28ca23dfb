"""Placement's search for a multi-node replica: the first fabric in name
order with enough nodes that fit, within the rounds of spread; its shards
by the same rules, rank 0 on the first node chosen (placement.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import facility_pass
from ..contract.events import ProfileSpec
from .fit import runs_real_engine
from ..folding.nodeindex import Group, NodeIndex

if TYPE_CHECKING:
    from .placement import _View


def _limits(spread: dict[str, int]) -> list[int]:
    """The rounds of spreading: nodes running none of the model's replicas,
    then at most one, and so on; then any node."""
    if not spread:
        return [1]
    # Only the counts some node has: a round for a count none has admits
    # what the one before did.
    return [c + 1 for c in sorted({0, *spread.values()})]


def admit_key(p: ProfileSpec) -> tuple:
    """What label_reasons and _kind_reasons read of a profile: the groups
    that admit it are kept with the index by it, across passes."""
    return (p.pool, p.nodes > 1, p.gpu_model, p.gpu_memory_gb, p.gpus, runs_real_engine(p))


class FabricSearch:
    """placement.Inventory's search over the fabrics of a multi-node profile."""

    def _by_fabric(self, idx: NodeIndex, p: ProfileSpec) -> list[list[Group]]:
        """The admitting groups of a multi-node profile, by fabric in name order."""
        key = ("fabric", *admit_key(p))
        cached = idx.admitted.get(key)
        if cached is not None and cached[0] == idx.version:
            return cached[1]
        by: dict[str, list[Group]] = {}
        for grp in self._admitting(idx, p):  # label_reasons let no group without a fabric through
            by.setdefault(grp.fabric, []).append(grp)
        out = list(by.values())
        idx.admitted[key] = (idx.version, out)
        return out

    def _fabric_pick(self, p: ProfileSpec, by_fabric: list[list[Group]], spread: dict[str, int]) -> list[_View] | None:
        """Nodes for a multi-node replica: the first fabric, in name order, with
        enough nodes that fit among the least loaded with the model; within
        it, the least loaded first."""
        limits = _limits(spread)
        fac = self._fac
        begin = self._fabric_from(p, by_fabric)  # (past those too full for the profile's shape: facility_search)
        for i in range(len(limits)):
            for j in range(begin, len(by_fabric)):
                groups_in_fabric = by_fabric[j]
                # (After the first round the count leaves out the model's own
                # nodes, which those rounds admit: kept for decisions unchanged.)
                if self._fabric_refused(p, groups_in_fabric, bool(i) and fac.active, spread):
                    continue
                # facility: keep_within tries one domain of its kind at a time
                for domain in fac.within(p.keep_within, self._fabric_nodes(groups_in_fabric)) if p.keep_within else ("",):
                    chosen: list[_View] = []
                    taken = facility_pass.Outside(fac, p.keep_within, domain, chosen) if domain else chosen
                    if fac.capped:  # facility: each shard within the caps with those chosen before it
                        taken = facility_pass.Together(fac, p, chosen, taken, self._gpus_for)
                    for limit in limits[: i + 1]:
                        while len(chosen) < p.nodes:
                            v = self._best(p, groups_in_fabric, spread, limit, taken)
                            if v is None:
                                break
                            chosen.append(v)
                    if len(chosen) == p.nodes and fac.fit_together(
                        [v.node for v in chosen], p, [self._gpus_for(v, p) for v in chosen]
                    ):
                        return chosen
        return None

    def _fabric_nodes(self, groups: list[Group]) -> list[str]:
        """The names of the nodes filed in these groups (keep_within's domains are among theirs)."""
        return [name for grp in groups for bucket in grp.buckets for name in bucket]
