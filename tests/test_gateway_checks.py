"""Requests checked as OpenAI checks them, tools put as llama.cpp honours
them, and what a model serves read off its profiles (issue 31, parts 1, 4
and 5): the pure parts, without processes."""

from __future__ import annotations

import msgspec
import pytest

from llmgw.agent import llamacpp_options
from llmgw.agent.chat_templates import BUILTIN, HERMES_CALL_OPEN
from llmgw.core.contract.catalog import fingerprint
from llmgw.core.contract.events import ModelSpec, ProfileSpec
from llmgw.gateway import checks, intake, serves, tools
from llmgw.gateway.engine_errors import openai_error

LLAMA = serves.of(ModelSpec(name="smollm2", profiles=[ProfileSpec(name="cpu", engine="llama.cpp", model="smollm2", args=["--ctx-size", "1024", "--parallel", "1"])]))
ASK = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def refused(body: dict, path: bytes = b"/v1/chat/completions", what: serves.Serves = LLAMA) -> checks.Refusal | None:
    return checks.CHECKS[path](body, what, "smollm2")


def test_serves_from_profiles():
    assert (LLAMA.llama_cpp, LLAMA.hermes, LLAMA.tools, LLAMA.embeddings, LLAMA.rerank, LLAMA.context) == (True, True, True, False, False, 1024)
    emb = serves.of(ModelSpec(name="e", profiles=[ProfileSpec(name="p", engine="llama.cpp", model="/m.gguf", args=["--embeddings", "--pooling", "mean"])]))
    assert (emb.embeddings, emb.rerank, emb.hermes, emb.context) == (True, False, False, 2048)
    assert "embeddings" in emb.what() and "rerank" not in emb.what()
    rr = serves.of(ModelSpec(name="r", profiles=[ProfileSpec(name="p", engine="llama.cpp", args=["--reranking"])]))
    assert rr.rerank and rr.embeddings
    mixed = serves.of(ModelSpec(name="m", profiles=[ProfileSpec(name="a", engine="vllm"), ProfileSpec(name="b", engine="vllm", tools=False)]))
    assert not mixed.tools and not mixed.llama_cpp and mixed.embeddings and mixed.context == 0
    # `tools` is serving only: the fingerprint (a restart) does not move.
    assert fingerprint(ProfileSpec(name="a", tools=False)) == fingerprint(ProfileSpec(name="a"))


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"model": "m"}, "messages", "missing_required_parameter"),
        ({"messages": []}, "messages", "empty_array"),
        ({"messages": "hi"}, "messages", "invalid_type"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "invalid_value"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "invalid_type"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "missing_required_parameter"),
        ({"messages": ASK, "temperature": 5}, "temperature", "decimal_above_max_value"),
        ({"messages": ASK, "temperature": -1}, "temperature", "decimal_below_min_value"),
        ({"messages": ASK, "temperature": "hot"}, "temperature", "invalid_type"),
        ({"messages": ASK, "top_p": 1.5}, "top_p", "decimal_above_max_value"),
        ({"messages": ASK, "n": 0}, "n", "integer_below_min_value"),
        ({"messages": ASK, "max_tokens": 100000}, "max_tokens", "invalid_value"),
        ({"messages": ASK, "max_tokens": 0}, "max_tokens", "integer_below_min_value"),
        ({"messages": ASK, "stream": "yes"}, "stream", "invalid_type"),
        ({"messages": ASK, "stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        ({"messages": ASK, "tool_choice": "required"}, "tool_choice", "invalid_value"),
        ({"messages": ASK, "tools": [{"type": "retrieval"}]}, "tools[0].type", "invalid_value"),
        ({"messages": ASK, "tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name", "invalid_value"),
        ({"messages": ASK, "tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "invalid_value"),
        ({"messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "invalid_value"),
        ({"messages": ASK, "top_logprobs": 3}, "top_logprobs", "invalid_value"),
    ],
)
def test_chat_refused_as_openai_refuses(body, param, code):
    r = refused(body)
    assert r is not None and (r.param, r.code, r.status) == (param, code, 400), r


def test_chat_taken():
    assert refused({"messages": ASK, "temperature": 0, "top_p": 1, "max_tokens": 16, "stream": True, "stream_options": {"include_usage": True}}) is None
    assert refused({"messages": [{"role": "assistant", "content": None, "tool_calls": []}, *ASK], "tools": [WEATHER], "tool_choice": "auto"}) is None
    assert refused({"messages": ASK, "grammar": "root ::= x"}) is None  # an engine's own extension passes


def test_tools_refused_where_the_profile_says_none():
    none = serves.of(ModelSpec(name="m", profiles=[ProfileSpec(name="p", engine="llama.cpp", tools=False)]))
    r = refused({"messages": ASK, "tools": [WEATHER]}, what=none)
    assert r is not None and (r.param, r.code) == ("tools", "tools_not_supported") and "tools: false" in r.message
    assert refused({"messages": ASK, "tools": [WEATHER], "tool_choice": "none"}, what=none) is None


def test_completions_embeddings_rerank_checks():
    c = b"/v1/completions"
    assert refused({"model": "m"}, c).code == "missing_required_parameter"
    for param, value in (("echo", True), ("logprobs", 2), ("suffix", "x"), ("best_of", 2)):
        r = refused({"prompt": "x", param: value}, c)
        assert r is not None and (r.param, r.code) == (param, "unsupported_parameter"), r
    assert refused({"prompt": "x", "max_tokens": 4}, c) is None
    r = refused({"input": "x"}, b"/v1/embeddings")
    assert r.code == "embeddings_not_served" and "--pooling, mean" in r.message and "chat completions" in r.message
    emb = serves.Serves(llama_cpp=True)
    assert refused({"input": ""}, b"/v1/embeddings", emb).code == "invalid_value"
    assert refused({"input": []}, b"/v1/embeddings", emb).code == "empty_array"
    assert refused({"input": ["a"], "dimensions": 8}, b"/v1/embeddings", emb).code == "unsupported_parameter"
    assert refused({"input": ["a", "b"]}, b"/v1/embeddings", emb) is None
    assert refused({"query": "q", "documents": ["a"]}, b"/v1/rerank").code == "rerank_not_served"
    assert refused({"query": "q", "documents": []}, b"/v1/rerank", emb).code == "invalid_type"


def test_tool_choice_as_llama_cpp_honours_it():
    named = {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    assert tools.prepare(named, llama_cpp=True, hermes=True)
    assert named["tools"] == [TIME] and named["tool_choice"] == "required"
    assert named["messages"][-1] == {"role": "assistant", "content": HERMES_CALL_OPEN}
    assert named["stop"] == [tools.HERMES_CALL_CLOSE]  # one whole call, not calls repeated to max_tokens
    many = {"messages": ASK, "tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": True, "stop": "x"}
    assert tools.prepare(many, llama_cpp=True, hermes=True) and many["stop"] == "x"
    auto = {"messages": ASK, "tools": [WEATHER], "tool_choice": "auto"}
    assert not tools.prepare(auto, llama_cpp=True, hermes=True) and auto["messages"] == ASK
    other = {"messages": ASK, "tools": [WEATHER], "tool_choice": "required"}
    assert not tools.prepare(other, llama_cpp=False, hermes=False)
    assert HERMES_CALL_OPEN in BUILTIN["llmgw-chatml-tools"].replace("\\n", "\n")


def test_intake_refuses_rewrites_and_passes():
    body = msgspec.json.encode({"model": "alias", "messages": ASK, "tools": [WEATHER], "tool_choice": "required"})
    ready = intake.prepare(b"/v1/chat/completions", body, "smollm2", "alias", LLAMA)
    out = msgspec.json.decode(ready.body)
    assert ready.tools and out["model"] == "smollm2" and out["messages"][-1]["role"] == "assistant"
    plain = msgspec.json.encode({"model": "smollm2", "messages": ASK})
    ready = intake.prepare(b"/v1/chat/completions", plain, "smollm2", "smollm2", LLAMA)
    assert ready.body is plain and not ready.tools  # nothing changed: the same bytes
    unused = msgspec.json.encode({"model": "smollm2", "messages": ASK, "tools": [WEATHER], "tool_choice": "none"})
    assert not intake.prepare(b"/v1/chat/completions", unused, "smollm2", "smollm2", LLAMA).tools
    r = intake.prepare(b"/v1/chat/completions", b'{"model": "smollm2", "messages": []}', "smollm2", "smollm2", LLAMA)
    assert isinstance(r, checks.Refusal) and r.code == "empty_array"
    answer = b'{"id":"chatcmpl-abc","object":"text_completion"}'
    assert intake.completion_ids(answer) == b'{"id":"cmpl-llm-abc","object":"text_completion"}'
    assert len(intake.completion_ids(answer)) == len(answer)


def test_engine_errors_say_openai_codes():
    ctx = b'{"error":{"code":400,"message":"request (1531 tokens) exceeds the available context size (1024 tokens), try increasing it","type":"exceed_context_size_error"}}'
    err = msgspec.json.decode(openai_error(400, ctx, "smollm2"))["error"]
    assert (err["code"], err["param"], err["type"]) == ("context_length_exceeded", "messages", "invalid_request_error")
    emb = b'{"error":{"code":501,"message":"This server does not support embeddings. Start it with `--embeddings`","type":"not_supported_error"}}'
    err = msgspec.json.decode(openai_error(501, emb, "smollm2"))["error"]
    assert err["code"] == "embeddings_not_served" and "chat and completions as well" in err["message"]


def test_llama_cpp_options_passed_through_by_name():
    xllamacpp = pytest.importorskip("xllamacpp")
    p = xllamacpp.CommonParams()
    done = llamacpp_options.apply(p, ["--embeddings", "--pooling", "mean", "-c", "512", "--flash-attn", "off", "--no-jinja", "--cache-reuse=64", "--temp", "0.5"])
    assert p.embedding and p.pooling_type == xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN and p.n_ctx == 512
    assert p.flash_attn_type == xllamacpp.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED and not p.use_jinja
    assert p.n_cache_reuse == 64 and abs(p.sampling.temp - 0.5) < 1e-6 and "pooling_type=mean" in done
    llamacpp_options.apply(p, ["--reranking", "--chat-template", "llmgw-chatml-tools", "--swa-full"])
    assert p.pooling_type == xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_RANK and "<tool_call>" in p.chat_template and p.swa_full
    for bad, says in ((["--bogus"], "--bogus"), (["--pooling", "sideways"], "mean"), (["-c", "many"], "int"), (["--port", "1"], "own"), (["-zz"], "long form")):
        with pytest.raises(llamacpp_options.OptionError, match=says):
            llamacpp_options.apply(p, bad)
