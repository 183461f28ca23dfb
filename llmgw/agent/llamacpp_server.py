"""llama.cpp's OpenAI server through `xllamacpp`, as a process of its own.

    python -m llmgw.agent.llamacpp_server --model FILE.gguf --port 20000 [--host H]
        [--alias NAME]... [--threads N] [--ctx-size N] [--parallel N] [--n-gpu-layers N] [--embeddings]
        [any llama-server option: --pooling mean, --reranking, --chat-template-file F, --flash-attn on, ...]
        [--cache-ram-mib N] [--slot-prompt-similarity F]

`xllamacpp.Server` serves until the object is dropped, so it gets a process
(the agent's engine) and lives until SIGTERM or SIGINT. llama.cpp says only
"Failed to init server" when the model file is missing or the port is
taken, so those are checked first and said in words, as the last line of the
log, which is what the agent reports as the reason. Exit status: 0 stopped
on a signal, 1 llama.cpp failed, 2 bad arguments or no model file, 3 port taken.
Options past its own are llama.cpp's, set on xllamacpp's CommonParams by name
(llamacpp_options.py): a profile's `args` reach llama.cpp as written, and one
it cannot set is said, naming it, before anything starts. Once serving, it
says whether the chat template takes tools (llama.cpp ignores a request's
tools when it does not: the profile should say `tools: false`).
The prompt cache (issue 30: the gateway sends a prompt where its prefix is
warm, so the engine must keep it): `--cache-ram-mib` is the host memory
llama.cpp keeps prompts in beyond its slots (CACHE_RAM_MIB; llama.cpp's own
default, 8 GiB, is more than a small CPU node has to spare), and
`--slot-prompt-similarity` how much of a new prompt must match a slot's for
the slot to be reused (SLOT_PROMPT_SIMILARITY, llama.cpp's default). The
agent passes these from named defaults; a profile's args override them.
Metrics (`/metrics`, with `llamacpp:requests_processing`) are on: a drain
reads them.

The engine's key comes in the environment (LLMGW_ENGINE_KEY), never the
command line (`ps` shows that to everyone): with it, llama.cpp answers 401
to every request without `Authorization: Bearer <key>` but GET /health
(checked on xllamacpp 2026.10: /v1/models and /metrics need the key too).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time

from . import llamacpp_options
SLOTS = 2  # requests served at once, each slot keeping its last prompt
CACHE_RAM_MIB = 1024  # host memory for prompts kept beyond the slots (-1: no limit, 0: none)
SLOT_PROMPT_SIMILARITY = 0.1  # the share of a prompt a slot must match to be reused for it


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw.agent.llamacpp_server", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--model", required=True, help="a .gguf file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--alias", action="append", default=[], help="a name the OpenAI API answers to (repeatable)")
    p.add_argument("--threads", type=int, default=0, help="0: the cores this process may use")
    p.add_argument("--ctx-size", type=int, default=4096, help="the context shared by the parallel slots")
    p.add_argument("--parallel", type=int, default=SLOTS, help="requests served at once (slots)")
    p.add_argument("--n-gpu-layers", type=int, default=0)
    p.add_argument("--embeddings", action="store_true")
    p.add_argument("--cache-ram-mib", type=int, default=CACHE_RAM_MIB, help="MiB of host memory for cached prompts (-1: no limit, 0: off)")
    p.add_argument(
        "--slot-prompt-similarity", type=float, default=SLOT_PROMPT_SIMILARITY,
        help="how much of a prompt must match a slot's for that slot to take it (0: any slot)",
    )  # fmt: skip
    return p


def say(text: str) -> None:
    print(f"llmgw: {text}", file=sys.stderr, flush=True)


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def say_template(host: str, port: int, key: str) -> None:
    """Whether the chat template takes tools, from llama.cpp's /props: where
    it does not, llama.cpp answers a request's tools with prose."""
    import json
    import urllib.request

    where = f"[{host}]" if ":" in host else host
    req = urllib.request.Request(f"http://{where}:{port}/props", headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            caps = json.load(r).get("chat_template_caps", {})
    except Exception as e:  # only words for the log
        say(f"could not read the chat template's capabilities: {e}")
        return
    if caps.get("supports_tools"):
        say("the chat template takes tools")
    else:
        say("the chat template does not take tools: llama.cpp ignores a request's tools (give the profile "
            "`tools: false`, or a template with tools: --chat-template-file F, or --chat-template llmgw-chatml-tools)")


def main(argv: list[str] | None = None) -> int:
    args, extra = parser().parse_known_args(argv)
    if not os.path.isfile(args.model):
        say(f"model file {args.model} not found")
        return 2
    if not os.access(args.model, os.R_OK):
        say(f"model file {args.model} is not readable")
        return 2
    if not port_free(args.host, args.port):
        say(f"port {args.port} on {args.host} is taken by another process")
        return 3
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    import xllamacpp

    threads = args.threads or len(os.sched_getaffinity(0))
    p = xllamacpp.CommonParams()
    p.model.path = args.model
    p.hostnames = [args.host]
    p.port = args.port
    p.n_parallel = args.parallel
    p.n_ctx = args.ctx_size
    p.n_gpu_layers = args.n_gpu_layers
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    p.endpoint_metrics = True
    p.embedding = args.embeddings
    p.cache_prompt = True
    p.cache_ram_mib = args.cache_ram_mib
    p.slot_prompt_similarity = args.slot_prompt_similarity
    if args.alias:
        p.model_alias = set(args.alias)
    try:
        passed = llamacpp_options.apply(p, extra)
    except llamacpp_options.OptionError as e:
        say(str(e))
        return 2
    if passed:
        say("llama.cpp options: " + ", ".join(passed))
    key = os.environ.get("LLMGW_ENGINE_KEY", "")
    if key:
        p.api_keys = [key]
    started = time.monotonic()
    try:
        server = xllamacpp.Server(p)
    except RuntimeError as e:
        say(f"llama.cpp could not start serving {args.model} on {args.host}:{args.port}: {e} (see the lines above)")
        return 1
    took = time.monotonic() - started
    say(f"serving {args.model} on http://{args.host}:{args.port} ({threads} threads), loaded in {took:.2f}s")
    say_template(args.host, args.port, key)
    while not stop.wait(1.0):
        pass
    say("stopping")
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
