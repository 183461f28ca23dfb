"""The command line of an engine, from a start command and the node it lands on.

A profile's `engine` is a kind the agent knows, or the name of a command
template, and this node's agent file must declare it (`engines`,
`templates`; see agentfile.py): anything else is refused, the shard failed
with the reason.

    llama.cpp  llama.cpp on the CPU (or the GPUs of an xllamacpp built for
               them) through `xllamacpp`: `python -m llmgw.agent.llamacpp_server`,
               which takes llama-server's options (the profile's args) by name;
               the demo model gets llmgw's ChatML template with tools
    vllm       `vllm serve MODEL` (the program: agent file `engines.vllm`, else on PATH)
    sglang     `python -m sglang.launch_server` (the python: `engines.sglang`, else this one)
    a template's name: its command, split like a shell would
               (`my-server --port {port}`); the profile's args are templates too,
               given to the template's program (never a program of their own)

The agent decides the port, the GPUs (through `CUDA_VISIBLE_DEVICES`, empty
when the shard has none, so a CPU engine takes no GPU it was not given), the
tensor-parallel size (the shard's GPUs), the model, and for a multi-node
replica the number of nodes, this shard's rank and the leader's address (the
rank 0 node, by its node name as a host name; its rendezvous port is
DIST_PORT unless the profile's args say otherwise). The profile's args come
last, so they override what the agent chose (argparse keeps the last).

Template placeholders: {port} {host} {model} (the weights, resolved) {name}
(the catalog model) {gpus} (comma list) {tp} (GPU count) {rank} {nodes}
(node count) {leader} {dist_port} {replica} {shard} {identity} (see below)
{key} (see below) {python} (the agent's interpreter); `{{` and `}}` for
braces. An unknown placeholder is an error that names it. Args of the known kinds are passed as written.

Engines keep prompts (issue 30: the gateway sends a prompt where its prefix
is warm): llama.cpp is given its prompt cache, `--parallel` slots
(llamacpp_server.SLOTS), `--cache-ram-mib` (CACHE_RAM_MIB) and
`--slot-prompt-similarity` (SLOT_PROMPT_SIMILARITY), and vLLM
`--enable-prefix-caching` (unless the profile says
`--no-enable-prefix-caching`); the profile's args override any of them.

Each kind says how to tell it is healthy (`health`, a path that answers 200
once the model is loaded; the OpenAI `/v1/models` for templates) and where its
requests in flight show (`metrics` and `inflight`, Prometheus gauges summed),
which a drain waits on.

Each engine is given an identity at start (`identity`: the catalog model,
the shard and its generation), a second model name it serves: llama.cpp an
`--alias`, vLLM a `--served-model-name`, a template that uses `{identity}`.
The agent reports it with the shard; a gateway sends the replica's requests
only to an engine whose GET /v1/models lists it. Simulated replicas once
advertised the ports real engines had, and a request for `llama-70b` was
answered, 200, by SmolLM2: whatever answered on a port was trusted. An
engine that cannot carry one (SGLang serves one name; a template without
`{identity}`) reports none and is taken on its endpoint. The model's own
name is a prefix of the identity, so it sorts first and stays the name
llama.cpp answers with.

Each engine is also given a key of its own (`key`, random per shard and
generation, made by the agent), so that it answers only the gateways (which
read it from the bus's engine keys bucket) and not whoever reaches its port:
llama.cpp through the environment (LLMGW_ENGINE_KEY, read by our
llamacpp_server), vLLM through VLLM_API_KEY, neither in `ps`; SGLang has
only `--api-key`, so its key is in its command line; a template gets
`{key}` (in its command line, so visible in `ps`) and LLMGW_ENGINE_KEY in
its environment (better, where the program can read it from there).
"""

from __future__ import annotations

import shlex
import shutil
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..core.folding.commands import StartShard
from .llamacpp_server import CACHE_RAM_MIB, SLOT_PROMPT_SIMILARITY, SLOTS

LLAMA_CPP = "llama.cpp"
VLLM = "vllm"
SGLANG = "sglang"
KINDS = (LLAMA_CPP, VLLM, SGLANG)
DIST_PORT = 29500
PLACEHOLDERS = (
    "port", "host", "model", "name", "gpus", "tp", "rank", "nodes", "leader", "dist_port", "replica", "shard", "identity",
    "python", "key",
)
KEY_ENV = "LLMGW_ENGINE_KEY"


def identity(model: str, shard: str, generation: int) -> str:
    """The name an engine of this shard and generation answers to, beside the model's."""
    return f"{model}@{shard}/{generation}"


class EngineError(ValueError):
    """The engine cannot be started here; the message is the shard's failure reason."""


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]  # added to the agent's environment
    health: str  # a path that answers 200 once ready
    metrics: str = ""  # Prometheus metrics ("" none)
    inflight: tuple[str, ...] = ()  # gauges whose sum is the requests in flight
    kind: str = ""
    model: str = ""  # the weights, resolved
    identity: str = ""  # the name it answers to beside the model's ("" : none)
    key: str = ""  # what a request must carry (Authorization: Bearer); never written to a log


def _leader(cmd: StartShard, host: str) -> str:
    return host if cmd.rank == 0 or not cmd.nodes else cmd.nodes[0]


def _check_program(program: str, which: Callable[[str], str | None], where: str) -> str:
    if "/" in program:
        if not Path(program).is_file():
            raise EngineError(f"engine program {program} does not exist ({where})")
        return program
    found = which(program)
    if found is None:
        raise EngineError(f"engine program {program} not found on PATH ({where})")
    return found


def declared(kind: str, engines: dict[str, str], templates: dict[str, str]) -> str:
    """Why this node may not run a profile's engine ("" when it may)."""
    if kind in KINDS and kind in engines or kind in templates:
        return ""
    said = ", ".join(sorted(engines)) or "none"
    named = f"; templates: {', '.join(sorted(templates))}" if templates else "; no templates"
    what = f"engine kind {kind}" if kind in KINDS else f"engine {kind!r}"
    return (
        f"{what} is not declared in this node's agent file (engines: {said}{named}): "
        "a node runs only the engine kinds and command templates its agent file names"
    )


def build(
    cmd: StartShard,
    *,
    host: str,
    model: str,
    engines: dict[str, str] | None = None,
    templates: dict[str, str] | None = None,
    python: str = sys.executable,
    which: Callable[[str], str | None] = shutil.which,
    key: str = "",
) -> Launch:
    """The launch of one shard; `model` is the weights, already resolved on
    this node. `engines` and `templates`: what the node's agent file declares
    (None: its defaults). `key`: the engine's key."""
    from .agentfile import DEFAULT_ENGINES
    from .weights import DEMO_MODEL

    engines = DEFAULT_ENGINES if engines is None else engines
    templates = templates or {}
    p = cmd.profile
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in cmd.gpus)}
    if key:
        env[KEY_ENV] = key
    tp = max(len(cmd.gpus), 1)
    nodes = max(p.nodes, len(cmd.nodes), 1)
    kind = p.engine
    me = identity(cmd.model, cmd.shard, cmd.generation)
    if kind == "sim":
        raise EngineError("engine sim is for simulated agents: a real agent runs llama.cpp, vllm, sglang or a template")
    refused = declared(kind, engines, templates)
    if refused:
        raise EngineError(refused)
    if kind == LLAMA_CPP:
        if nodes > 1:
            raise EngineError("llama.cpp runs on one node: a profile of nodes > 1 needs vllm, sglang or a command")
        if not model:
            raise EngineError(f"profile {p.name} of {cmd.model} names no model file (profile field `model`)")
        if not Path(model).is_file():
            raise EngineError(f"model file {model} not found on this node (profile {p.name} of {cmd.model})")
        argv = [python, "-m", "llmgw.agent.llamacpp_server", "--model", model, "--host", host, "--port", str(cmd.port)]
        argv += ["--alias", cmd.model, "--alias", me]
        if p.cpu_cores:
            argv += ["--threads", str(p.cpu_cores)]
        if cmd.gpus:
            argv += ["--n-gpu-layers", "999"]
        if (p.model or cmd.model) == DEMO_MODEL and not any(a.startswith("--chat-template") for a in p.args):
            # SmolLM2's own template has no tools: llama.cpp dropped them (chat_templates.py).
            argv += ["--chat-template", "llmgw-chatml-tools"]
        argv += ["--parallel", str(SLOTS), "--cache-ram-mib", str(CACHE_RAM_MIB)]
        argv += ["--slot-prompt-similarity", str(SLOT_PROMPT_SIMILARITY)]
        return Launch(
            argv + list(p.args), env, "/health", "/metrics", ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
            kind, model, me, key,
        )
    if kind == VLLM:
        program = _check_program(engines.get(VLLM) or "vllm", which, "agent file engines.vllm, else PATH")
        argv = [program, "serve", model or cmd.model, "--host", host, "--port", str(cmd.port)]
        argv += ["--served-model-name", cmd.model, me, "--tensor-parallel-size", str(tp)]
        if "--no-enable-prefix-caching" not in p.args:
            argv.append("--enable-prefix-caching")
        if nodes > 1:
            argv += ["--pipeline-parallel-size", str(nodes), "--nnodes", str(nodes), "--node-rank", str(cmd.rank)]
            argv += ["--master-addr", _leader(cmd, host), "--master-port", str(DIST_PORT)]
            if cmd.rank:
                argv.append("--headless")
        # Names of the profile's own replace ours (argparse keeps the last): then it carries none.
        named = "--served-model-name" not in p.args
        if key:
            env["VLLM_API_KEY"] = key
        return Launch(
            argv + list(p.args), env, "/health", "/metrics", ("vllm:num_requests_running", "vllm:num_requests_waiting"),
            kind, model or cmd.model, me if named else "", key,
        )
    if kind == SGLANG:
        program = _check_program(engines.get(SGLANG) or python, which, "agent file engines.sglang, else this python")
        argv = [program, "-m", "sglang.launch_server", "--model-path", model or cmd.model, "--host", host]
        argv += ["--port", str(cmd.port), "--served-model-name", cmd.model, "--tp-size", str(tp * nodes)]
        if nodes > 1:
            argv += ["--nnodes", str(nodes), "--node-rank", str(cmd.rank)]
            argv += ["--dist-init-addr", f"{_leader(cmd, host)}:{DIST_PORT}"]
        if key:
            argv += ["--api-key", key]  # SGLang reads it from nowhere else
        return Launch(
            argv + list(p.args), env, "/health", "/metrics", ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
            kind, model or cmd.model, key=key,
        )
    # A command template the agent file declares.
    values = {
        "port": cmd.port, "host": host, "model": model or cmd.model, "name": cmd.model,
        "gpus": ",".join(str(g) for g in cmd.gpus), "tp": tp, "rank": cmd.rank, "nodes": nodes,
        "leader": _leader(cmd, host), "dist_port": DIST_PORT, "replica": cmd.replica, "shard": cmd.shard,
        "identity": me, "python": python, "key": key,
    }  # fmt: skip
    try:
        words = shlex.split(templates[kind])
    except ValueError as e:
        raise EngineError(f"template {kind} of this node's agent file is not a command line: {e}") from None
    if not words:
        raise EngineError(f"template {kind} of this node's agent file is empty")
    argv = [_fill(w, values, p.name) for w in [*words, *p.args]]
    argv[0] = _check_program(argv[0], which, f"the command of profile {p.name}")
    carries = any("{identity}" in w for w in [*words, *p.args])
    return Launch(argv, env, "/v1/models", kind=kind, model=values["model"], identity=me if carries else "", key=key)


def _fill(word: str, values: dict, profile: str) -> str:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(word) if f is not None]
    except ValueError as e:
        raise EngineError(f"{word!r} in the command of profile {profile}: {e} (write {{{{ and }}}} for braces)") from None
    for f in fields:
        if f not in values:
            known = ", ".join(PLACEHOLDERS)
            raise EngineError(f"unknown placeholder {{{f}}} in the command of profile {profile}; known: {known}")
    return word.format_map(values)
