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

Other engines take OpenAI's tool_choice themselves: their requests pass as
they are.
"""

from __future__ import annotations

HERMES_CALL_OPEN = "<tool_call>\n"  # agent/chat_templates.HERMES_CALL_OPEN


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
    return True
