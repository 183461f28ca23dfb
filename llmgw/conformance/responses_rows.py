"""Rows of the matrix for OpenAI's Responses API (`/v1/responses`), asked
with the official `openai` SDK, and the OpenAI Agents SDK's tool loop
through it.

A tool row works when the model called the tool; a 400 saying the model
cannot do tools is a clear error; prose where a call was required is the
silent drop issue 31 found, and FAILS.
"""

from __future__ import annotations

import json

from .matrix import Outcome, Row, Target, Verdict

WEATHER = {
    "type": "function", "name": "get_weather", "description": "The current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}  # fmt: skip


def client(target: Target, url: str | None = None):
    import openai

    return openai.AsyncOpenAI(base_url=url or target.url, api_key=target.key, max_retries=0, timeout=120)


def refused(e: Exception) -> Outcome:
    """An error the SDK raised: clear when it is a 4xx in OpenAI's shape with a message."""
    import openai

    if isinstance(e, openai.APIStatusError) and 400 <= e.status_code < 500 and isinstance(e.body, dict) and e.body.get("message"):
        return Outcome(Verdict.CLEAR_ERROR, f"{e.status_code} {e.body.get('code')}: {e.body['message']}")
    return Outcome(Verdict.FAILS, f"{type(e).__name__}: {e}")


async def text(target: Target) -> Outcome:
    r = await client(target).responses.create(model=target.model, input="Say hello.", instructions="Answer in one short sentence.", max_output_tokens=24)
    if r.status not in ("completed", "incomplete") or not r.output or r.output[0].type != "message":
        return Outcome(Verdict.FAILS, f"status {r.status}, output {r.output!r}")
    return Outcome(Verdict.WORKS, f"{r.status}: {r.output_text!r} ({r.usage.input_tokens} in, {r.usage.output_tokens} out)")


async def streamed(target: Target) -> Outcome:
    kinds, text, final = [], "", None
    async with await client(target).responses.create(model=target.model, input="Count to five.", max_output_tokens=24, stream=True) as stream:
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
    if kinds[:2] != ["response.created", "response.in_progress"] or final is None or kinds[-1] != f"response.{final.status}":
        return Outcome(Verdict.FAILS, f"events {kinds[:3]}...{kinds[-2:]}")
    if final.output_text != text:
        return Outcome(Verdict.FAILS, f"deltas {text!r} are not the final text {final.output_text!r}")
    return Outcome(Verdict.WORKS, f"{len(kinds)} events, {kinds[-1]}")


async def _tool_call(target: Target, stream: bool):
    """(the final Response, or an Outcome when refused)."""
    c = client(target)
    args = dict(model=target.model, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required", max_output_tokens=64)
    try:
        if not stream:
            return await c.responses.create(**args)
        final = None
        async with await c.responses.create(**args, stream=True) as events:
            async for event in events:
                if event.type in ("response.completed", "response.incomplete"):
                    final = event.response
        return final
    except Exception as e:
        return refused(e)


def _called(r) -> Outcome | None:
    if isinstance(r, Outcome):
        return r
    calls = [o for o in r.output if o.type == "function_call"]
    if not calls:
        return Outcome(Verdict.FAILS, f"tool_choice=required answered without a call: {r.output_text[:80]!r}")
    return None


async def tool(target: Target) -> Outcome:
    r = await _tool_call(target, stream=False)
    return _called(r) or Outcome(Verdict.WORKS, f"{r.output[0].name}({r.output[0].arguments})")


async def tool_streamed(target: Target) -> Outcome:
    r = await _tool_call(target, stream=True)
    return _called(r) or Outcome(Verdict.WORKS, f"{r.output[0].name}({r.output[0].arguments})")


async def continued_elsewhere(target: Target) -> Outcome:
    """A stored response continued with previous_response_id through the other gateway."""
    if not target.other_url:
        return Outcome(Verdict.SKIPPED, "no second gateway (--other-url)")
    first = await client(target).responses.create(model=target.model, input="My name is Ada. Say ok.", max_output_tokens=8)
    second = await client(target, target.other_url).responses.create(
        model=target.model, input="What is my name?", previous_response_id=first.id, max_output_tokens=16
    )
    found = await client(target, target.other_url).responses.retrieve(second.id)
    if second.previous_response_id != first.id or found.id != second.id:
        return Outcome(Verdict.FAILS, f"previous_response_id {second.previous_response_id}, retrieved {found.id}")
    return Outcome(Verdict.WORKS, f"{first.id[:13]}… continued on the other gateway: {second.output_text[:60]!r}")


async def tool_output_continued(target: Target) -> Outcome:
    """A function call's output sent back with previous_response_id: the loop of every agent."""
    r = await _tool_call(target, stream=False)
    refused_ = _called(r)
    if refused_ is not None:
        return refused_
    call = next(o for o in r.output if o.type == "function_call")
    after = await client(target, target.other_url).responses.create(
        model=target.model, previous_response_id=r.id, tools=[WEATHER], tool_choice="none", max_output_tokens=32,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"weather": "sunny"})}],
    )  # fmt: skip
    return Outcome(Verdict.WORKS, f"answered after the tool: {after.output_text[:60]!r}")


async def not_stored(target: Target) -> Outcome:
    r = await client(target).responses.create(model=target.model, input="Hi.", store=False, max_output_tokens=4)
    try:
        await client(target).responses.create(model=target.model, input="Again.", previous_response_id=r.id, max_output_tokens=4)
    except Exception as e:
        return refused(e)
    return Outcome(Verdict.FAILS, "a response asked with store=false was found")


async def bad_input(target: Target) -> Outcome:
    """Unknown field, wrong type, out of range, malformed JSON: each a 400 naming what is wrong."""
    from .rawhttp import post

    c = client(target)
    said = []
    for body in ({"model": target.model, "input": "x", "frobnicate": 1}, {"model": target.model, "input": 3},
                 {"model": target.model, "input": "x", "temperature": 9}):  # fmt: skip
        try:
            await c.post("/responses", body=body, cast_to=object)
            return Outcome(Verdict.FAILS, f"accepted {body}")
        except Exception as e:
            out = refused(e)
            if out.verdict is not Verdict.CLEAR_ERROR or not e.body.get("param"):  # type: ignore[attr-defined]
                return Outcome(Verdict.FAILS, f"{body}: {out.detail}")
            said.append(e.body["param"])  # type: ignore[attr-defined]
    status, body = await post(f"{target.url}/responses", b"{not json", {"Authorization": f"Bearer {target.key}"})
    if status != 400 or not body or "error" not in body:
        return Outcome(Verdict.FAILS, f"malformed JSON: {status} {body}")
    return Outcome(Verdict.CLEAR_ERROR, f"400 naming {', '.join(said)}; malformed JSON: {body['error']['message'][:60]}")


async def agent_loop(target: Target) -> Outcome:
    """The OpenAI Agents SDK: a tool-using agent run to its final answer through /v1/responses."""
    import agents
    from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool

    called = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather of a city."""
        called.append(city)
        return f"It is sunny in {city}."

    agents.set_tracing_disabled(True)
    model = OpenAIResponsesModel(model=target.model, openai_client=client(target))
    agent = Agent(
        name="weather", instructions="Use get_weather, then answer in one sentence.", tools=[get_weather], model=model,
        # A tiny model may call tools for ever: required once, then the SDK's reset lets it answer.
        model_settings=ModelSettings(tool_choice="required", max_tokens=128), reset_tool_choice=True,
    )  # fmt: skip
    try:
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4, run_config=RunConfig(tracing_disabled=True))
    except agents.MaxTurnsExceeded:
        return Outcome(Verdict.WORKS if called else Verdict.FAILS, f"the model looped past 4 turns; tool called {len(called)} times")
    except agents.ModelBehaviorError as e:
        # The tool was called and its output sent back; the answer after it ran
        # past max_tokens, and the gateway said so as the Responses API does
        # (status incomplete, reason max_output_tokens), which the SDK raises.
        # A 135M model on a cache-warm prompt did (CI, 2026-12-05): the loop
        # works, the model did not stop.
        if called and "max_output_tokens" in str(e):
            return Outcome(Verdict.WORKS, f"get_weather({called[0]!r}), then an answer past max_tokens, said incomplete")
        return refused(e)
    except Exception as e:
        return refused(e)
    if not called:
        return Outcome(Verdict.FAILS, f"final answer without calling the tool: {str(result.final_output)[:80]!r}")
    return Outcome(Verdict.WORKS, f"get_weather({called[0]!r}) then: {str(result.final_output)[:60]!r}")


ROWS = [
    Row("responses", "text, instructions", text),
    Row("responses", "text, streamed (event order, deltas = final text)", streamed),
    Row("responses", "function tool, tool_choice=required", tool),
    Row("responses", "function tool, tool_choice=required, streamed", tool_streamed),
    Row("responses", "previous_response_id on the other gateway, retrieve", continued_elsewhere),
    Row("responses", "function_call_output after previous_response_id", tool_output_continued),
    Row("responses", "store=false then previous_response_id", not_stored),
    Row("responses", "bad input: unknown field, wrong type, range, bad JSON", bad_input),
    Row("openai agents", "tool-using agent loop to its final answer", agent_loop),
]
