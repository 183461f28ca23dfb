"""Chat templates llmgw ships, by name, for llama.cpp's `--chat-template`.

SmolLM2's own template (the demo model's) says nothing of tools, so
llama.cpp rendered a request's tools nowhere and answered prose: tools
silently dropped (issue 31). `llmgw-chatml-tools` is ChatML (SmolLM2's,
Qwen's, Hermes') with the Hermes tool format: the tools listed in the system
turn, each call a JSON object in `<tool_call>` tags, tool results in
`<tool_response>` tags. llama.cpp reads the format off the template (its
tool call parser and grammar), so calls come back as OpenAI `tool_calls`,
streamed as deltas. The demo model is started with it (engines.build); any
ChatML model may name it: `args: [--chat-template, llmgw-chatml-tools]`.
"""

CHATML_TOOLS = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}
{{- "You may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- for message in messages %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
{%- elif message.role == "assistant" %}
{{- '<|im_start|>' + message.role }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}
{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' }}{{- message.content }}{{- '\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

BUILTIN = {"llmgw-chatml-tools": CHATML_TOOLS}

# The opening of one tool call in the templates above: what a gateway may
# start the answer with to have a call where llama.cpp's grammar allows
# prose first (tools.py).
HERMES_CALL_OPEN = "<tool_call>\n"
