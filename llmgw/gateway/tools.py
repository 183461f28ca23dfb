"""A chat completions request's tools, as the model's engine will honour
them. Pure: a checked body (checks.chat) in, the body to send out.

OpenAI's `tool_choice` binds: `required` means a call comes back, a named
function means that function is called. llama.cpp (xllamacpp 2026.10)
honours neither as written, and says nothing:

- a named function (`{"type": "function", ...}`) is "wrong type supplied for
  parameter 'tool_choice', using default value" in its log, and prose in the
  answer. So the tools are narrowed to that one function and `tool_choice`
  becomes `required`, which it takes: the only call it may make is that one.
- `required` builds a grammar that lets prose come first and a call after
  (content until `<tool_call>`, then one call or more); a small model writes
  prose to max_tokens and never calls. Where the template writes calls in
  Hermes' tags (serves.hermes: llmgw's ChatML template, which the demo model
  runs), the answer is started with the tag, as an assistant message the
  engine continues: what follows is a call, by the grammar, and llama.cpp
  returns it as `tool_calls` (streamed as deltas too), content empty.
  The grammar then allows more calls, and a small model repeats its call to
  max_tokens, the last cut off mid-arguments (invalid JSON). Unless the
  request asks for parallel calls (`parallel_tool_calls: true`), it stops at
  the first call's closing tag: one whole call, finish_reason `tool_calls`.

Other engines take OpenAI's tool_choice themselves: their requests pass as
they are.
"""

from __future__ import annotations

HERMES_CALL_OPEN = "<tool_call>\n"  # agent/chat_templates.HERMES_CALL_OPEN
HERMES_CALL_CLOSE = "</tool_call>"
MAX_STOPS = 4  # OpenAI's


def prepare(body: dict, llama_cpp: bool, hermes: bool) -> bool:
    """Change `body` in place for the engine; whether it changed."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not tools or not llama_cpp or choice in (None, "auto", "none"):
        return False
    if isinstance(choice, dict):
        name = choice["function"]["name"]  # checks.chat made sure of its shape
        body["tools"] = [t for t in tools if t["function"]["name"] == name]
        body["tool_choice"] = "required"
    msgs = body["messages"]
    if hermes and not (msgs and msgs[-1].get("role") == "assistant"):
        body["messages"] = [*msgs, {"role": "assistant", "content": HERMES_CALL_OPEN}]
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else list(stop) if isinstance(stop, list) else []
        if body.get("parallel_tool_calls") is not True and len(stops) < MAX_STOPS:
            body["stop"] = [*stops, HERMES_CALL_CLOSE]
    return True
