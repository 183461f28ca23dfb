"""Fair share at the gateway (issue 32): real gateways in front of replicas
that saturate.

    python benchmarks/fairness.py [--seconds S] [--slots N] [--service-ms MS] [--rpm R] [--json FILE]

The replicas are simulated (llmgw/agent/sim_engine.py, with its identity and
engine key as an agent gives them) with a fixed service rate: each takes at
most `--slots` requests at once and answers each after `--service-ms` on
average (drawn within ±`--spread`, as answers of different lengths take
different times), so a replica serves slots / service requests a second, and
more queue. The noisy neighbour runs again on a replica whose every answer
takes exactly `--service-ms`: the worst case, where the slots filled together
by a burst end together ever after and a newcomer waits up to a whole service
time for the next. The
gateways are real (`llmgw gateway` processes) on a real nats-server, their
routing table folded from a log this writes (no control plane or agent);
`--replica-slots` is set to the replicas' slots, so the gateway holds the
requests past them in its fair queue.

    noisy neighbour   tenants A and B (two owners' keys, equal weight) on one
                      model: B sends steadily at a third of the capacity (within
                      its half), A bursts at 10x its half. B's p99 latency beside
                      B alone, and Jain's fairness index of the shares served,
                      each over its max-min fair share (A's: what B leaves).
                      Then A and B both past their shares: Jain's index of what
                      each was served (equal weights: equal shares).
    priority          a critical model's p99 alone, and while an opportunistic
                      tenant bursts on another model at 10x its capacity through
                      the same gateway (each model has its own replica: what
                      they share is the gateway).
    limits            a key limited to R requests a minute sends 2R a minute
                      through three gateways round robin, its first minute's
                      burst spent first: the requests served a minute, beside R.

Goals (the issue's): B's p99 within 1.5x of B alone; Jain's index >= 0.95;
served within 5 % of R. Everything shares this machine's cores (the client,
the replicas, the gateways, NATS): say so beside the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

ENGINE_KEY = os.environ.get("LLMGW_BENCH_KEY") or "bench-" + os.urandom(16).hex()
TENANTS = {"a": "sk-tenant-a-0123456789abcdef", "b": "sk-tenant-b-0123456789abcdef", "o": "sk-tenant-o-0123456789abcdef",
           "c": "sk-tenant-c-0123456789abcdef", "r": "sk-limited-0123456789abcdef"}  # fmt: skip
ASK = json.dumps({"model": "{model}", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


def identity(model: str) -> str:
    return f"{model}@{model}-1.0/bench"


# --------------------------------------------------------------------------- a replica of fixed service rate


def serve(port: int, model: str, slots: int, service_s: float, spread: float) -> None:
    """A replica of `slots` slots, each request `service_s` on average: drawn
    uniformly within ±`spread` of it (seeded), as answers of different lengths
    take different times; `spread` 0 is the fixed-time worst case, where the
    slots, filled together when a burst begins, end together ever after."""
    import random

    import uvloop

    from llmgw.agent.sim_engine import SimEngine

    draw = random.Random(port)

    class Replica(SimEngine):
        def __init__(self) -> None:
            super().__init__(model, identity=identity(model), key=ENGINE_KEY, delay=service_s)
            self.slots = asyncio.Semaphore(slots)

        async def answer(self, writer, method, path, req) -> bool:
            if method != "POST":
                return await super().answer(writer, method, path, req)
            async with self.slots:
                # Read by SimEngine.answer before its first await: this request's own.
                self.delay = service_s * (1 + spread * (2 * draw.random() - 1))
                return await super().answer(writer, method, path, req)

    async def main() -> None:
        await Replica().start(port)
        await asyncio.Event().wait()

    uvloop.run(main())


# --------------------------------------------------------------------------- the log


async def write_log(url: str, endpoints: dict[str, tuple[str, str]], rpm: int) -> None:
    """Models (name -> (endpoint, priority)), one ready replica each, two owners, their keys, and a limited key."""
    from llmgw.bus import engine_key_name
    from llmgw.bus.nats import NatsBus
    from llmgw.core.contract import events as ev
    from llmgw.core.contract.catalog import fingerprint

    bus = await NatsBus.connect(url)
    await bus.ensure_streams()
    now, n = time.time(), 0

    async def publish(event) -> int:
        nonlocal n
        n += 1
        return await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=f"fair-{n}")

    await publish(ev.NodeRegistered(at=now, node="bench", gpus=[]))
    for i, (model, (endpoint, priority)) in enumerate(endpoints.items()):
        profile = ev.ProfileSpec(name="p", gpus=0)
        await publish(ev.ModelApplied(at=now, model=ev.ModelSpec(name=model, profiles=[profile], priority=priority, routing="least-load")))
        rid = f"{model}-1"
        seq = await publish(ev.Decided(at=now, basis=0, actions=[ev.PlaceReplica(
            replica=rid, model=model, profile="p", fingerprint=fingerprint(profile), reason="benchmark",
            shards=[ev.ShardPlacement(shard=f"{rid}.0", node="bench", rank=0, gpus=[], port=40000 + i)],
        )]))  # fmt: skip
        await bus.put_engine_key(engine_key_name("bench", f"{rid}.0", seq), ENGINE_KEY)
        for st in ("starting", "loading", "ready"):
            await publish(ev.ShardStatus(
                at=now, node="bench", replica=rid, shard=f"{rid}.0", generation=seq, state=st,
                endpoint=endpoint if st == "ready" else "", identity=identity(model) if st == "ready" else "",
            ))  # fmt: skip
    for t, key in TENANTS.items():
        await publish(ev.OwnerApplied(at=now, name=f"org-{t}"))
        await publish(ev.ApiKeyApplied(
            at=now, name=f"key-{t}", owner=f"org-{t}", key_sha256=hashlib.sha256(key.encode()).hexdigest(),
            requests_per_minute=rpm if t == "r" else 0,
        ))  # fmt: skip
    await bus.close()


# --------------------------------------------------------------------------- clients


async def post(port: int, model: str, key: str) -> int:
    """One request on a connection of its own (Connection: close): its status."""
    body = ASK.replace("{model}", model).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (key.encode(), len(body), body)
        )
        head = await reader.readuntil(b"\r\n")
        await reader.read()
        return int(head.split()[1])
    finally:
        writer.close()


class Load:
    """An open-loop sender: `rate` requests a second, on a schedule (latency counted from when each was due)."""

    def __init__(self, port: int, model: str, key: str) -> None:
        self.port, self.model, self.key = port, model, key
        self.latencies: list[float] = []
        self.codes: dict[int, int] = {}
        self.served_at: list[float] = []

    async def one(self, due: float, ports: list[int] | None = None, i: int = 0) -> None:
        port = ports[i % len(ports)] if ports else self.port
        try:
            code = await post(port, self.model, self.key)
        except Exception:
            code = 0
        self.codes[code] = self.codes.get(code, 0) + 1
        if code == 200:
            now = time.monotonic()
            self.latencies.append(now - due)
            self.served_at.append(now)

    async def run(self, rate: float, seconds: float, ports: list[int] | None = None) -> None:
        start, tasks, i = time.monotonic(), [], 0
        while True:
            due = start + i / rate
            if due - start >= seconds:
                break
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(self.one(due, ports, i)))
            i += 1
        await asyncio.gather(*tasks)

    def served_between(self, a: float, b: float) -> int:
        return sum(a <= t < b for t in self.served_at)


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else float("nan")


def max_min(capacity: float, demands: list[float]) -> list[float]:
    """Max-min fair shares of `capacity` among equal-weight demands (water filling)."""
    shares, left, todo = [0.0] * len(demands), capacity, sorted(range(len(demands)), key=lambda i: demands[i])
    for n, i in enumerate(todo):
        shares[i] = min(demands[i], left / (len(todo) - n))
        left -= shares[i]
    return shares


# --------------------------------------------------------------------------- the runs


async def noisy(args, gw: int, model: str, capacity: float) -> dict:
    """B alone at a third of the capacity, then beside A bursting at 10x its half."""
    b_rate = capacity / 3
    alone = Load(gw, model, TENANTS["b"])
    await alone.run(b_rate, args.seconds)
    a, b = Load(gw, model, TENANTS["a"]), Load(gw, model, TENANTS["b"])
    a_rate = 10 * capacity / 2
    began = time.monotonic()
    await asyncio.gather(a.run(a_rate, args.seconds), b.run(b_rate, args.seconds))
    window = (began + 1.0, began + args.seconds)  # past the first second: saturated by then
    span = window[1] - window[0]
    served = [a.served_between(*window) / span, b.served_between(*window) / span]
    fair = max_min(capacity, [a_rate, b_rate])
    return {
        "b_alone_p99_ms": p99(alone.latencies) * 1000, "b_with_a_p99_ms": p99(b.latencies) * 1000,
        "served_rps": served, "fair_rps": fair, "jain": jain([s / f for s, f in zip(served, fair)]),
        "a_codes": a.codes, "b_codes": b.codes,
    }  # fmt: skip


async def measure(args, ports: list[int]) -> dict:
    capacity = args.slots / (args.service_ms / 1000)
    out: dict = {"capacity_rps": capacity}
    gw = ports[0]
    warm = Load(gw, "m", TENANTS["b"])
    await warm.run(capacity / 4, 1.0)

    # Noisy neighbour: B alone, then beside A's burst; on replicas of drawn
    # service times, then on those of a fixed one (the worst case).
    out["noisy"] = await noisy(args, gw, "m", capacity)
    out["noisy_fixed"] = await noisy(args, gw, "fixed", capacity)
    # Both past their shares: equal weights, equal shares.
    a2, b2 = Load(gw, "m", TENANTS["a"]), Load(gw, "m", TENANTS["c"])
    began = time.monotonic()
    await asyncio.gather(a2.run(4 * capacity, args.seconds), b2.run(capacity, args.seconds))
    window = (began + 1.0, began + args.seconds)
    span = window[1] - window[0]
    both = [a2.served_between(*window) / span, b2.served_between(*window) / span]
    out["backlogged"] = {"served_rps": both, "jain": jain(both)}

    # Priority: the critical model alone, then beside an opportunistic burst on another model.
    crit_alone = Load(gw, "critical", TENANTS["b"])
    await crit_alone.run(capacity / 3, args.seconds)
    crit, opp = Load(gw, "critical", TENANTS["b"]), Load(gw, "batch", TENANTS["o"])
    await asyncio.gather(crit.run(capacity / 3, args.seconds), opp.run(10 * capacity, args.seconds))
    out["priority"] = {
        "critical_alone_p99_ms": p99(crit_alone.latencies) * 1000, "critical_with_burst_p99_ms": p99(crit.latencies) * 1000,
        "batch_codes": opp.codes,
    }  # fmt: skip

    # Limits across three gateways: the first minute's burst spent, then 2R a minute for --limit-seconds.
    lim = Load(gw, "m", TENANTS["r"])
    await lim.run(args.rpm / 3, 6.0, ports)  # twice the minute's allowance in 6 s: the burst spent
    steady = Load(gw, "m", TENANTS["r"])
    await steady.run(2 * args.rpm / 60, args.limit_seconds, ports)
    got = steady.codes.get(200, 0) / args.limit_seconds * 60
    out["limits"] = {"rpm": args.rpm, "served_per_minute": got, "off_by": abs(got - args.rpm) / args.rpm, "codes": steady.codes}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    p.add_argument("--slots", type=int, default=4, help="requests a replica takes at once")
    p.add_argument("--service-ms", type=float, default=50.0, help="each request's service time at a replica")
    p.add_argument("--rpm", type=int, default=600, help="the limited key's requests a minute")
    p.add_argument("--limit-seconds", type=float, default=60.0, help="the limits measurement's length")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--spread", type=float, default=0.5, help="each service time drawn within ±this fraction of --service-ms")
    p.add_argument("--serve", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        port, model, slots, service, spread = args.serve
        return serve(int(port), model, int(slots), float(service), float(spread))

    from gateway import wait_port  # benchmarks/gateway.py

    from llmgw.bus.server import NatsServer, free_port

    work = Path(tempfile.mkdtemp(prefix="llmgw-fair-"))
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "LLMGW_BENCH_KEY": ENGINE_KEY, "PYTHONPATH": str(HERE.parent)}
    nats = NatsServer(work / "nats", free_port()).start()
    try:
        models = {"m": "standard", "fixed": "standard", "critical": "critical", "batch": "opportunistic"}
        endpoints = {}
        for model, priority in models.items():
            spread = 0.0 if model == "fixed" else args.spread
            port = free_port()
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--serve", str(port), model, str(args.slots), str(args.service_ms / 1000), str(spread)],
                env=env, start_new_session=True,
            ))  # fmt: skip
            wait_port(port)
            endpoints[model] = (f"http://127.0.0.1:{port}", priority)
        asyncio.run(write_log(nats.url, endpoints, args.rpm))
        ports = [free_port() for _ in range(3)]
        for i, port in enumerate(ports):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "llmgw", "gateway", "--nats", nats.url, "--port", str(port), "--name", f"fair{i}",
                 "--replica-slots", str(args.slots), "--max-queue", "256", "--max-queue-wait", "30",
                 "--max-connections-per-client", "4096"],
                stdout=open(work / f"gateway{i}.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True, env=env,
            ))  # fmt: skip
        for port in ports:
            wait_port(port)
        time.sleep(1.0)  # the gateways fold the log
        res = asyncio.run(measure(args, ports))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        nats.stop()
    load = os.getloadavg()[0]
    n, nf, b, pr, lim = res["noisy"], res["noisy_fixed"], res["backlogged"], res["priority"], res["limits"]
    print(f"simulated replicas: {args.slots} slots x {args.service_ms:g} ms ± {args.spread * 100:.0f} % = {res['capacity_rps']:.0f} req/s each; "
          f"{os.cpu_count()} cores shared by the client, replicas, 3 gateways and NATS (load average {load:.2f}); {args.seconds:g}s a measurement")
    print(f"noisy neighbour   B p99 alone {n['b_alone_p99_ms']:.1f} ms, beside A's burst {n['b_with_a_p99_ms']:.1f} ms "
          f"({n['b_with_a_p99_ms'] / n['b_alone_p99_ms']:.2f}x; goal <= 1.5x)")
    print(f"                  served A {n['served_rps'][0]:.1f}, B {n['served_rps'][1]:.1f} req/s; max-min fair "
          f"{n['fair_rps'][0]:.1f}, {n['fair_rps'][1]:.1f}; Jain's index {n['jain']:.3f} (goal >= 0.95); A's answers {n['a_codes']}")
    print(f"  fixed {args.service_ms:g} ms  B p99 alone {nf['b_alone_p99_ms']:.1f} ms, beside A's burst {nf['b_with_a_p99_ms']:.1f} ms "
          f"({nf['b_with_a_p99_ms'] / nf['b_alone_p99_ms']:.2f}x: the slots end in lockstep, B waits up to one service time "
          f"for the next); Jain's index {nf['jain']:.3f}")
    print(f"both backlogged   served {b['served_rps'][0]:.1f}, {b['served_rps'][1]:.1f} req/s; Jain's index {b['jain']:.3f} (goal >= 0.95)")
    print(f"priority          critical p99 alone {pr['critical_alone_p99_ms']:.1f} ms, beside the burst "
          f"{pr['critical_with_burst_p99_ms']:.1f} ms; the burst's answers {pr['batch_codes']}")
    print(f"limits            R = {lim['rpm']}/min through 3 gateways: {lim['served_per_minute']:.0f}/min served "
          f"({lim['off_by'] * 100:.1f} % off; goal <= 5 %); answers {lim['codes']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
