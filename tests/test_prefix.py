"""Cache-aware routing (issue 30), the pure parts: the prefix index
(gateway/prefix.py) and the choice (gateway/choose.py). Unit tests of the
index, bounded load, forgetting and sessions, and a property test: the index
never passes its bound, and the choice never goes to a replica the table
does not list as ready (or that is excluded, or whose breaker is open)."""

from __future__ import annotations

import json
import time
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.gateway.choose import MISSES_TO_DROP, Bounds, Reason, Router
from llmgw.gateway.prefix import BLOCK_BYTES, ENTRY_BYTES, Index, Sessions, prefix_of, prompt_start, rendezvous
from llmgw.gateway.routing import Backend, Target

KIB = 1024


def backend(name: str, weight: float = 1.0) -> Backend:
    return Backend(Target(replica=name, model="m", endpoint=f"http://127.0.0.1:1/{name}", weight=weight))


def chat(system: str, *turns: str) -> bytes:
    messages = [{"role": "system", "content": system}] + [{"role": "user", "content": t} for t in turns]
    return json.dumps({"messages": messages, "model": "m", "max_tokens": 8}).encode()


SYSTEM = "You answer questions about the fleet. " * 120  # ~4.5 KiB: a long shared system prompt


# --------------------------------------------------------------------------- the prompt's blocks


def test_a_prompt_is_hashed_in_blocks_from_its_start_and_a_next_turn_shares_them():
    one = prefix_of(chat(SYSTEM, "How many nodes?"), 64 * KIB)
    two = prefix_of(chat(SYSTEM, "How many nodes?", "And GPUs?"), 64 * KIB)
    full = len(SYSTEM) // BLOCK_BYTES
    assert one.hashes[:full] == two.hashes[:full] and len(one.hashes) > full
    assert one.ring == two.ring  # the same start: the same place when warm nowhere
    other = prefix_of(chat("Another system prompt. " * 200, "How many nodes?"), 64 * KIB)
    assert other.hashes[0] != one.hashes[0]
    # A completion's prompt too; the keys before it do not matter.
    assert prompt_start(b'{"model": "m", "prompt": "x"}') == len(b'{"model": "m", "prompt":')
    assert prefix_of(b'{"model": "m", "input": "x"}', 64 * KIB) is None  # embeddings: nothing to match
    assert prefix_of(chat(SYSTEM, "x"), 0) is None  # hashing off


def test_a_huge_prompt_costs_only_what_is_hashed():
    huge = chat("y" * (8 << 20), "and?")  # 8 MiB of prompt
    started = time.process_time()
    p = prefix_of(huge, 64 * KIB)
    assert p.size == 64 * KIB and len(p.hashes) == 64 * KIB // BLOCK_BYTES
    assert time.process_time() - started < 0.5  # generous: hashing 64 KiB takes well under a millisecond


def test_rendezvous_is_the_same_everywhere_weighted_and_moves_little_when_a_replica_leaves():
    names = ["m-1", "m-2", "m-3"]
    keys = [i.to_bytes(8, "big") for i in range(3000)]
    home = [rendezvous(k, names, [1.0, 1.0, 1.0]) for k in keys]
    assert home == [rendezvous(k, list(names), [1.0, 1.0, 1.0]) for k in keys]  # a pure function of the names
    counts = [home.count(i) for i in range(3)]
    assert min(counts) > 800  # about a third each
    heavy = [rendezvous(k, names, [2.0, 1.0, 1.0]) for k in keys]
    assert heavy.count(0) > 1300  # about half
    # m-2 leaves: only its keys move.
    after = [rendezvous(k, ["m-1", "m-3"], [1.0, 1.0]) for k in keys]
    for before, now in zip(home, after):
        if before != 1:
            assert ["m-1", "m-2", "m-3"][before] == ["m-1", "m-3"][now]


# --------------------------------------------------------------------------- the index


def test_the_index_finds_the_longest_warm_prefix_per_replica():
    idx = Index(1 << 20)
    a = prefix_of(chat(SYSTEM, "first question"), 64 * KIB)
    b = prefix_of(chat(SYSTEM[:2000], "another question"), 64 * KIB)
    idx.learn(a, 1)
    idx.learn(b, 2)
    again = prefix_of(chat(SYSTEM, "first question", "second question"), 64 * KIB)
    depth = idx.warm(again, {1, 2})
    assert depth[1] >= len(SYSTEM) // BLOCK_BYTES and depth[2] == 2000 // BLOCK_BYTES
    assert idx.warm(again, {2}) == {2: 2000 // BLOCK_BYTES}  # only live replicas count
    assert idx.warm(prefix_of(chat("nothing alike", "x"), 64 * KIB), {1, 2}) == {}


def test_the_index_never_passes_its_bound_and_forgets_the_oldest():
    idx = Index(100 * ENTRY_BYTES)
    first = prefix_of(chat("the first prompt " * 10, "x"), 64 * KIB)
    idx.learn(first, 1)
    for i in range(1000):
        idx.learn(prefix_of(chat(f"unique prompt {i} " * 5, "x"), 64 * KIB), 1 + i % 3)
        assert len(idx) <= 100
    assert idx.warm(first, {1, 2, 3}) == {} and idx.evicted > 0


def test_an_entry_costs_the_index_less_than_its_estimate():
    idx = Index(1 << 30)
    prompts = [prefix_of(chat(f"prompt {i} " * 40, "x"), 64 * KIB) for i in range(2000)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i, p in enumerate(prompts):
        idx.learn(p, 1 + i % 4)
        idx.learn(p, 2 + i % 4)  # two holders: the usual worst
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert used / len(idx) < ENTRY_BYTES, used / len(idx)


def test_misses_in_a_row_drop_what_was_believed_of_that_replica_and_one_miss_does_not():
    # One miss is one prompt evicted, and says nothing of the others: dropping them all turned one eviction into a
    # cascade of cold prefills (benchmarks/prefix.py). Misses in a row, no hit between, say the replica lost its cache.
    router = Router(1 << 20, 100)
    a = backend("a")
    older = prefix_of(chat("an older prompt " * 200, "q"), 64 * KIB)
    router.pick("prefix", "m", [a], 0.0, 0, prefix=older)

    def turn(i: int):
        c = router.pick("prefix", "m", [a], 0.0, 0, prefix=prefix_of(chat(SYSTEM, f"q{i}"), 64 * KIB))
        assert i == 0 or (c.reason is Reason.WARM and c.warm > 0)
        return c

    turn(0)
    for i in range(1, MISSES_TO_DROP):
        assert router.answered(turn(i), 1000, 3) is False
        assert router.index.warm(older, {a.token})  # still believed
    assert router.answered(turn(10), 1000, 990) is True  # a hit: the count starts again
    for i in range(20, 20 + MISSES_TO_DROP - 1):
        router.answered(turn(i), 1000, 3)
    assert router.index.warm(older, {a.token})
    router.answered(turn(99), 1000, 3)  # the last of MISSES_TO_DROP in a row
    assert router.index.warm(older, {a.token}) == {}
    assert router.index.warm(prefix_of(chat(SYSTEM, "q99"), 64 * KIB), {a.token})  # what it was just sent, it holds


# --------------------------------------------------------------------------- the choice


def test_a_prefix_warm_nowhere_goes_where_it_hashes_and_the_next_one_finds_it_warm():
    router = Router(1 << 20, 100)
    replicas = [backend(f"m-{i}") for i in range(4)]
    for g in range(12):
        p = prefix_of(chat(f"group {g} system prompt " * 100, "hello"), 64 * KIB)
        c = router.pick("prefix", "m", replicas, 0.0, g, prefix=p)
        assert c.reason is Reason.HASHED
        assert c.backend.replica == replicas[rendezvous(p.ring, [b.replica for b in replicas], [1.0] * 4)].replica
        nxt = router.pick("prefix", "m", replicas, 0.0, g, prefix=prefix_of(chat(f"group {g} system prompt " * 100, "again"), 64 * KIB))
        assert (nxt.reason, nxt.backend) == (Reason.WARM, c.backend)
    # Another gateway (another router, the same replicas from the same log) agrees, knowing nothing.
    other = Router(1 << 20, 100)
    mine = [backend(f"m-{i}") for i in range(4)]
    for g in range(12):
        p = prefix_of(chat(f"group {g} system prompt " * 100, "hello"), 64 * KIB)
        assert other.pick("prefix", "m", mine, 0.0, 0, prefix=p).backend.replica == router.pick("prefix", "m", replicas, 0.0, 0, prefix=p).backend.replica


def test_bounded_load_overflows_a_saturated_warm_replica_to_the_next_best():
    router = Router(1 << 20, 100, Bounds(epsilon=0.25, floor=2.0))
    a, b, c = backend("a"), backend("b"), backend("c")
    p = prefix_of(chat(SYSTEM, "q"), 64 * KIB)
    home = router.pick("prefix", "m", [a, b, c], 0.0, 0, prefix=p).backend
    home.outstanding = 1  # under the floor: it keeps its warm prefix
    assert router.pick("prefix", "m", [a, b, c], 0.0, 0, prefix=p).backend is home
    home.outstanding = 6  # past (1 + 0.25) x the mean and the floor: saturated
    over = router.pick("prefix", "m", [a, b, c], 0.0, 0, prefix=p)
    assert over.reason is Reason.OVERFLOW and over.backend is not home
    # Now warm in two places: the less loaded of them takes the next, as warm.
    nxt = router.pick("prefix", "m", [a, b, c], 0.0, 0, prefix=p)
    assert nxt.backend is over.backend and nxt.reason is Reason.WARM
    # A prompt warm nowhere goes where it hashes unless that one has more outstanding than the least loaded.
    cold = prefix_of(chat("a new prompt " * 300, "q"), 64 * KIB)
    hashed = router.pick("prefix", "m", [a, b, c], 0.0, 0, prefix=cold)
    assert hashed.reason is Reason.HASHED
    others = [x for x in (a, b, c) if x is not hashed.backend]
    for x in (a, b, c):
        x.outstanding = 0
    hashed.backend.outstanding = 1
    fresh = prefix_of(chat("a new prompt " * 300, "another q"), 64 * KIB)
    router.index.drop(hashed.backend.token, router.index.seq)  # as if it never had it: cold everywhere
    moved = router.pick("prefix", "m", [a, b, c], 0.0, 0, prefix=fresh)
    assert moved.reason is Reason.OVERFLOW and moved.backend in others
    # Weight counts: a replica of weight 4 carries 4 times the requests before it is saturated.
    big, small = backend("big", 4.0), backend("small")
    q = prefix_of(chat("another prompt " * 300, "q"), 64 * KIB)
    router.index.learn(q, big.token)
    big.outstanding = 7
    assert router.pick("prefix", "m", [big, small], 0.0, 0, prefix=q).backend is big


def test_a_replica_that_left_the_table_is_forgotten_at_once():
    router = Router(1 << 20, 100)
    a, b = backend("m-1"), backend("m-2")
    p = prefix_of(chat(SYSTEM, "q"), 64 * KIB)
    home = router.pick("prefix", "m", [a, b], 0.0, 0, prefix=p).backend
    other = b if home is a else a
    # Stopped or draining: the table no longer lists it; only the other is chosen, hashed there.
    c = router.pick("prefix", "m", [other], 0.0, 0, prefix=p)
    assert c.backend is other and c.reason is Reason.HASHED
    # Restarted (a new generation): a new backend for the same replica id, cold.
    reborn = backend(home.replica)
    router.forget([home.token])
    assert router.index.warm(p, {reborn.token, other.token}) == {other.token: len(p.hashes)}
    # Excluded (tried and failed) or its breaker open: never chosen.
    assert router.pick("prefix", "m", [other], 0.0, 0, exclude=(other.replica,), prefix=p) is None
    for _ in range(3):
        other.breaker.failure(100.0)
    assert router.pick("prefix", "m", [other], 100.0, 0, prefix=p) is None


def test_a_session_stays_on_its_replica_while_it_is_healthy():
    router = Router(1 << 20, 2)
    a, b = backend("a"), backend("b")
    first = router.pick("prefix", "m", [a, b], 0.0, 0, prefix=prefix_of(chat("prompt one " * 50, "x"), 64 * KIB), session="alice")
    for i in range(5):  # prompts that share nothing: the session decides
        c = router.pick("prefix", "m", [a, b], 0.0, i, prefix=prefix_of(chat(f"unrelated {i} " * 50, "x"), 64 * KIB), session="alice")
        assert (c.backend, c.reason) == (first.backend, Reason.SESSION)
    # Its replica gone: the session moves, and stays where it moved.
    rest = [x for x in (a, b) if x is not first.backend]
    moved = router.pick("prefix", "m", rest, 0.0, 0, prefix=prefix_of(chat("prompt one " * 50, "x"), 64 * KIB), session="alice")
    assert moved.reason is not Reason.SESSION
    assert router.pick("prefix", "m", [a, b], 0.0, 0, prefix=None, session="alice").reason is Reason.SESSION
    # The same session name for another model is another session; sessions are an LRU of `most`.
    assert Sessions.key("m", "alice") != Sessions.key("n", "alice")
    for who in ("bob", "carol", "dave"):
        router.pick("prefix", "m", [a, b], 0.0, 0, session=who)
    assert len(router.sessions.by_key) == 2


def test_least_load_and_round_robin_are_the_catalogs_other_policies():
    router = Router(1 << 20, 100)
    a, b, c = backend("a"), backend("b"), backend("c")
    p = prefix_of(chat(SYSTEM, "q"), 64 * KIB)
    rr = [router.pick("round-robin", "m", [a, b, c], 0.0, t, prefix=p) for t in range(6)]
    assert [x.backend.replica for x in rr] == ["a", "b", "c", "a", "b", "c"] and {x.reason for x in rr} == {Reason.ROUND_ROBIN}
    a.outstanding, b.outstanding = 2, 0
    c.outstanding = 1
    ll = router.pick("least-load", "m", [a, b, c], 0.0, 0, prefix=p)
    assert (ll.backend, ll.reason) == (b, Reason.LEAST_LOAD)
    assert len(router.index) == 0  # neither teaches the index
    assert router.pick("prefix", "m", [a, b, c], 0.0, 0, prefix=None).reason is Reason.LEAST_LOAD  # no prompt


# --------------------------------------------------------------------------- properties


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5),  # which group's prompt
            st.integers(0, 3),  # its length in hundreds of bytes
            st.frozensets(st.integers(0, 5)),  # the replicas the table lists as ready now
            st.frozensets(st.integers(0, 5), max_size=2),  # tried and failed
            st.lists(st.integers(0, 9), min_size=6, max_size=6),  # outstanding per replica
            st.sampled_from(["", "s1", "s2"]),  # a session
            st.integers(0, 2),  # what the engine then said: 0 nothing, 1 a miss, 2 a hit
        ),
        max_size=40,
    ),
    st.integers(1, 12),
)
def test_the_index_stays_in_its_bound_and_the_choice_only_goes_to_ready_replicas(steps, blocks):
    router = Router(blocks * ENTRY_BYTES, 3, Bounds(0.25, 2.0))
    pool = [backend(f"m-{i}", weight=1.0 + i % 2) for i in range(6)]
    for group, length, ready, tried, loads, session, said in steps:
        listed = [pool[i] for i in sorted(ready)]
        for b, n in zip(pool, loads):
            b.outstanding = n
        body = chat(f"group {group} " * (10 + 30 * length), "q")
        c = router.pick("prefix", "m", listed, 0.0, 0, exclude=tuple(pool[i].replica for i in tried), prefix=prefix_of(body, 2 * KIB),
                        session=session)  # fmt: skip
        allowed = [b for b in listed if b.replica not in {pool[i].replica for i in tried}]
        if not allowed:
            assert c is None
        else:
            assert c is not None and c.backend in allowed
            if said:
                router.answered(c, 400, 0 if said == 1 else 400)
        assert len(router.index) <= router.index.capacity == blocks
        assert len(router.sessions.by_key) <= 3


# --------------------------------------------------------------------------- in the log, and in `ctl describe model`


def test_the_gateways_reports_of_where_requests_went_are_summed_per_replica_and_described():
    from llmgw.core.contract import events as ev
    from llmgw.core.folding.fold import apply
    from llmgw.core.folding.state import Replica, State
    from llmgw.ctl import views

    assert tuple(r.value for r in Reason) == ev.ROUTE_REASONS
    state = State()
    model = ev.ModelSpec(name="m", profiles=[ev.ProfileSpec(name="p", gpus=0)])
    apply(state, 1, ev.subject_for(ev.ModelApplied(at=1.0, model=model)), ev.encode(ev.ModelApplied(at=1.0, model=model)))
    state.replicas["m-1"] = Replica(id="m-1", model="m", profile="p", fingerprint="", shards=[])
    routes = [
        ev.RouteCount("m-1", "hashed", 1, 600, 0, 0), ev.RouteCount("m-1", "warm", 3, 1800, 1790, 3),
        ev.RouteCount("m-9", "warm", 5, 5, 5, 5),  # a replica the state does not have: not counted
        ev.RouteCount("m-1", "prompt_tokens", 7, 0, 0, 0),  # not a reason: not counted
    ]  # fmt: skip
    for seq, gw in ((2, "gw1"), (3, "gw2")):
        load = ev.ModelLoad(at=2.0, gateway=gw, model="m", in_flight=0, routes=routes)
        apply(state, seq, ev.subject_for(load), ev.encode(load))
    assert state.models["m"].routed == {"m-1": {"hashed": 2, "warm": 6, "prompt_tokens": 4800, "cached_tokens": 3580, "hits": 6}}
    from llmgw.console.views import models_view

    assert models_view(state)[0]["routing"] == {"policy": "prefix", "replicas": state.models["m"].routed}  # the console's
    page = {"routing": {"policy": "prefix", "replicas": state.models["m"].routed}}
    text = "\n".join(views._routing(page["routing"]))
    assert "Routing: prefix" in text and "m-1" in text and "75%" in text
