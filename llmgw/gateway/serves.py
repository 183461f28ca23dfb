"""What a model's engines serve, read off its catalog profiles. Pure.

A request the model's engines cannot serve is answered by the gateway with a
400 that says what they do serve, rather than passed to an engine that
answers it wrongly: llama.cpp ignored a request's tools when the chat
template had none (200, prose), and told embeddings requests to restart it
with `--embeddings` (issue 31). The catalog is what the gateway knows before
any replica answers, and the same for every gateway; a profile says:

- `tools: false`: its engine cannot call tools (a model whose template has
  none). Tools are refused, never dropped.
- llama.cpp's own options in `args`: `--embeddings` (or `--pooling`) serves
  embeddings as well as chat and completions (checked on xllamacpp 2026.10:
  chat still answers), `--reranking` serves /v1/rerank, `--ctx-size` and
  `--parallel` make each request's context (llama.cpp shares the context out
  among its parallel slots).

A model serves embeddings and rerank where any of its profiles does (a
request goes to whichever replica is ready; one that cannot answers with its
own error, passed on in OpenAI's shape), and tools only where every profile
does: a replica that dropped them would answer 200 with prose. Engines other than llama.cpp are taken to serve everything
and speak for themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.contract.events import ModelSpec, ProfileSpec

LLAMA_CPP = "llama.cpp"  # agent/engines.LLAMA_CPP (the gateway imports nothing of the agent)
DEMO_MODEL = "smollm2"  # agent/weights.DEMO_MODEL: started with llmgw's ChatML template with tools
TOOL_TEMPLATE = "llmgw-chatml-tools"  # agent/chat_templates.BUILTIN
WRAPPER_CTX, WRAPPER_PARALLEL = 4096, 2  # llamacpp_server's defaults


@dataclass(frozen=True, slots=True)
class Serves:
    tools: bool = True
    embeddings: bool = True
    rerank: bool = True
    # Every profile is llama.cpp: its ways apply (tool_choice, echo, logprobs).
    llama_cpp: bool = False
    # Every profile's template writes tool calls in Hermes' <tool_call> tags (tools.py).
    hermes: bool = False
    # The context one request may fill, tokens (0: not known).
    context: int = 0

    def what(self) -> str:
        """What it serves, in words, for an error message."""
        served = ["chat completions", "completions"]
        if self.embeddings:
            served.append("embeddings")
        if self.rerank:
            served.append("rerank")
        return ", ".join(served[:-1]) + " and " + served[-1]


EVERYTHING = Serves()


def _value(args: list[str], *names: str) -> str | None:
    """The last value given to any of `names` in `args` (`--x v` or `--x=v`)."""
    found = None
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                found = args[i + 1]
            elif a.startswith(n + "="):
                found = a[len(n) + 1:]
    return found


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _profile(p: ProfileSpec, model: str) -> Serves:
    tools = p.tools
    if p.engine != LLAMA_CPP:
        return Serves(tools=tools)
    args = list(p.args)
    pooling = _value(args, "--pooling")
    rerank = any(a in ("--reranking", "--rerank") for a in args) or pooling == "rank"
    embeddings = rerank or any(a in ("--embeddings", "--embedding") for a in args) or (pooling not in (None, "none"))
    template = _value(args, "--chat-template")
    own_template = template is not None or _value(args, "--chat-template-file") is not None
    hermes = template == TOOL_TEMPLATE or (not own_template and (p.model or model) == DEMO_MODEL)
    ctx = _int(_value(args, "--ctx-size", "-c"), WRAPPER_CTX)
    parallel = max(_int(_value(args, "--parallel", "-np"), WRAPPER_PARALLEL), 1)
    unified = any(a in ("--kv-unified", "-kvu") for a in args)
    return Serves(
        tools=tools, embeddings=embeddings, rerank=rerank, llama_cpp=True, hermes=hermes,
        context=ctx if unified or ctx <= 0 else ctx // parallel,
    )  # fmt: skip


def of(spec: ModelSpec) -> Serves:
    """What the model serves: what any of its profiles does."""
    each = [_profile(p, spec.name) for p in spec.profiles]
    if not each:
        return EVERYTHING
    contexts = [s.context for s in each]
    return Serves(
        tools=all(s.tools for s in each),
        embeddings=any(s.embeddings for s in each),
        rerank=any(s.rerank for s in each),
        llama_cpp=all(s.llama_cpp for s in each),
        hermes=all(s.hermes for s in each),
        context=0 if 0 in contexts else min(contexts),
    )
