"""The fold, a pass, a snapshot, the projector and the console survive the
worst values the contract's bounds accept (core/contract/bounds.py; issue 35,
finding 4: `cpu_cores: 10**30` folded, then every pass raised
OverflowError and the projector crash-looped on SQLite's INTEGER).

Events are drawn with every bounded field at an edge of its range (its
least or its greatest value, its shortest or longest string, an empty or a
long list), of every type of the contract, folded with the real `apply`,
decided on, snapshotted (msgspec encode and decode of the state), projected
into SQLite by the real projector (in-process) and rendered by the
console's views. Refusals by the fold's own rules are fine; an exception is
not, nor a quarantine that says a handler raised one.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.console import fleetmap, series, views
from llmgw.core.contract import bounds
from llmgw.core.contract import events as ev
from llmgw.core.rules.decide import decide
from llmgw.core.folding.fold import apply, decode_state, encode_state
from llmgw.core.folding.state import State
from llmgw.projections.projector import Projector

SETTINGS = settings(
    max_examples=int(os.environ.get("LLMGW_PROPERTY_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# A list drawn at its longest is cut to this many items here (the longest
# lists the bounds allow are folded by test_the_longest_registration_...).
LONG_LIST = 8
# A quarantine's reason when a handler raised rather than refused: the
# bug finding 4 was (OverflowError), never to be seen again.
RAISED = re.compile(r"^[A-Z]\w*(Error|Exception)\b(?!.*Expected)")


def _longest(t: msgspec.inspect.StrType) -> str:
    n = t.max_length
    owner = ""
    while len(owner) + 2 <= n:  # names of 64 joined by /: the owner paths'
        owner += ("/" if owner else "") + "a" * min(64, n - len(owner) - (1 if owner else 0))
    for s in ("a" * n, "A" * n, owner):
        if len(s) == n and (t.pattern is None or re.search(t.pattern, s)):
            return s
    raise AssertionError(f"no longest string for {t}")


def _shortest(t: msgspec.inspect.StrType) -> str:
    s = "a" * max(t.min_length or 0, 0)
    return s if t.pattern is None or re.search(t.pattern, s) else "a"


def edges(t: msgspec.inspect.Type) -> st.SearchStrategy[Any]:
    """Values of type `t` at the edges of its bounds."""
    i = msgspec.inspect
    if isinstance(t, i.Metadata):  # a description of why the bound is what it is
        return edges(t.type)
    if isinstance(t, i.IntType):
        return st.sampled_from([t.ge, t.le, t.ge + 1])
    if isinstance(t, i.FloatType):
        return st.sampled_from([float(t.ge), float(t.le)])
    if isinstance(t, i.StrType):
        return st.sampled_from([_shortest(t), _longest(t)])
    if isinstance(t, i.BoolType):
        return st.booleans()
    if isinstance(t, i.LiteralType):
        return st.sampled_from(list(t.values))
    if isinstance(t, i.NoneType):
        return st.none()
    if isinstance(t, i.ListType):
        return st.lists(edges(t.item_type), min_size=0, max_size=min(t.max_length, LONG_LIST))
    if isinstance(t, i.DictType):
        return st.dictionaries(edges(t.key_type), edges(t.value_type), max_size=min(t.max_length, LONG_LIST))
    if isinstance(t, i.UnionType):
        return st.one_of([edges(m) for m in t.types])
    if isinstance(t, i.StructType):
        fields = {f.name: edges(f.type) for f in t.fields if f.name != t.tag_field}
        return st.fixed_dictionaries(fields).map(lambda kw, cls=t.cls: cls(**kw))
    raise AssertionError(f"no edges for {t}")


EVENTS = st.one_of([edges(msgspec.inspect.type_info(cls)) for cls in ev.EVENT_TYPES])


def _check_quarantines(state: State) -> None:
    raised = [q.error for q in state.quarantined if RAISED.match(q.error)]
    assert raised == []


def _survive(events: list[ev.Event], times: list[float], then=None) -> State:
    state = State()
    records: list[tuple[int, str, bytes]] = []

    def fold(event: ev.Event) -> None:
        data = ev.encode(event)
        assert ev.decode(data) == event  # within the bounds: decoded, not quarantined
        seq = len(records) + 1
        records.append((seq, ev.subject_for(event), data))
        apply(state, *records[-1])

    for event in events:
        fold(event)
    _check_quarantines(state)
    for now in times:  # a pass, folded back, at each edge of time
        actions = decide(state, now)
        if actions:
            fold(ev.Decided(at=now, basis=state.seq, actions=actions, leader="cp-1"))
            for later in then(state) if then else []:
                fold(later)
    _check_quarantines(state)
    assert decode_state(encode_state(state)) == state
    # The console's views of it, as JSON.
    msgspec.json.encode([fleetmap.fleet_map(state), views.models_view(state), views.replicas_view(state),
                         views.quotas_view(state), [views.node(state, n, None) for n in state.nodes]])
    # Its plots and timelines, as JSON (JSON has no infinity: an open GPU segment ends at the window's end).
    recorded, rec = series.record(records)
    assert recorded == state
    start, end = series.window(rec, None, None)
    msgspec.json.encode([[series.plots(rec, m, start, end, 10) for m in state.models],
                         series.timeline(rec, start, end, sorted(state.models), 100, 1000),
                         [series.gpus(rec, state, n, start, end, 100) for n in state.nodes]])
    # The projector: rows that SQLite takes, and its own fold the same.
    with tempfile.TemporaryDirectory() as tmp:
        projected = asyncio.run(_project(records, Path(tmp) / "rm.db"))
    assert projected == state
    return state


async def _project(records, db: Path) -> State:
    projector = Projector(None, db)
    await projector.open(log_id="bounds")
    try:
        await projector.project(records)
    finally:
        await projector.close()
    return projector.state


@SETTINGS
@given(st.lists(EVENTS, min_size=1, max_size=12), st.lists(st.sampled_from([0.0, 1000.0, bounds.MAX_TIME]), max_size=2))
def test_events_at_the_edges_of_the_bounds_fold_decide_snapshot_project_and_render(events, times):
    _survive(events, times)


def _worst_node(name: str) -> ev.NodeRegistered:
    """The largest node the bounds accept, every list at its longest."""
    labels = {f"llmgw.io/{i:03d}" + "k" * (bounds.LABEL_KEY_LEN - 13): "v" * bounds.LABEL_VALUE_LEN
              for i in range(bounds.MAX_LABELS - 2)}
    labels |= {"llmgw.io/pool": "p", "llmgw.io/fabric": "f" * bounds.LABEL_VALUE_LEN}
    return ev.NodeRegistered(
        at=bounds.MAX_TIME, node=name,
        gpus=[ev.Gpu(index=i, model="G" * bounds.LABEL_VALUE_LEN, memory_gb=bounds.MAX_GPU_MEMORY_GB,
                     power_w=bounds.MAX_GPU_WATTS) for i in range(bounds.MAX_GPUS_PER_NODE)],
        memory_gb=bounds.MAX_HOST_MEMORY_GB, cpu_cores=bounds.MAX_CPU_CORES, labels=labels,
        agent="x" * bounds.LABEL_VALUE_LEN, port_first=1, port_last=bounds.MAX_PORT,
        ports_taken=list(range(1, bounds.MAX_PORT + 1, 2)),
    )  # fmt: skip


def test_the_longest_registration_and_the_largest_model_fold_place_snapshot_project_and_render():
    big = ev.ProfileSpec(
        name="p" * bounds.MODEL_NAME_LEN, gpus=bounds.MAX_GPUS_PER_NODE, nodes=2,
        gpu_memory_gb=bounds.MAX_GPU_MEMORY_GB, memory_gb=bounds.MAX_HOST_MEMORY_GB / 2,
        cpu_cores=bounds.MAX_CPU_CORES // 2, power_w=bounds.MAX_NODE_WATTS, weight=bounds.MAX_RATIO,
        args=["a" * bounds.PATH_LEN] * bounds.MAX_ARGS, model="/" * bounds.PATH_LEN, pool="p",
    )  # fmt: skip
    model = ev.ModelSpec(
        name="m" * bounds.MODEL_NAME_LEN, profiles=[big], min_replicas=2, max_replicas=bounds.MAX_REPLICAS,
        target_load=bounds.MAX_RATIO, scale_down_delay_s=bounds.MAX_DURATION, idle_s=bounds.MAX_DURATION,
        drain_grace_s=bounds.MAX_DURATION, aliases=[f"{i}" + "a" * (bounds.MODEL_NAME_LEN - 3) for i in range(64)],
    )  # fmt: skip
    owner = ev.OwnerApplied(
        at=bounds.MAX_TIME, name="o",
        guarantee=ev.Resources(gpus=bounds.MAX_FLEET_AMOUNT, cpu_cores=bounds.MAX_FLEET_AMOUNT,
                               memory_gb=float(bounds.MAX_FLEET_AMOUNT)),
        limit=ev.Limit(gpus=bounds.MAX_FLEET_AMOUNT, cpu_cores=bounds.MAX_FLEET_AMOUNT,
                       memory_gb=float(bounds.MAX_FLEET_AMOUNT)),
    )  # fmt: skip
    model.owner = "o"
    events = [
        _worst_node("a" * 64), _worst_node("b" * 64), owner,
        # The pool is the operator's to set (core/rules/admission.py): what the nodes claim steers nothing.
        ev.NodeLabeled(at=bounds.MAX_TIME, node="a" * 64, set={"pool": "p"}),
        ev.NodeLabeled(at=bounds.MAX_TIME, node="b" * 64, set={"pool": "p"}),
        ev.FacilityApplied(at=bounds.MAX_TIME, budgets={"pdu/p": bounds.MAX_DOMAIN_WATTS}),
        ev.ModelApplied(at=bounds.MAX_TIME, model=model),
        ev.ModelLoad(at=bounds.MAX_TIME, gateway="g" * 64, model=model.name, in_flight=bounds.MAX_COUNTER,
                     queued=bounds.MAX_COUNTER, last_used=bounds.MAX_TIME, tokens_in=bounds.MAX_COUNTER,
                     tokens_out=bounds.MAX_COUNTER, requests=bounds.MAX_COUNTER, tokens_cached=bounds.MAX_COUNTER,
                     ttft_p50=bounds.MAX_DURATION, ttft_p90=bounds.MAX_DURATION),
        ev.NodePower(at=bounds.MAX_TIME, node="a" * 64, watts=bounds.MAX_NODE_WATTS,
                     gpus={i: bounds.MAX_GPU_WATTS for i in range(bounds.MAX_GPUS_PER_NODE)}),
        ev.LeaderElected(at=bounds.MAX_TIME, term=bounds.MAX_SEQ, leader="l" * bounds.MODEL_NAME_LEN),
    ]


    def ready(state: State) -> list[ev.Event]:
        """Every shard placed reports ready, with the longest endpoint and identity."""
        return [
            ev.ShardStatus(at=bounds.MAX_TIME, node=sh.node, replica=rep.id, shard=sh.id, generation=sh.generation,
                           state="ready", endpoint="h" * bounds.PATH_LEN, identity="i" * bounds.ID_LEN * 2,
                           reason="r" * bounds.TEXT_LEN)
            for rep in state.replicas.values() for sh in rep.shards if sh.state == "placing"
        ]  # fmt: skip

    state = _survive(events, [bounds.MAX_TIME, bounds.MAX_TIME], then=ready)
    assert [r.state for r in state.replicas.values()] == ["ready"]  # one fits: two nodes of 256 GPUs
    assert state.quarantine_count == 0
    assert state.nodes["a" * 64].cpu_used == bounds.MAX_CPU_CORES // 2


def test_messages_past_every_bound_are_quarantined_and_projected_as_such():
    """The worst that can arrive, not only the worst the bounds accept: each
    is listed in the read models as not an event, with the reason."""
    raw = [
        {"type": "node.registered", "node": "evil", "at": 1.0, "cpu_cores": 10**30},
        {"type": "node.registered", "node": "evil", "at": 10**30, "memory_gb": 1e308},
        {"type": "node.power", "node": "evil", "at": 1e308, "watts": 10**400},
        {"type": "node.ports", "node": "evil", "at": 1.0, "taken": [-(10**30)]},
        {"type": "shard.status", "node": "evil", "at": 1.0, "replica": "r", "shard": "s", "generation": 10**30,
         "state": "ready"},
    ]
    records = [(i + 1, "llmgw.agent.evil.x", msgspec.json.encode(r)) for i, r in enumerate(raw)]
    records.append((len(records) + 1, "llmgw.agent.evil.x", b'{"type":"node.power","node":"evil","at":1e999}'))
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "rm.db"
        state = asyncio.run(_project(records, db))
        import sqlite3

        with sqlite3.connect(db) as conn:
            listed = conn.execute("SELECT count(*) FROM quarantined").fetchone()[0]
    assert state.quarantine_count == len(records) == listed and not state.nodes
    assert all("Expected" in q.error or "out of range" in q.error for q in state.quarantined), state.quarantined
