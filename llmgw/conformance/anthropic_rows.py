"""Rows of the matrix for Anthropic's Messages API (`/v1/messages`,
`/v1/messages/count_tokens`), asked with the official `anthropic` SDK (which
sends our key as `x-api-key`; one row sends it as Bearer)."""

from __future__ import annotations

from .matrix import Outcome, Row, Target, Verdict

TOOL = {
    "name": "get_weather", "description": "The current weather of a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}  # fmt: skip
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(target: Target, bearer: bool = False):
    import anthropic

    if bearer:
        return anthropic.AsyncAnthropic(base_url=target.root, auth_token=target.key, api_key=None, max_retries=0, timeout=120)
    return anthropic.AsyncAnthropic(base_url=target.root, api_key=target.key, max_retries=0, timeout=120)


def refused(e: Exception) -> Outcome:
    """Clear: a 4xx in Anthropic's shape, {"type": "error", "error": {"type", "message"}}."""
    import anthropic

    body = getattr(e, "body", None)
    if isinstance(e, anthropic.APIStatusError) and 400 <= e.status_code < 500 and isinstance(body, dict):
        err = body.get("error") or {}
        if body.get("type") == "error" and err.get("type") and err.get("message"):
            return Outcome(Verdict.CLEAR_ERROR, f"{e.status_code} {err['type']}: {err['message']}")
    return Outcome(Verdict.FAILS, f"{type(e).__name__}: {e}")


async def text(target: Target) -> Outcome:
    m = await client(target).messages.create(
        model=target.model, max_tokens=24, system="Answer in one short sentence.",
        messages=[{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada."},
                  {"role": "user", "content": "What is my name?"}],
    )  # fmt: skip
    if m.type != "message" or not m.content or m.content[0].type != "text" or m.stop_reason not in ("end_turn", "max_tokens"):
        return Outcome(Verdict.FAILS, f"{m!r}")
    return Outcome(Verdict.WORKS, f"{m.stop_reason}: {m.content[0].text[:60]!r} ({m.usage.input_tokens} in)")


async def bearer(target: Target) -> Outcome:
    m = await client(target, bearer=True).messages.create(model=target.model, max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    return Outcome(Verdict.WORKS, f"Authorization: Bearer accepted ({m.usage.output_tokens} tokens)")


async def streamed(target: Target) -> Outcome:
    kinds, text = [], ""
    async with client(target).messages.stream(model=target.model, max_tokens=24, messages=[{"role": "user", "content": "Count to five."}]) as stream:
        async for event in stream:
            kinds.append(event.type)
            if event.type == "text":
                text += event.text
        final = await stream.get_final_message()
    raw = [k for k in kinds if k in ("message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop")]
    if raw[:2] != ["message_start", "content_block_start"] or raw[-2:] != ["message_delta", "message_stop"]:
        return Outcome(Verdict.FAILS, f"events {raw}")
    if final.content[0].text != text:
        return Outcome(Verdict.FAILS, f"deltas {text!r} are not the final text {final.content[0].text!r}")
    return Outcome(Verdict.WORKS, f"{len(kinds)} events, {final.stop_reason}, {final.usage.output_tokens} out")


def _used(m) -> Outcome | None:
    uses = [b for b in m.content if b.type == "tool_use"]
    if not uses or m.stop_reason != "tool_use":
        text = "".join(b.text for b in m.content if b.type == "text")
        return Outcome(Verdict.FAILS, f"tool_choice any answered without a tool_use ({m.stop_reason}): {text[:80]!r}")
    return None


async def tools(target: Target) -> Outcome:
    """tool_use, then its tool_result in the next turn."""
    c = client(target)
    try:
        m = await c.messages.create(model=target.model, max_tokens=64, tools=[TOOL], tool_choice={"type": "any"}, messages=ASK)
    except Exception as e:
        return refused(e)
    failed = _used(m)
    if failed is not None:
        return failed
    use = next(b for b in m.content if b.type == "tool_use")
    after = await c.messages.create(
        model=target.model, max_tokens=32, tools=[TOOL],
        messages=[*ASK, {"role": "assistant", "content": m.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C."}]}],
    )  # fmt: skip
    return Outcome(Verdict.WORKS, f"{use.name}({use.input}); then {after.stop_reason}")


async def tools_streamed(target: Target) -> Outcome:
    try:
        async with client(target).messages.stream(model=target.model, max_tokens=64, tools=[TOOL], tool_choice={"type": "any"}, messages=ASK) as s:
            m = await s.get_final_message()
    except Exception as e:
        return refused(e)
    failed = _used(m)
    return failed or Outcome(Verdict.WORKS, f"input_json_delta into {next(b for b in m.content if b.type == 'tool_use').input}")


async def count_tokens(target: Target) -> Outcome:
    c = client(target)
    short = await c.messages.count_tokens(model=target.model, system="You are terse.", messages=[{"role": "user", "content": "Hi"}])
    longer = await c.messages.count_tokens(
        model=target.model, system="You are terse.", tools=[TOOL],
        messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, *ASK],
    )  # fmt: skip
    if not 0 < short.input_tokens < longer.input_tokens:
        return Outcome(Verdict.FAILS, f"counts {short.input_tokens}, {longer.input_tokens}")
    return Outcome(Verdict.WORKS, f"{short.input_tokens} and {longer.input_tokens} tokens (the engine's own count)")


async def bad_input(target: Target) -> Outcome:
    """Unknown field, wrong type, missing field, malformed JSON, oversized: each in Anthropic's shape."""
    from .rawhttp import post

    c = client(target)
    said = []
    for body in ({"model": target.model, "max_tokens": 8, "messages": ASK, "frobnicate": 1},
                 {"model": target.model, "max_tokens": "8", "messages": ASK}, {"model": target.model, "messages": ASK}):  # fmt: skip
        try:
            await c.post("/v1/messages", body=body, cast_to=object)
            return Outcome(Verdict.FAILS, f"accepted {body}")
        except Exception as e:
            out = refused(e)
            if out.verdict is not Verdict.CLEAR_ERROR:
                return out
            said.append(out.detail.split(": ", 1)[1][:30])
    for content, want in ((b"{not json", 400), (b'{"model": "' + b"x" * (33 << 20) + b'"}', 413)):
        status, body = await post(f"{target.root}/v1/messages", content, {"x-api-key": target.key})
        if status != want or not body or body.get("type") != "error":
            return Outcome(Verdict.FAILS, f"expected {want} in Anthropic's shape: {status} {str(body)[:80]}")
    return Outcome(Verdict.CLEAR_ERROR, f"400s: {'; '.join(said)}; bad JSON 400, 33 MiB 413")


ROWS = [
    Row("anthropic messages", "text, system, multi-turn", text),
    Row("anthropic messages", "key as Authorization: Bearer", bearer),
    Row("anthropic messages", "streamed (event order, deltas = final text)", streamed),
    Row("anthropic messages", "tool_use (tool_choice any), then tool_result", tools),
    Row("anthropic messages", "tool_use streamed (input_json_delta)", tools_streamed),
    Row("anthropic messages", "count_tokens", count_tokens),
    Row("anthropic messages", "bad input: unknown, wrong type, missing, bad JSON, 33 MiB", bad_input),
]
