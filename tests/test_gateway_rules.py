"""The gateway's rules, pure: the routing table as a fold, the choice of a
replica, the breaker, per-key limits, coalesced load reports, metrics, and
who may use which model. No I/O anywhere here."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import msgspec

from llmgw.core.contract import events as ev
from llmgw.core.contract.catalog import fingerprint
from llmgw.core.contract.tenancy import may_use
from llmgw.gateway import api, intake
from llmgw.gateway.limits import Bucket, retry_after
from llmgw.gateway.load import MIN_INTERVAL_S, REPEAT_S, Loads
from llmgw.gateway.metrics import Metrics
from llmgw.agent.engines import identity
from llmgw.gateway.serves import EVERYTHING
from llmgw.gateway.routing import (
    BREAKER_COOLDOWN_S,
    BREAKER_FAILURES,
    Backend,
    Breaker,
    NoneReady,
    Route,
    Target,
    build,
    choose,
    identity_mismatch,
    split_endpoint,
    when_none_ready,
)

from .scenario import Fleet, model


# --------------------------------------------------------------------------- tenancy


def test_a_key_reaches_shared_models_its_owners_and_its_ancestors_only():
    assert may_use("org/team", "")
    assert may_use("org/team", "org/team")
    assert may_use("org/team", "org")
    assert may_use("org/team/x", "org")
    assert not may_use("org/team", "org/other")
    assert not may_use("org", "org/team")  # not a child's
    assert not may_use("organisation", "org")  # a prefix of a name is not an ancestor
    assert not may_use("", "org")


# --------------------------------------------------------------------------- the table


def ready_fleet() -> Fleet:
    f = Fleet()
    f.register("n1", gpus=4)
    big = ev.ProfileSpec(name="big", gpus=1, weight=2.5)
    f.apply(model("chat", min_replicas=2, aliases=["c", "od"], profiles=[big]))
    f.apply(model("od", min_replicas=0, on_demand=True))
    f.apply(model("off", min_replicas=0))
    f.decide()
    for rid in ("chat-1", "chat-2"):
        sh = f.state.replicas[rid].shards[0]
        for st in ("starting", "loading", "ready"):
            f.publish(ev.ShardStatus(at=f.tick(), node="n1", replica=rid, shard=sh.id, generation=sh.generation,
                                     state=st, endpoint=f"http://10.0.0.1:{sh.port}/" if st == "ready" else ""))
    return f


def test_the_table_is_a_fold_of_ready_replicas_endpoints_weights_and_names():
    f = ready_fleet()
    table = build(f.state)
    chat = table.resolve("c")
    assert chat is table.routes["chat"] and table.resolve("chat") is chat
    assert table.resolve("od").name == "od"  # a model's own name wins over another's alias
    assert [t.replica for t in chat.targets] == ["chat-1", "chat-2"]
    port = f.state.replicas["chat-1"].shards[0].port
    gen = f.state.replicas["chat-1"].shards[0].generation
    # Its engine's key is read under its rank 0 shard's node, id and generation.
    assert chat.targets[0] == Target("chat-1", "chat", f"http://10.0.0.1:{port}", 2.5, key_name=f"n1.chat-1=2E0.{gen}")
    assert table.routes["od"].no_wait == "" and table.routes["od"].targets == ()
    assert "runs no replica" in table.routes["off"].no_wait

    # Draining (stopping) and failed replicas are no longer routed; the table follows the log.
    f.publish(ev.Decided(at=f.tick(), basis=0, actions=[ev.StopReplica(replica="chat-1", reason="t", drain_s=30)]))
    assert [t.replica for t in build(f.state).routes["chat"].targets] == ["chat-2"]
    sh = f.state.replicas["chat-2"].shards[0]
    f.publish(ev.ShardStatus(at=f.tick(), node="n1", replica="chat-2", shard=sh.id, generation=sh.generation, state="failed"))
    assert build(f.state).routes["chat"].targets == ()
    f.remove("chat")
    assert build(f.state).resolve("c") is None


def test_a_target_carries_the_identity_its_engine_was_given():
    f = ready_fleet()
    sh = f.state.replicas["chat-1"].shards[0]
    me = identity("chat", sh.id, sh.generation)
    f.publish(ev.ShardStatus(at=f.tick(), node="n1", replica="chat-1", shard=sh.id, generation=sh.generation,
                             state="ready", endpoint="http://10.0.0.1:1", identity=me))  # fmt: skip
    targets = {t.replica: t for t in build(f.state).routes["chat"].targets}
    assert targets["chat-1"].identity == me and targets["chat-1"].endpoint == "http://10.0.0.1:1"
    assert targets["chat-2"].identity == ""  # reported none: not checked
    assert me.startswith("chat@") and me > "chat"  # sorts after the model's name (llama.cpp answers with the first)


def test_an_engine_is_the_replicas_only_if_its_model_list_names_its_identity():
    me = "chat@chat-1.0/7"
    llama = b'{"object":"list","data":[{"id":"chat","aliases":["chat","chat@chat-1.0/7"]}]}'
    vllm = b'{"object":"list","data":[{"id":"chat"},{"id":"chat@chat-1.0/7"}]}'
    assert identity_mismatch(200, llama, me) == "" and identity_mismatch(200, vllm, me) == ""
    # Another replica of the same model, an older generation of this one, another model, a stranger.
    assert "not chat@chat-1.0/7" in identity_mismatch(200, llama.replace(b"-1.0/7", b"-2.0/9"), me)
    assert "lists chat, chat@chat-1.0/6" in identity_mismatch(200, llama.replace(b"/7", b"/6"), me)
    assert "lists smollm2, smollm2@" in identity_mismatch(200, b'{"data":[{"id":"smollm2","aliases":["smollm2@smollm2-1.0/3"]}]}', me)
    assert "answered 404" in identity_mismatch(404, b"Not Found", me)
    assert "not an OpenAI list of models" in identity_mismatch(200, b'{"id":"c","object":"text_completion"}', me)
    assert "not an OpenAI list of models" in identity_mismatch(200, b"hello", me)
    assert "lists no model" in identity_mismatch(200, b'{"data":[]}', me)


def test_a_request_waits_while_a_replica_is_coming_and_fails_only_when_none_is():
    grace = 5.0
    on_demand = Route("od")
    assert when_none_ready(on_demand, 0, 0.0, grace) is NoneReady.WAIT  # nothing tried: load brings one
    assert when_none_ready(Route("off", no_wait="parked"), 0, 0.0, grace) is NoneReady.REFUSE
    assert when_none_ready(None, 0, 0.0, grace) is NoneReady.REFUSE  # removed meanwhile
    # Its replicas failed the request: it waits for one coming, or for the log to say one is.
    assert when_none_ready(Route("m", coming=1), 1, 60.0, grace) is NoneReady.WAIT
    assert when_none_ready(Route("m"), 1, 1.0, grace) is NoneReady.WAIT
    assert when_none_ready(Route("m"), 1, grace, grace) is NoneReady.FAIL
    assert when_none_ready(Route("m", no_wait="parked"), 1, 0.0, grace) is NoneReady.FAIL


def test_replicas_coming_are_placing_starting_loading_failed_or_lacking():
    f = Fleet()
    f.register("n1", gpus=2)
    f.apply(model("m", min_replicas=1))
    f.apply(model("od", min_replicas=0, on_demand=True))
    assert build(f.state).routes["m"].coming == 1  # decided 1, none placed yet
    f.decide()
    assert build(f.state).routes["od"].coming == 0  # at zero: until load asks
    (rid,) = f.state.replicas
    sh = f.state.replicas[rid].shards[0].id
    for st in ("starting", "loading"):
        f.report(sh, st)
        assert build(f.state).routes["m"].coming == 1, st
    f.report(sh, "ready")
    assert build(f.state).routes["m"].coming == 0
    f.report(sh, "failed", "exit 9")
    assert build(f.state).routes["m"].coming == 1  # its replacement follows
    f.decide()
    assert [r.state for r in f.state.replicas.values()] == ["placing"] and build(f.state).routes["m"].coming == 1
    f.state.models["m"].parked = "parked: failed"
    assert build(f.state).routes["m"].coming == 0


def test_keys_are_indexed_by_their_hash():
    f = Fleet()
    digest = hashlib.sha256(b"sk-1").hexdigest()
    f.publish(ev.ApiKeyApplied(at=1.0, name="k1", owner="org", key_sha256=digest, requests_per_minute=5))
    name, key = build(f.state).keys[digest]
    assert name == "k1" and key.owner == "org" and key.requests_per_minute == 5


def test_a_weight_is_routing_only_and_restarts_nothing():
    p = ev.ProfileSpec(name="p", gpus=1)
    assert fingerprint(msgspec.structs.replace(p, weight=3.0)) == fingerprint(p)
    assert fingerprint(msgspec.structs.replace(p, gpus=2)) != fingerprint(p)


def test_split_endpoint():
    assert split_endpoint("http://127.0.0.1:20000") == ("127.0.0.1", 20000)
    assert split_endpoint("http://node-3:8000/") == ("node-3", 8000)
    assert split_endpoint("http://[::1]:81") == ("::1", 81)
    assert split_endpoint("http://host") == ("host", 80)


# --------------------------------------------------------------------------- the choice and the breaker


def backends(*weights: float) -> list[Backend]:
    return [Backend(Target(f"m-{i}", "m", f"http://h:{i}", w)) for i, w in enumerate(weights, 1)]


def test_least_outstanding_weighted_with_ties_in_turn():
    a, b = backends(1.0, 1.0)
    assert {choose([a, b], 0, t).replica for t in range(4)} == {"m-1", "m-2"}  # ties go round
    a.outstanding = 2
    assert all(choose([a, b], 0, t) is b for t in range(4))
    heavy, light = backends(3.0, 1.0)
    picked = {"m-1": 0, "m-2": 0}
    for t in range(8):  # eight concurrent: three to one
        c = choose([heavy, light], 0, t)
        c.outstanding += 1
        picked[c.replica] += 1
    assert picked == {"m-1": 6, "m-2": 2}
    assert choose([heavy, light], 0, 0, exclude={"m-1"}) is light
    assert choose([heavy], 0, 0, exclude={"m-1"}) is None


def test_the_breaker_opens_after_failures_in_a_row_and_a_probe_closes_it():
    a, b = backends(1.0, 1.0)
    br = a.breaker
    for i in range(BREAKER_FAILURES - 1):
        br.failure(10.0)
    br.success()  # not in a row
    for i in range(BREAKER_FAILURES):
        assert br.allows(10.0)
        br.failure(10.0)
    assert br.state == "open" and not br.allows(10.0)
    assert all(choose([a, b], 10.0, t) is b for t in range(4))
    later = 10.0 + BREAKER_COOLDOWN_S
    assert br.allows(later)
    br.picked(later)  # the probe
    assert br.state == "half-open" and not br.allows(later)  # one probe at a time
    br.failure(later)  # the probe failed: open, for twice as long
    assert br.state == "open" and not br.allows(later + BREAKER_COOLDOWN_S) and br.allows(later + 2 * BREAKER_COOLDOWN_S)
    br.picked(later + 2 * BREAKER_COOLDOWN_S)
    br.released()  # the client left: no verdict, the next request probes
    assert br.allows(later + 2 * BREAKER_COOLDOWN_S)
    br.picked(later + 2 * BREAKER_COOLDOWN_S)
    br.success()
    assert br.state == "closed" and br.cooldown == BREAKER_COOLDOWN_S and Breaker().state == "closed"


# --------------------------------------------------------------------------- limits


def test_a_bucket_lets_a_minutes_burst_through_then_its_rate_with_retry_after():
    """The one count a gateway keeps of a rate while NATS does not answer (shared_limits.py, policy open)."""
    b = Bucket(3, 0.0)
    assert [b.take(1, 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = b.take(1, 0.0)
    assert wait == 20.0 and retry_after(wait) == 20
    assert b.take(1, 19.9) > 0 and b.take(1, 20.0) == 0.0


# --------------------------------------------------------------------------- load reports


def test_load_is_reported_at_once_then_coalesced_then_repeated_and_zero_said_once():
    loads = Loads()
    m = loads.meter("m", 100.0)
    m.change(100.0, queued=1)  # a request waits: the wake-up goes at once
    (r,) = loads.due(100.0)
    assert (r.model, r.in_flight, r.queued) == ("m", 0, 1)
    m.change(100.2, queued=-1, in_flight=1)
    for i in range(1, 9):  # a burst within the second: no report
        m.change(100.2 + i * 0.05, in_flight=1)
        assert loads.due(100.2 + i * 0.05) == []
    (r,) = loads.due(100.0 + MIN_INTERVAL_S)
    assert r.in_flight == 9 and r.queued >= 1  # queued within the window counts (rounded up)
    assert loads.due(101.5) == []
    (r,) = loads.due(101.5 + MIN_INTERVAL_S)
    assert (r.in_flight, r.queued) == (9, 0)
    assert loads.due(102.5 + REPEAT_S - 0.5) == []  # unchanged: repeated only after REPEAT_S
    (r,) = loads.due(102.5 + REPEAT_S)
    assert (r.in_flight, r.queued) == (9, 0)
    t = 102.5 + REPEAT_S
    m.change(t + 0.1, in_flight=-9)
    m.tokens_in, m.tokens_out, m.last_used = 70, 30, t
    (r,) = loads.due(t + 1.0)
    assert r.in_flight == 1 and (r.tokens_in, r.tokens_out, r.last_used) == (70, 30, t)  # the mean, rounded up
    (r,) = loads.due(t + 2.0)
    assert (r.in_flight, r.queued, r.tokens_in) == (0, 0, 0)  # zero, once
    assert loads.due(t + 3.0) == [] and "m" not in loads.meters


def test_a_request_shorter_than_a_report_still_counts():
    loads = Loads()
    m = loads.meter("m", 0.0)
    m.change(0.1, in_flight=1)
    m.change(0.2, in_flight=-1)
    (r,) = loads.due(0.3)
    assert r.in_flight == 1


def test_a_report_counts_the_requests_finished_the_cached_prompt_tokens_and_the_first_byte_percentiles():
    loads = Loads()
    m = loads.meter("m", 0.0)
    for i, first in enumerate([0.5, 0.1, 0.3, 0.2, 0.4, 0.9, 0.6, 0.8, 0.7, 1.0]):
        m.change(0.01 * i, in_flight=1)
        m.change(0.01 * i + 0.005, in_flight=-1)
        m.finished(first)
    m.finished(None)  # one that never had an answer (a 503): counted, no time to first byte
    m.tokens_in, m.tokens_cached = 100, 40
    (r,) = loads.due(1.0)
    assert (r.requests, r.tokens_in, r.tokens_cached) == (11, 100, 40)
    assert (r.ttft_p50, r.ttft_p90) == (0.5, 0.9)  # nearest rank of the ten answered
    # A request finished alone is worth a report (the plots' requests/s), and the next window starts afresh.
    m.finished(0.25)
    (r,) = loads.due(2.0)
    assert (r.requests, r.tokens_cached, r.ttft_p50, r.ttft_p90) == (1, 0, 0.25, 0.25)
    assert loads.due(3.0) == []  # nothing more to say


# --------------------------------------------------------------------------- the API's shapes, metrics


def test_request_head_usage_and_errors():
    head = api.request_head(b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}')
    assert (head.model, head.stream) == ("m", True)
    for bad in (b"[1]", b"{", b'{"model": 3}'):
        try:
            api.request_head(bad)
        except ValueError:
            continue
        raise AssertionError(bad)
    named = intake.prepare(b"/v1/models", b'{"model": "alias", "x": [1]}', "real", "alias", EVERYTHING)
    assert msgspec.json.decode(named.body) == {"model": "real", "x": [1]}
    assert api.usage_of(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4}}') == (3, 4, 0)
    assert api.usage_of(b'{"usage": {"prompt_tokens": 9, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 5}}}') == (9, 4, 5)
    assert api.usage_of(b'{"usage": {"prompt_tokens": 2, "total_tokens": 2}}') == (2, 0, 0)  # embeddings, rerank
    assert api.usage_of(b'{"timings": {"prompt_n": 5, "predicted_n": 6}}') == (5, 6, 0)
    assert api.usage_of(b'{"timings": {"prompt_n": 5, "predicted_n": 6, "cache_n": 3}}') == (8, 6, 3)
    assert api.usage_of(b'{"usage": {"prompt_tokens": 9, "completion_tokens": 1, "prompt_tokens_details": null}}') == (9, 1, 0)
    assert api.usage_of(b'{"usage": null}') is None
    tail = b'data: {"choices": []}\n\ndata: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}\n\ndata: [DONE]\n\n'
    assert api.stream_usage(tail) == (1, 2, 0)
    body = msgspec.json.decode(api.error_body(429, "slow down", "rate_limit_exceeded"))
    assert body == {"error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": "rate_limit_exceeded"}}
    assert api.sse_error(502, "gone").startswith(b'data: {"error":')


def test_the_model_list_shows_what_a_key_reaches():
    f = Fleet()
    f.apply(model("shared", aliases=["s"]))
    f.apply(model("theirs", owner="org/other"))
    f.apply(model("ours", owner="org"))
    table = build(f.state)
    ids = lambda owner: sorted(m["id"] for m in msgspec.json.decode(api.models_list(table, owner))["data"])  # noqa: E731
    assert ids(None) == ["ours", "s", "shared", "theirs"]
    assert ids("org/team") == ["ours", "s", "shared"]


def test_metrics_render_prometheus_text():
    m = Metrics()
    m.answered("m", "m-1", 200, 0.003)
    m.answered("m", "m-1", 200, 0.2)
    m.first_token("m", "m-1", 0.1)
    m.used("m", "m-1", 10, 5)
    m.retried("m")
    text = m.render({"m": (2, 1)}, [("m", "m-1", 2, False)]).decode()
    from .conftest import sample

    one = {"model": "m", "replica": "m-1"}
    assert sample(text, "llmgw_gateway_requests_total", **one, code="200") == 2
    assert sample(text, "llmgw_gateway_request_seconds_bucket", **one, le="0.005") == 1
    assert sample(text, "llmgw_gateway_request_seconds_bucket", **one, le="+Inf") == 2
    assert sample(text, "llmgw_gateway_time_to_first_token_seconds_count", **one) == 1
    assert sample(text, "llmgw_gateway_tokens_total", **one, kind="completion") == 5
    assert sample(text, "llmgw_gateway_queued", model="m") == 1 and sample(text, "llmgw_gateway_breaker_open", **one) == 0
    for line in text.splitlines():  # every sample line: name{labels} number
        if not line.startswith("#"):
            float(line.rsplit(" ", 1)[1])


# --------------------------------------------------------------------------- purity


def test_the_rules_of_the_gateway_do_no_io():
    pure = ("routing.py", "limits.py", "load.py", "metrics.py", "api.py", "edge_limits.py")
    shell = {"asyncio", "socket", "time", "httptools", "uvloop", "nats", "os", "random", "logging"}
    for name in pure:
        path = Path(__file__).resolve().parent.parent / "llmgw" / "gateway" / name
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [f"llmgw.gateway.{node.module}"]
            for n in names:
                assert n.split(".")[0] not in shell, f"{name} imports {n}"
                assert n not in (
                    "llmgw.gateway.server", "llmgw.gateway.edge", "llmgw.gateway.proxying",
                    "llmgw.gateway.table_upkeep", "llmgw.gateway.upstream",
                ), f"{name} imports the shell"


def test_a_weight_written_out_keeps_the_fingerprint_of_a_profile_without_one():
    p = ev.ProfileSpec(name="p", gpus=1, args=["--x"])
    assert fingerprint(ev.ProfileSpec(name="p", gpus=1, args=["--x"], weight=float("1.0"))) == fingerprint(p)
