"""Labels an operator sets, folded: location labels (the facility's) and the
labels admission leaves to the operator (the pool), and a node admitted
with its pool. Here, in the fold, because each touches both rules — where a
node is (facility_facts.relocate) and which of its labels count (admission.settle)
— and neither rule's module may import the other's or the fold's: the core
has no import cycle (tests/test_architecture.py)."""

from __future__ import annotations

from ..contract import events as ev
from ..rules import admission
from . import facility_facts
from .refused import Refused
from .state import Admitted, State


def node_labeled(state: State, e: ev.NodeLabeled, seq: int) -> None:
    """Operator location labels: set ones win over the agent's; removed ones
    let the agent's show again. Only location labels (KINDS), and the
    labels admission.py leaves to the operator (the pool)."""
    changes = {}
    for key, value in e.set.items():
        name = facility_facts.label_name(key) or admission.label_name(key)
        if not name:
            raise Refused(f"label {key!r}: only location labels ({', '.join(facility_facts.KINDS)}) and pool may be set this way")
        if not value or "/" in value or len(value) > 64:
            raise Refused(f"label {key}={value!r}: a name without '/', at most 64 characters")
        changes[name] = value
    removed = []
    for key in e.remove:
        name = facility_facts.label_name(key) or admission.label_name(key)
        if not name:
            raise Refused(f"label {key!r}: only location labels ({', '.join(facility_facts.KINDS)}) and pool may be removed this way")
        removed.append(name)
    labels = dict(state.node_labels.get(e.node, {}))
    labels.update(changes)
    for name in removed:
        labels.pop(name, None)
    if labels:
        state.node_labels[e.node] = labels
    else:
        state.node_labels.pop(e.node, None)
    node = state.nodes.get(e.node)
    if node is not None:
        node.operator_labels = dict(labels)
        facility_facts.relocate(state, node.name)
        admission.settle(state, node)


def node_admitted(state: State, e: ev.NodeAdmitted, seq: int) -> None:
    """An operator admitted a node: its GPUs as claimed then, and its pool
    (the operator's from now on, as `ctl label NODE pool=` sets it)."""
    if e.gpus < 0 or len(e.gpu_models) > 64:
        raise Refused(f"node.admitted of {e.node}: a count of GPUs and at most 64 models")
    state.admitted[e.node] = Admitted(gpus=e.gpus, gpu_models=sorted(set(e.gpu_models)))
    if e.pool:
        node_labeled(state, ev.NodeLabeled(at=e.at, node=e.node, set={"pool": e.pool}), seq)
    node = state.nodes.get(e.node)
    if node is not None:
        admission.settle(state, node)


HANDLERS = {ev.NodeLabeled: node_labeled, ev.NodeAdmitted: node_admitted}
