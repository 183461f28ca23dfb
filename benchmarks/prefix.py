"""Cache-aware routing against the others, on real engines (issue 30).

    python benchmarks/prefix.py [--replicas 3] [--groups 32] [--users 1] [--system-tokens 1000]
        [--question-tokens 100] [--rate R] [--requests N] [--warm-streams S] [--cache-ram-mib M]
        [--streams-no-prefix S] [--max-tokens 16] [--litellm PATH] [--guidellm PATH] [--json FILE]

The fleet: real `llmgw up` (NATS, control plane, projector, this machine's
agent, a gateway) in a temporary state dir, running `--replicas` llama.cpp
replicas of the demo model (SmolLM2-135M, one thread each, the agent's
prompt cache settings but its size), and a second `llmgw gateway` with a
credential of its own.

The cache's size (`--cache-ram-mib`, 384: llama.cpp keeps about 13 of this
workload's conversations, ~30 MB of KV each, beside its 2 slots) is the
regime where routing by prefix matters: a production replica keeps a small
part of the prefixes its traffic brings (thousands of system prompts and
conversations), and here 32 groups stand for them (llm-d's benchmark: 150
customers, each with its own 6k-token prefix, over 8 pods). Routed by
prefix, a replica sees a third of the groups (up to 14 of 32, as they
hash): their conversations fit, only just (one run's phase (c) met
evictions, 16 misses in 100 requests; at 512 MiB, about 17, it met 13,
while least load's hit ratio rose from 0.38-0.40 to 0.53). Routed blind,
every replica sees all of them, keeps fewer than half, and evicts.
(16 groups of 2 users, the earlier default, shared each system prompt
between two conversations: blind routing found it warm nearly as often, a
hit ratio of 0.61 against 0.69.) With the agent's default
(1 GiB, ~40 conversations) every replica ends up holding every group, and
blind routing only pays each cold prompt up to three times: checked here,
llama.cpp restores a prompt evicted from its slots from that host cache
(0.04 s for 418 tokens against 3.4 s cold). The peer: LiteLLM's proxy (PyPI `litellm[proxy]`, `--litellm` its
program, else `litellm` on PATH; skipped, saying so, when there is none)
over the same engines, each reached with its engine key as a gateway reads
it, with `routing_strategy: least-busy`: LiteLLM has no prefix-aware
strategy for OpenAI-compatible servers (its `prompt_caching` pre-call check
acts only on prompts marked with Anthropic's `cache_control`), and
least-busy (fewest requests in flight) is the best of the others for
prompts that cost by where they go: it is our least-load.

The load generator is an open-loop client of this file: Poisson arrivals
from a seeded generator, each request sent when due whatever came back (a
stream with `stream_options.include_usage`, timed from when it was sent,
which is when it was due: `late` in the --json records), with a fixed set
of users, `--users` per group. Not guidellm's, the peer's, by default:
guidellm 0.8.1 runs offline here (`--guidellm PATH`, `pip install guidellm
gguf` in a venv of its own: its synthetic shared-prefix data, multi-turn,
with SmolLM2's tokenizer written from the demo's GGUF, guidellm_folder), but
its multi-turn Poisson profile does not send Poisson arrivals: a
conversation's next turn waits for the answer to the one before and then
takes the next arrival, so the turns that waited go out together (at
0.35/s its records showed 26 requests in a phase's first 20 s where the rate
gives 7), and a burst onto three single-thread engines queues whatever the
routing: that measured the generator's bunching, not the routing. With
`--guidellm` its records give the figures instead, two gateways reached
through a load balancer of connections here (guidellm says
`Connection: close`), where requests went read from the gateways' counters
(the warm-up's included); not known for LiteLLM. The shared-prefix workload: `--groups`
groups, each with its own system prompt of ~`--system-tokens` tokens, each
with `--users` users holding multi-turn conversations (questions of
~`--question-tokens` tokens, each turn carrying the earlier ones and their
answers; a conversation starts again after 4 turns). The no-prefix
workload: single questions with nothing in common, of about twice a
question's length, sent `--streams-no-prefix` (6: a request per slot) at a
time, each once one is answered (closed loop): its throughput is what the
fleet carries, not the rate offered (open loop, the rate offered is the
throughput: two phases differed by the chance of their Poisson draws,
±14 % for 50 requests). With as many streams as slots, every policy's
choice is forced (the one replica with a slot free), so the two no-prefix
phases should measure the same; they did not, and the reason was the
order: the engines are the same processes all run, and the second of two
phases was 6-12 % slower whichever policy it ran (2026-12-06: a0 then c0,
c0 1.13x a0's p50 first token; c0 then a0, a0 1.03x c0's). So each runs
twice, in the order a0, c0, c0, a0, and a policy's two are counted as one
phase (a key repeated in `--phases` adds to it).

Five ways to route the shared-prefix workload, one after the other, the same
arrivals for each (the same seed), each with prompts new to every engine
(a phase's salt at the start of every system prompt), so each starts cold,
then warms up: each group's system prompt is sent once first (by guidellm:
each of the prefixes its data will draw, read from its dataset with the
phase's seed; `--warm-streams` at a time), and waited for, before the
measured arrivals begin; what is
measured is the fleet past its first prompts, as it runs all day, at a rate
(`--rate`, 0.8/s) it carries when each prompt is warm where it goes and not
when it is not. How it was chosen: routed by least load, these three
replicas carry about 0.4/s of this workload (0.33/s answered of 0.35/s
offered, with a p50 first token of 10 s; 0.40-0.43/s answered of 0.6 and
0.8/s), so below that every policy keeps up and requests/s says nothing
(the throughput goal compares what is carried); 0.8/s is twice that, and
routed by prefix each replica is then busy about a third of its time:
(a) least-load, (b) round-robin, (c) prefix, (d) prefix with requests
alternating between the two gateways, (e) LiteLLM; then the no-prefix
workload under (a) and (c). A phase's policy is set by applying the catalog
with its `routing:`, and begins once both gateways answer with it (their
`llmgw-route` header).

Per phase: TTFT p50/p90/p99, end-to-end latency, requests/s and output
tokens/s (the counted answers over the time from the first counted arrival
to the last answer), the cache-hit ratio (the engines' cached_tokens over prompt
tokens), the requests per replica (the spread), errors. Then the issue's
goals as ratios of this one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gateway import wait_port  # noqa: E402  (benchmarks/gateway.py)
from llmgw.bus.server import free_port  # noqa: E402

MODEL = "smol"
TURNS = 4  # a conversation starts again after this many
WORDS = (
    "the fleet node replica model engine request answer cache prompt token gateway cluster rack power memory "
    "storage network queue batch stream latency throughput schedule policy owner quota budget region zone "
    "service client server health metric alert incident deploy release version config secret label pool "
    "weight load balance route table index block hash session user group question reason history decision"
).split()


# --------------------------------------------------------------------------- the workload


def words(rng: random.Random, tokens: int) -> str:
    # SmolLM2's tokenizer: about 1.3 tokens per word of this list (the report prints the real count).
    return " ".join(rng.choice(WORDS) for _ in range(max(1, int(tokens / 1.3))))


class Workload:
    """The arrivals of one phase: (due time, conversation) with a seeded generator."""

    def __init__(self, args, salt: str, shared: bool) -> None:
        self.rng = random.Random(args.seed)
        self.args, self.salt, self.shared = args, salt, shared
        # The no-prefix workload has nothing to warm: no warm-up, fewer requests.
        self.warmup = args.groups if shared and args.warm_streams else 0
        self.requests = args.requests if shared else args.requests_no_prefix
        text = random.Random(args.seed + 1)
        self.systems = [f"[{salt}/{g}] You are the assistant of team {g}. " + words(text, args.system_tokens) for g in range(args.groups)]
        self.history: dict[tuple[int, int], list[dict]] = {}

    def arrivals(self) -> list[float]:
        t, out = 0.0, []
        for _ in range(self.requests):
            out.append(t)
            t += self.rng.expovariate(self.args.rate)
        return out

    def messages(self, i: int) -> tuple[tuple[int, int] | None, list[dict]]:
        q = f"Question {i}: " + words(self.rng, self.args.question_tokens) + "?"
        if not self.shared:
            return None, [{"role": "user", "content": f"[{self.salt}/{i}] " + words(self.rng, self.args.question_tokens) + " " + q}]
        who = (i, 0) if i < self.warmup else (self.rng.randrange(self.args.groups), self.rng.randrange(self.args.users))
        turns = self.history.get(who, [])
        if len(turns) >= 2 * TURNS:
            turns = []
        msgs = [{"role": "system", "content": self.systems[who[0]]}, *turns, {"role": "user", "content": q}]
        return who, msgs

    def answered(self, who, msgs: list[dict], text: str) -> None:
        if who is not None:
            self.history[who] = [*msgs[1:], {"role": "assistant", "content": text}]


# --------------------------------------------------------------------------- one request (a small HTTP/1.1 client)


async def ask(port: int, body: bytes, headers: dict[str, str], timeout: float) -> dict:
    """POST a streamed chat completion; what came back, timed."""
    t0 = time.monotonic()
    out = {"ok": False, "status": 0, "ttft": None, "e2e": None, "prompt": 0, "cached": 0, "completion": 0, "text": "", "headers": {}}
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{head}\r\n".encode() + body
        )
        await writer.drain()

        async def read() -> None:
            status = await reader.readline()
            out["status"] = int(status.split()[1])
            while True:
                line = (await reader.readline()).decode().strip()
                if not line:
                    break
                k, _, v = line.partition(":")
                out["headers"][k.strip().lower()] = v.strip()
            chunked = out["headers"].get("transfer-encoding", "").lower() == "chunked"
            buf = b""
            parts: list[str] = []
            while True:
                if chunked:
                    size = int((await reader.readline()).strip() or b"0", 16)
                    if size == 0:
                        break
                    data = await reader.readexactly(size)
                    await reader.readline()
                else:
                    data = await reader.read(65536)
                    if not data:
                        break
                buf += data
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    event = event.strip()
                    if not event.startswith(b"data:"):
                        continue
                    payload = event[5:].strip()
                    if payload == b"[DONE]":
                        continue
                    try:
                        chunk = json.loads(payload)
                    except ValueError:
                        continue
                    for c in chunk.get("choices") or ():
                        piece = (c.get("delta") or {}).get("content")
                        if piece:
                            if out["ttft"] is None:
                                out["ttft"] = time.monotonic() - t0
                            parts.append(piece)
                    usage = chunk.get("usage")
                    if usage:
                        out["prompt"] = usage.get("prompt_tokens", 0)
                        out["completion"] = usage.get("completion_tokens", 0)
                        out["cached"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
                    timings = chunk.get("timings")
                    if timings and not out["cached"]:
                        out["cached"] = timings.get("cache_n", 0)
            out["text"] = "".join(parts)

        await asyncio.wait_for(read(), timeout)
        out["ok"] = out["status"] == 200
    except (OSError, asyncio.TimeoutError, ValueError, IndexError, asyncio.IncompleteReadError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        if writer is not None:
            writer.close()
    out["e2e"] = time.monotonic() - t0
    return out


# --------------------------------------------------------------------------- a phase


class Target:
    def __init__(self, name: str, ports: list[int], headers: dict[str, str], replica_of, metrics: list[int] = ()) -> None:
        self.name, self.ports, self.headers, self.replica_of = name, ports, headers, replica_of
        self.metrics = list(metrics)  # gateways whose /metrics say where requests went


def request(msgs: list[dict], args) -> bytes:
    return json.dumps({
        "model": MODEL, "messages": msgs, "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()  # fmt: skip


async def phase(target: Target, work: Workload, args) -> dict:
    """The warm-up (each group's first turn, `--warm-streams` at a time, not
    counted), then the workload's arrivals, each sent when due (open loop),
    through the target's ports in turn."""
    results: list[dict] = []
    room = asyncio.Semaphore(max(1, args.warm_streams))

    async def warm(i: int) -> None:
        async with room:
            who, msgs = work.messages(i)
            r = await ask(target.ports[i % len(target.ports)], request(msgs, args), target.headers, args.drain_s)
            if r["ok"]:
                work.answered(who, msgs, r["text"])

    await asyncio.gather(*(warm(i) for i in range(work.warmup)))
    closed = not work.shared and args.streams_no_prefix > 0
    due = [0.0] * work.requests if closed else work.arrivals()
    start = time.monotonic() + 0.1
    deadline = args.drain_s + (due[-1] if due else 0)
    streams = asyncio.Semaphore(max(1, args.streams_no_prefix))

    async def one(n: int, at: float) -> None:
        if closed:  # each of `--streams-no-prefix` sends its next once answered
            await streams.acquire()
            at = time.monotonic() - start
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        i = work.warmup + n
        who, msgs = work.messages(i)
        r = await ask(target.ports[i % len(target.ports)], request(msgs, args), target.headers, max(1.0, start + deadline - time.monotonic()))
        r["late"] = time.monotonic() - start - at - r["e2e"]  # how late it was sent (should be ~0)
        r["replica"] = target.replica_of(r["headers"])
        r["route"] = r["headers"].get("llmgw-route", "")
        r["end"] = time.monotonic() - start
        r["at"] = at
        if r["ok"]:
            work.answered(who, msgs, r["text"])
        results.append(r)
        if closed:
            streams.release()

    await asyncio.gather(*(one(n, at) for n, at in enumerate(due)))
    return results


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * p))], 3)


def summary(name: str, runs: list[list[dict]]) -> dict:
    """The figures of one phase, or of a phase run several times (`runs`,
    each its requests, timed from its own start): requests/s over their
    spans added."""
    rs = [r for run in runs for r in run]
    ok = [r for r in rs if r["ok"]]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    e2e = [r["e2e"] for r in ok]
    span = sum(max((r["end"] for r in run if r["ok"]), default=0.0) - min((r["at"] for r in run), default=0.0) for run in runs) or 1.0
    prompt = sum(r["prompt"] for r in ok)
    spread: dict[str, int] = {}
    routes: dict[str, int] = {}
    for r in ok:
        spread[r["replica"] or "?"] = spread.get(r["replica"] or "?", 0) + 1
        if r["route"]:
            routes[r["route"]] = routes.get(r["route"], 0) + 1
    errors = [r.get("error") or f"HTTP {r['status']}" for r in rs if not r["ok"]]
    return {
        "name": name, "sent": len(rs), "answered": len(ok), "errors": len(errors), "error_examples": sorted(set(errors))[:3],
        "ttft_p50": pct(ttft, 0.5), "ttft_p90": pct(ttft, 0.9), "ttft_p99": pct(ttft, 0.99),
        "e2e_p50": pct(e2e, 0.5), "e2e_p90": pct(e2e, 0.9), "e2e_p99": pct(e2e, 0.99),
        "rps": round(len(ok) / span, 3), "out_tps": round(sum(r["completion"] for r in ok) / span, 2),
        "hit_ratio": round(sum(r["cached"] for r in ok) / prompt, 3) if prompt else 0.0,
        "prompt_mean": round(prompt / len(ok)) if ok else 0, "spread": dict(sorted(spread.items())), "routes": routes,
        # Each request, run by run in order of arrival (for the --json file: where the slow ones went, and what they found there).
        "requests": [
            {"run": n, "at": round(r["at"], 2), "route": r["route"], "replica": r["replica"], "prompt": r["prompt"], "cached": r["cached"],
             "ttft": None if r["ttft"] is None else round(r["ttft"], 3), "e2e": round(r["e2e"], 3), "ok": r["ok"]}
            for n, run in enumerate(runs) for r in sorted(run, key=lambda r: r.get("at", 0.0))
        ],
    }  # fmt: skip


# --------------------------------------------------------------------------- the peer's load generator


def guidellm_folder(program: str, work: Path) -> Path:
    """Where guidellm runs: it loads the tokenizer of the model it is told
    (`smol`) by that name, so `smol/` there is SmolLM2's, written from the
    demo's GGUF by guidellm's own transformers (with `gguf`: offline, no hub)."""
    from llmgw.agent.weights import demo_weights

    gguf = demo_weights()
    if gguf is None:
        raise RuntimeError("no SmolLM2 weights here: run `llmgw up` once (it fetches them)")
    folder = work / "guidellm"
    python = Path(program).resolve().parent / "python"
    write = "import sys; from transformers import AutoTokenizer as T; T.from_pretrained(sys.argv[1], gguf_file=sys.argv[2]).save_pretrained(sys.argv[3])"
    out = subprocess.run([str(python), "-c", write, str(gguf.parent), gguf.name, str(folder / MODEL)], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"guidellm's python could not write SmolLM2's tokenizer (pip install gguf beside guidellm?): {out.stderr[-800:]}")
    return folder


async def alternate(ports: list[int]) -> asyncio.AbstractServer:
    """A load balancer of connections: each new one goes to the next of
    `ports` (guidellm's requests say `Connection: close`, so each request is
    a connection: they alternate between the gateways)."""
    turn = 0

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal turn
        port, turn = ports[turn % len(ports)], turn + 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(accepted, "127.0.0.1", 0)


def guided(args, folder: Path, target: Target, shared: bool, seed: int) -> dict:
    """A phase by guidellm through the target (two gateways: through `alternate`),
    the spread read from the gateways' counters before and after."""
    import threading

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    port = target.ports[0]
    server = None
    if len(target.ports) > 1:
        server = asyncio.run_coroutine_threadsafe(alternate(target.ports), loop).result()
        port = server.sockets[0].getsockname()[1]
    before = routed(target.metrics) if target.metrics else {}
    try:
        if shared and args.warm_streams:  # every prefix the phase's conversations will have, seen once (by its policy)
            prompts = guidellm_prefixes(args.guidellm, folder, seed, guidellm_data(args, shared))
            asyncio.run_coroutine_threadsafe(warm_prefixes(prompts, target, args), loop).result()
        res = guidellm_phase(args.guidellm, folder, target.name, port, target.headers, args, seed, shared)
    finally:
        if server is not None:
            server.close()
        loop.call_soon_threadsafe(loop.stop)
    if target.metrics:  # the warm-up's requests are in these counts too
        after = routed(target.metrics)
        spread: dict[str, int] = {}
        routes: dict[str, int] = {}
        for (replica, why), n in after.items():
            d = int(n - before.get((replica, why), 0.0))
            if d:
                spread[replica] = spread.get(replica, 0) + d
                routes[why] = routes.get(why, 0) + d
        res["spread"], res["routes"] = dict(sorted(spread.items())), routes
    return res


def routed(ports: list[int]) -> dict[tuple[str, str], float]:
    """(replica, reason) -> requests the gateways on `ports` answered, from their /metrics."""
    import re
    import urllib.request

    out: dict[tuple[str, str], float] = {}
    for port in ports:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        for m in re.finditer(r'^llmgw_gateway_routed_total\{model="%s",reason="(\w+)",replica="([^"]+)"\} (\S+)$' % MODEL, text, re.M):
            key = (m.group(2), m.group(1))
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def guidellm_data(args, shared: bool) -> dict:
    """guidellm's synthetic data of a phase."""
    data = {"kind": "synthetic_text", "prompt_tokens": 2 * args.question_tokens, "output_tokens": args.max_tokens}
    if shared:
        data.update(prompt_tokens=args.question_tokens, turns=TURNS, prefix_tokens=args.system_tokens, prefix_count=args.groups)
    return data


# guidellm's dataset with its seed (as its `run` derives it: Random(seed).getrandbits(32)),
# iterated until every prefix has come (each conversation draws one at random).
PREFIXES = """
import json, sys
from random import Random
from transformers import AutoTokenizer
from guidellm.data.deserializers.synthetic import SyntheticTextDataArgs, SyntheticTextDatasetDeserializer
folder, seed, data = sys.argv[1], Random(int(sys.argv[2])).getrandbits(32), json.loads(sys.argv[3])
data.pop("kind")
tokenizer = AutoTokenizer.from_pretrained(folder)
dataset = SyntheticTextDatasetDeserializer()(config=SyntheticTextDataArgs(**data), processor_factory=lambda: tokenizer, random_seed=seed)
seen = []
for i, row in enumerate(dataset):
    prefix = json.loads(row["conversation_turns"])["turns"][0]["columns"].get("prefix_column", [""])[0]
    if prefix and prefix not in seen:
        seen.append(prefix)
    if len(seen) >= data["prefix_count"] or i >= 5000:
        break
print(json.dumps(seen))
"""


def guidellm_prefixes(program: str, folder: Path, seed: int, data: dict) -> list[str]:
    """The system prompts guidellm gives the conversations of a phase with
    `seed`: its synthetic data draws each conversation's prefix at random
    from `--groups` of them, so a warm-up of its own first requests (one
    conversation's turns after another, as its streams take them) left a
    third of the prefixes unseen, and the measured requests that brought
    them, new to every replica, were the p90 of every policy (9 s of cold
    prefill each, bunched as new conversations come)."""
    python = Path(program).resolve().parent / "python"
    out = subprocess.run([str(python), "-c", PREFIXES, str(folder / MODEL), str(seed), json.dumps(data)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"guidellm's prefixes: {out.stderr[-800:]}")
    return json.loads(out.stdout)


async def warm_prefixes(prompts: list[str], target: Target, args) -> None:
    """Each system prompt sent once (with a one-word question, one token
    back), `--warm-streams` at a time, through the target as the phase's
    requests go: what a fleet that runs all day has seen of its customers."""
    room = asyncio.Semaphore(max(1, args.warm_streams))

    async def one(i: int, prompt: str) -> None:
        async with room:
            msgs = [{"role": "system", "content": prompt}, {"role": "user", "content": "Hello?"}]
            body = json.loads(request(msgs, args))
            body["max_tokens"] = 1
            await ask(target.ports[i % len(target.ports)], json.dumps(body).encode(), target.headers, args.drain_s)

    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def guidellm_phase(program: str, folder: Path, name: str, port: int, headers: dict[str, str], args, seed: int, shared: bool) -> dict:
    """One phase driven by guidellm: Poisson arrivals at `--rate`, its
    synthetic shared-prefix data (`--groups` prefixes of `--system-tokens`,
    questions of `--question-tokens`, answers of `--max-tokens`, `TURNS`
    turns a conversation, each carrying the earlier ones) or, without a
    shared prefix, single questions of twice that; a seed of its own per
    phase (fresh prompts: each phase starts cold). Its per-request records
    give the figures, every one counted (the warm-up was of the prefixes
    alone: warm_prefixes), the same as this file's client gives them."""
    total = args.requests if shared else args.requests_no_prefix
    data = guidellm_data(args, shared)
    backend = {
        "kind": "openai_http", "target": f"http://127.0.0.1:{port}", "model": MODEL, "timeout": args.drain_s,
        "extras": {"headers": {"Connection": "close", **headers}}, "validate_backend": False,  # (its GET /health: LiteLLM's wants the key)
    }  # fmt: skip

    def run(profile: dict, count: int, report: Path) -> dict:
        argv = [program, "run", "--disable-progress"]
        for option, value in (
            ("--backend", backend), ("--profile", profile), ("--constraint", {"kind": "max_requests", "count": count}),
            ("--data", data), ("--seed", {"kind": "static", "value": seed}), ("--output", {"kind": "json", "path": str(report)}),
        ):  # fmt: skip
            argv += [option, json.dumps(value)]
        out = subprocess.run(argv, cwd=folder, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                             timeout=args.drain_s + 3 * count / args.rate + 600)  # fmt: skip
        if out.returncode != 0 or not report.exists():
            raise RuntimeError(f"guidellm failed ({out.returncode}): {(out.stderr or out.stdout)[-1500:]}")
        return json.loads(report.read_text())["benchmarks"][0]["requests"]

    tag = f"{name.split()[0].strip('()')}-{seed}"
    if shared or args.streams_no_prefix <= 0:
        bench = run({"kind": "poisson", "rate": args.rate}, total, folder / f"{tag}.json")
    else:
        bench = run({"kind": "concurrent", "streams": args.streams_no_prefix}, total, folder / f"{tag}.json")
    rs = []
    for status in ("successful", "errored", "incomplete"):
        for r in bench.get(status) or ():
            start, end = r.get("request_start_time") or 0.0, r.get("request_end_time") or 0.0
            ttft = r.get("time_to_first_token_ms")
            rs.append({
                "ok": status == "successful", "status": 200 if status == "successful" else 0, "error": status,
                "ttft": ttft / 1000 if ttft is not None else None, "e2e": r.get("request_latency") or (end - start),
                "prompt": r.get("prompt_tokens") or 0, "cached": r.get("cached_tokens") or 0,
                "completion": r.get("output_tokens") or 0, "replica": "", "route": "", "at": start, "end": end,
            })  # fmt: skip
    rs.sort(key=lambda r: r["at"])
    return summary(name, [rs])


# --------------------------------------------------------------------------- the fleet


def llmgw(work: Path, *args: str, timeout: float = 600) -> str:
    out = subprocess.run([sys.executable, "-m", "llmgw", *args], cwd=work, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "PYTHONPATH": str(HERE.parent)})  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"llmgw {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()[-2000:]}")
    return out.stdout


def catalog(args, routing: str) -> str:
    return (
        f"models:\n  - name: {MODEL}\n    min_replicas: {args.replicas}\n    routing: {routing}\n    profiles:\n"
        f"      - {{name: cpu, engine: llama.cpp, gpus: 0, cpu_cores: 1, model: smollm2, "
        f'args: ["--ctx-size", "{args.ctx_size}", "--parallel", "{args.slots}", "--cache-ram-mib", "{args.cache_ram_mib}"]}}\n'
    )


def set_routing(work: Path, args, routing: str, ports: list[int], expect: tuple[str, ...]) -> None:
    """Apply the catalog with `routing`, and wait until every gateway routes by it."""
    (work / "catalog.yaml").write_text(catalog(args, routing))
    llmgw(work, "ctl", "apply", "-f", "catalog.yaml", "--wait", "--timeout", "600")
    for port in ports:
        for _ in range(120):
            body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
            r = asyncio.run(ask(port, body, {}, 120))
            if r["ok"] and r["headers"].get("llmgw-route") in expect:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"the gateway on port {port} does not route by {routing}")


async def engines(url: str, creds: str) -> list[tuple[str, str, str]]:
    """(replica, endpoint, key) of each ready replica: the log folded, the keys read as a gateway reads them."""
    from llmgw.bus.nats import NatsBus
    from llmgw.core.folding.fold import apply
    from llmgw.core.folding.state import State
    from llmgw.gateway.routing import routable

    bus = await NatsBus.connect(url, creds=creds)
    state = State()
    last = await bus.last_seq()
    done = asyncio.get_running_loop().create_future()

    def on(seq: int, subject: str, data: bytes) -> None:
        apply(state, seq, subject, data)
        if seq >= last and not done.done():
            done.set_result(None)

    follower = await bus.follow(1, on)
    await done
    await follower.stop()
    out = [(t.replica, t.endpoint, await bus.engine_key(t.key_name)) for t in routable(state) if t.model == MODEL]
    await bus.close()
    return out


def start_litellm(program: str, work: Path, fleet: list[tuple[str, str, str]]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    lines = ["model_list:"]
    for _, endpoint, key in fleet:
        lines += [f"  - model_name: {MODEL}", "    litellm_params:", f"      model: openai/{MODEL}", f"      api_base: {endpoint}/v1",
                  f"      api_key: {key}", "      stream_timeout: 1200", "      timeout: 1200"]  # fmt: skip
    lines += ["router_settings:", "  routing_strategy: least-busy", "  num_retries: 0",
              "litellm_settings:", "  drop_params: false", "  request_timeout: 1200", "general_settings:", "  master_key: sk-bench"]  # fmt: skip
    (work / "litellm.yaml").write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(
        [program, "--config", str(work / "litellm.yaml"), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
        stdout=open(work / "litellm.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    wait_port(port, 180)
    return proc, port


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --------------------------------------------------------------------------- the run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--groups", type=int, default=32, help="groups, each with a system prompt of its own")
    p.add_argument("--users", type=int, default=1, help="users per group, each in a multi-turn conversation")
    p.add_argument("--system-tokens", type=int, default=1000)
    p.add_argument("--question-tokens", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=16, help="tokens of each answer")
    p.add_argument("--rate", type=float, default=0.8, help="requests/s offered (Poisson; see above)")
    p.add_argument("--requests", type=int, default=100, help="requests counted per phase, after the warm-up")
    p.add_argument(
        "--warm-streams", type=int, default=32,
        help="the warm-up's requests at a time (one request per group, before the measured arrivals; 0: none)",
    )  # fmt: skip
    p.add_argument("--requests-no-prefix", type=int, default=60, help="requests per no-prefix phase")
    p.add_argument(
        "--streams-no-prefix", type=int, default=6,
        help="the no-prefix phases' requests at a time, each sent once one is answered (closed loop: the throughput is "
        "what the fleet carries; 0: Poisson arrivals at --rate, where it is the rate)",
    )  # fmt: skip
    p.add_argument("--cache-ram-mib", type=int, default=384, help="each engine's host prompt cache (see above)")
    p.add_argument("--drain-s", type=float, default=600.0, help="after the last arrival, how long answers are waited for")
    p.add_argument("--ctx-size", type=int, default=8192, help="each engine's context, shared by its slots")
    p.add_argument(
        "--slots", type=int, default=2,
        help="each engine's slots (llama.cpp --parallel): a request that finds its prefix's slot busy takes another, cold",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=30)
    p.add_argument(
        "--phases", default="a,b,c,d,e,a0,c0,c0,a0",
        help="which to run, in order (a0, c0: the no-prefix workload; a key given twice is one phase run twice, see above)",
    )  # fmt: skip
    p.add_argument("--litellm", default=shutil.which("litellm") or "", help="LiteLLM's proxy program (litellm[proxy])")
    p.add_argument(
        "--guidellm", default="",
        help="guidellm's program (pip install guidellm gguf, in a venv of its own) as the load generator instead of this file's "
        "client (see above: its multi-turn arrivals bunch)",
    )  # fmt: skip
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()

    from llmgw.agent import weights

    weights.demo_weights() or weights.fetch_demo(weights.cache_dir())  # the engines' model, fetched once as `llmgw up` does
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-prefix-"))
    gw1, gw2, nats_port = free_port(), free_port(), free_port()
    first = free_port()
    (work / "agent.yaml").write_text(f"address: 127.0.0.1\ncpu_cores: {args.replicas}\n")
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    up = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "up", "--state-dir", ".llmgw", "--no-demo", "--no-console", "--gateway-port", str(gw1),
         "--nats-port", str(nats_port), "--agent-file", "agent.yaml", "--engine-ports", f"{first}-{first + 63}"],
        cwd=work, stdout=open(work / "up.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True, env=env,
    )  # fmt: skip
    second = lite = None
    out: dict = {"args": vars(args), "phases": {}}
    runs: dict[str, list[list[dict]]] = {}  # a phase's runs: its requests, run by run
    try:
        wait_port(gw1, 180)
        url = f"nats://127.0.0.1:{nats_port}"
        from llmgw.bus.keystore import Keystore

        creds = str(Keystore(work / ".llmgw" / "creds").init().ensure("gateway", "bench-gw2"))
        second = subprocess.Popen(
            [sys.executable, "-m", "llmgw", "gateway", "--nats", url, "--creds", creds, "--port", str(gw2)],
            cwd=work, stdout=open(work / "gateway2.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )  # fmt: skip
        wait_port(gw2, 120)
        started = time.monotonic()
        set_routing(work, args, "prefix", [gw1, gw2], ("hashed", "warm", "overflow"))
        print(f"{args.replicas} replicas ready in {time.monotonic() - started:.0f}s", file=sys.stderr)
        fleet = asyncio.run(engines(url, creds))
        by_base = {f"{endpoint}/v1": rid for rid, endpoint, _ in fleet}
        ours = lambda h: h.get("llmgw-replica", "")  # noqa: E731
        folder = guidellm_folder(args.guidellm, work) if args.guidellm else None
        if "e" in args.phases.split(","):
            if args.litellm:
                lite, lite_port = start_litellm(args.litellm, work, fleet)
            else:
                print("no LiteLLM proxy (--litellm, or litellm on PATH): phase e skipped", file=sys.stderr)
        plan = {
            "a": ("(a) least-load", "least-load", ("least_load",), [gw1], True),
            "b": ("(b) round-robin", "round-robin", ("round_robin",), [gw1], True),
            "c": ("(c) prefix", "prefix", ("hashed", "warm", "overflow"), [gw1], True),
            "d": ("(d) prefix, 2 gateways", "prefix", ("hashed", "warm", "overflow"), [gw1, gw2], True),
            "e": ("(e) LiteLLM least-busy", None, (), [], True),
            "a0": ("(a) least-load, no prefix", "least-load", ("least_load",), [gw1], False),
            "c0": ("(c) prefix, no prefix", "prefix", ("hashed", "warm", "overflow"), [gw1], False),
        }
        for key in args.phases.split(","):
            name, routing, expect, ports, shared = plan[key]
            if key == "e":
                if lite is None:
                    continue
                target = Target(name, [lite_port], {"Authorization": "Bearer sk-bench"},
                                lambda h: by_base.get(h.get("x-litellm-model-api-base", "").rstrip("/"), h.get("x-litellm-model-api-base", "")))  # fmt: skip
            else:
                set_routing(work, args, routing, ports, expect)
                target = Target(name, ports, {}, ours, [gw1, gw2])
            workload = Workload(args, f"{key}{time.time_ns() % 100000}", shared)
            print(f"{name}: {workload.warmup} + {workload.requests} requests at {args.rate:g}/s ...", file=sys.stderr)
            if folder is None:
                runs[key] = runs.get(key, []) + [asyncio.run(phase(target, workload, args))]
                res = summary(name, runs[key])
            else:  # a key given twice: the second run's figures
                res = guided(args, folder, target, shared, args.seed + len(out["phases"]))
            out["phases"][key] = res
            print(json.dumps({k: v for k, v in res.items() if k != "requests"}), file=sys.stderr)
        report(out, args)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    finally:
        stop(lite)
        stop(second)
        stop(up)
        shutil.rmtree(work, ignore_errors=True) if not os.environ.get("LLMGW_BENCH_KEEP") else print(f"kept {work}", file=sys.stderr)
    return 0


def ratio(a, b) -> str:
    return f"{a / b:.2f}" if a and b else "n/a"


def report(out: dict, args) -> None:
    ph = out["phases"]
    load = os.getloadavg()[0]
    print(f"{args.replicas} llama.cpp replicas of SmolLM2-135M (one thread, {args.slots} slots each) on {os.cpu_count()} cores shared with others "
          f"(load average {load:.1f} at the end); {args.requests} requests a phase ({args.requests_no_prefix} a run without a shared prefix) "
          f"at {args.rate:g}/s (Poisson, open loop), after a warm-up of one request a group (without: {args.streams_no_prefix} at a time, closed loop); by {'guidellm' if args.guidellm else 'this file'}; "
          f"prompt cache {args.cache_ram_mib} MiB an engine; "
          f"{args.groups} groups x {args.users} users, system prompts ~{args.system_tokens} tokens, questions ~{args.question_tokens}, "
          f"answers {args.max_tokens} tokens")  # fmt: skip
    cols = ("ttft_p50", "ttft_p90", "ttft_p99", "e2e_p50", "e2e_p90", "e2e_p99", "rps", "out_tps", "hit_ratio", "prompt_mean", "errors")
    print(f"{'':28}" + "".join(f"{c:>11}" for c in cols) + "   spread (requests per replica); routes")
    for key, r in ph.items():
        print(f"{r['name']:28}" + "".join(f"{'-' if r[c] is None else r[c]:>11}" for c in cols) + f"   {r['spread']}; {r['routes']}")
    goals = []
    a, c, d, e, a0, c0 = (ph.get(k) for k in ("a", "c", "d", "e", "a0", "c0"))
    if a and c:
        goals.append(("(c) p90 TTFT at least 10x lower than (a)'s", ratio(a["ttft_p90"], c["ttft_p90"]) + "x"))
        goals.append(("(c) throughput at least 1.5x (a)'s", ratio(c["rps"], a["rps"]) + "x"))
    if e and c:
        goals.append(("(c) p90 TTFT at least 10x lower than (e)'s", ratio(e["ttft_p90"], c["ttft_p90"]) + "x"))
    if a0 and c0:
        goals.append(("no prefix: (c) throughput within 5% of (a)", ratio(c0["rps"], a0["rps"])))
        goals.append(("no prefix: (c) p50 TTFT within 5% of (a)", ratio(c0["ttft_p50"], a0["ttft_p50"])))
    if c and d:
        goals.append(("(d) hit ratio within 10% of (c)'s", ratio(d["hit_ratio"], c["hit_ratio"])))
    for what, got in goals:
        print(f"goal: {what:52} {got}")


if __name__ == "__main__":
    sys.exit(main())
