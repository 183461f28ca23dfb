"""The OpenAI API as agents speak it, end to end (issue 31, parts 1, 4, 5
and 6): a real nats-server, the control plane, this machine's real agent
running two llama.cpp engines of the demo model (SmolLM2 on the CPU: one
for chat, one started for embeddings with `--embeddings --pooling mean`,
options the engine wrapper once refused), and `llmgw gateway`, each a
process of its own, asked through the official `openai` SDK by the
conformance matrix's rows (llmgw/conformance/openai_rows.py).

Every row works or is refused with OpenAI's error (status, param, code);
none is silently ignored. Tools come back as calls where tool_choice
requires one (a named function too), streamed as deltas; embeddings are
served; usage from embeddings and completions is counted with chat's. A
model whose engine cannot call tools (its profile says `tools: false`, or
its llama.cpp template has no tool format: a third engine, on the GGUF's
own template) gets 400 `tools_not_supported`.

Small for 2 cores: two engines of one thread, small max_tokens, temperature 0.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from llmgw.bus.server import free_port
from llmgw.conformance.matrix import Target, Verdict, gather_rows, render, run_rows

from .conftest import demo_gguf, sample
from .test_e2e_nats import wait_for
from .test_gateway_e2e import agent_dir, get, ready_of, wait_http  # noqa: F401 (agent_dir: a fixture)
from .test_serving_e2e import SMOLLM2, apply, start_local_fleet

GGUF = demo_gguf()

pytestmark = [pytest.mark.nats, pytest.mark.timeout(600)]

CATALOG = SMOLLM2 + """\
  - name: smollm2-embed
    profiles:
      - {name: cpu, engine: llama.cpp, gpus: 0, cpu_cores: 1, model: smollm2, args: [--ctx-size, "1024", --parallel, "1", --embeddings, --pooling, mean]}
  - name: smollm2-own-template
    profiles:
      - {name: cpu, engine: llama.cpp, gpus: 0, cpu_cores: 1, model: "GGUF", args: ["--ctx-size", "512", "--parallel", "1"]}
  - name: declared-toolless
    min_replicas: 0
    profiles:
      - {name: cpu, engine: llama.cpp, gpus: 0, cpu_cores: 1, model: smollm2, tools: false}
"""

MUST_WORK = (
    "tools, tool_choice=required", "tools, tool_choice=a named function", "tools, streamed tool-call deltas",
    "tools, tool_choice=none", "tools, parallel_tool_calls", "text, id cmpl-", "streamed, ids cmpl-",
    "an embeddings profile", "text", "text, streamed with usage",
)  # fmt: skip


def test_the_openai_rows_each_work_or_are_refused_clearly(nats_server, processes, tmp_path, agent_dir):
    url = nats_server.url
    port = free_port()
    start_local_fleet(processes, url, tmp_path, agent_dir, port, cpu_cores=3)  # three engines of one thread
    apply(url, tmp_path / "catalog.yaml", CATALOG.replace("GGUF", str(GGUF)))
    served = ("smollm2", "smollm2-embed", "smollm2-own-template")
    wait_for(url, lambda s: all(len(ready_of(s, m)) == 1 for m in served), timeout=240)
    base = f"http://127.0.0.1:{port}/v1"
    wait_http(f"{base}/models")

    target = Target(url=base, key="unused", model="smollm2", embed_model="smollm2-embed")
    results = asyncio.run(run_rows(gather_rows(("llmgw.conformance.openai_rows",)), target))
    printed = render(results)
    print(printed)
    verdicts = {row.name: outcome.verdict for row, outcome in results}
    assert not [r.name for r, o in results if o.verdict is Verdict.FAILS], printed
    for name in MUST_WORK:
        assert verdicts[name] is Verdict.WORKS, printed
    assert all(v is not Verdict.SKIPPED for v in verdicts.values()), printed

    # Tools are never dropped: refused where the profile says so (before any
    # replica is asked: this one runs none), and where the engine's own
    # template (SmolLM2's, as the GGUF carries it) has no tool format.
    client = openai.OpenAI(base_url=base, api_key="unused", timeout=120, max_retries=0)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
    for model, says in (("declared-toolless", "tools: false"), ("smollm2-own-template", "replica smollm2-own-template-1")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], tools=tools, max_tokens=4)
        assert (e.value.body["code"], e.value.body["param"]) == ("tools_not_supported", "tools") and says in e.value.body["message"]
    plain = client.chat.completions.create(
        model="smollm2-own-template", messages=[{"role": "user", "content": "Hi"}], tools=tools, tool_choice="none", max_tokens=4
    )
    assert plain.choices[0].message.content  # tool_choice none: no tools asked for, answered

    # Usage from every path is counted as chat's is: embeddings and completions too.
    metrics = get(f"http://127.0.0.1:{port}/metrics")
    embedded = sum(
        sample(metrics, "llmgw_gateway_tokens_total", model="smollm2-embed", replica=r, kind="prompt") or 0
        for r in ("smollm2-embed-1", "smollm2-embed-2")
    )
    assert embedded >= 2, metrics
