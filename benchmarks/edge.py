"""The gateway's HTTP edge under abuse: what a real `llmgw gateway` process
(default limits, llmgw/gateway/config.py) holds, answers and keeps in memory.

    python benchmarks/edge.py [--slowloris N] [--url-mb M] [--body-mb B] [-- GATEWAY FLAGS...]

Measured, one after the other, on one gateway:

    huge URL        a request line of M MB (default 64), sent as fast as it goes: the answer,
                    its size, and the gateway's peak RSS (VmHWM) against before
    huge headers    1 MB of headers: the answer
    huge body       Content-Length of B MB (default 50): the answer, and how much of the body
                    the client had sent when it came
    slowloris       N connections (default 2000) each sending a request's head a byte a
                    second: connections held each second (the gateway's own count, from
                    /metrics), its RSS, how each was cut (408, 429, 503, closed), when the last
                    was, and a real request's latency through the gateway during the attack,
                    from another client address (127.0.0.2). The slow connections all come from
                    one address, so that --max-connections-per-client holds them first (add
                    `-- --max-connections-per-client 4096` to see the whole gateway's cap hold)

The gateway, its nats-server and upstream are set up as in benchmarks/gateway.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import gateway as bench  # noqa: E402  (benchmarks/gateway.py: the upstream, the log)

OTHER_CLIENT = "127.0.0.2"  # the real request's address during the slow connections' attack


def status_kib(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def exchange(port: int, data: bytes, timeout: float = 30.0, head: bytes = b"", source: str = "") -> tuple[bytes, int]:
    """Send `head`, then `data` (from a thread, as fast as it goes, 64 KiB a send) and
    read the answer's head; (the status line, bytes of `data` sent when the answer came).
    `source`: the client's address (another loopback one: another client)."""
    s = socket.create_connection(("127.0.0.1", port), source_address=(source, 0) if source else None)
    s.sendall(head)
    sent = 0
    done = threading.Event()

    def send() -> None:
        nonlocal sent
        view = memoryview(data)
        try:
            while sent < len(data) and not done.is_set():
                sent += s.send(view[sent : sent + 65536])
        except OSError:
            pass

    t = threading.Thread(target=send, daemon=True)
    t.start()
    s.settimeout(timeout)
    got = b""
    try:
        while b"\r\n" not in got:
            piece = s.recv(65536)
            if not piece:
                break
            got += piece
    except OSError as e:
        got = f"({type(e).__name__})".encode()
    at = sent
    done.set()
    s.close()
    t.join(5)
    return got.split(b"\r\n", 1)[0], at


def metric(port: int, name: str) -> float | None:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(OTHER_CLIENT, 0))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
    except OSError:
        return None
    m = re.search(rb"^%s (\S+)$" % name.encode(), data, re.M)
    return float(m.group(1)) if m else None


class Slow(asyncio.Protocol):
    def __init__(self, results: list) -> None:
        self.results = results
        self.transport = None
        self.got = b""
        self.status = 0
        self.open = True
        self.ours = False  # closed by this client at the end: held until then

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got += data
        if not self.status and b"\r\n" in self.got:
            self.status = int(self.got.split(b" ", 2)[1])

    def connection_lost(self, exc) -> None:
        self.open = False
        self.results.append((-2 if self.ours else self.status, time.monotonic()))


async def slowloris(port: int, n: int, gw_pid: int, seconds: float) -> dict:
    loop = asyncio.get_running_loop()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + b"X-Slow: y\r\n" * 1000
    results: list = []
    conns: list[Slow] = []
    rss_before = status_kib(gw_pid, "VmRSS")
    start = time.monotonic()
    for _ in range(n):
        try:
            _, c = await loop.create_connection(lambda: Slow(results), "127.0.0.1", port)
            conns.append(c)
        except OSError:
            results.append((-1, time.monotonic()))
    opened = time.monotonic() - start
    timeline = []
    probe: list[float] = []
    i = 0
    while time.monotonic() - start < seconds:
        alive = [c for c in conns if c.open]
        for c in alive:
            c.transport.write(head[i % len(head) : i % len(head) + 1])
        i += 1
        held = await loop.run_in_executor(None, metric, port, "llmgw_gateway_connections")
        timeline.append((round(time.monotonic() - start, 1), len(alive), None if held is None else int(held) - 1, status_kib(gw_pid, "VmRSS")))
        t0 = time.perf_counter()
        status, _ = await loop.run_in_executor(None, exchange, port, bench.request_bytes(port), 30.0, b"", OTHER_CLIENT)
        probe.append((time.perf_counter() - t0) * 1e3 if b" 200 " in status else float("nan"))
        if not alive:
            break
        await asyncio.sleep(1.0)
    for c in conns:
        if c.open:
            c.ours = True
            c.transport.close()
    await asyncio.sleep(0.2)
    cut = {}
    for status, _ in results:
        cut[status] = cut.get(status, 0) + 1
    last = max((at for s, at in results if s != -2), default=start) - start
    return {
        "n": n, "opened_s": round(opened, 2), "timeline": timeline, "cut": cut, "last_cut_s": round(last, 1),
        "rss_before_kib": rss_before, "rss_peak_kib": max(t[3] for t in timeline), "rss_after_kib": status_kib(gw_pid, "VmRSS"),
        "probe_ms": probe,
    }  # fmt: skip


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slowloris", type=int, default=2000, help="slow connections")
    p.add_argument("--seconds", type=float, default=30.0, help="at most this long for the slow connections")
    p.add_argument("--url-mb", type=int, default=64)
    p.add_argument("--body-mb", type=int, default=50)
    args = p.parse_args(argv)

    from llmgw.bus.server import NatsServer

    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-edge-"))
    procs: list[subprocess.Popen] = []
    up_port, gw_port = bench.free_port(), bench.free_port()
    nats = NatsServer(work / "nats", bench.free_port()).start()
    try:
        procs.append(subprocess.Popen([sys.executable, str(HERE / "gateway.py"), "--serve", str(up_port)], start_new_session=True))
        bench.wait_port(up_port)
        asyncio.run(bench.write_log(nats.url, {bench.MODEL: f"http://127.0.0.1:{up_port}"}))
        gw = subprocess.Popen(
            [sys.executable, "-m", "llmgw", "gateway", "--nats", nats.url, "--port", str(gw_port), "--name", "edge", *extra],
            stdout=open(work / "gateway.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True, cwd=HERE.parent,
        )  # fmt: skip
        procs.append(gw)
        bench.wait_port(gw_port)
        exchange(gw_port, bench.request_bytes(gw_port))  # warm

        url = b"GET /" + b"a" * (args.url_mb << 20) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
        body = b"x" * (args.body_mb << 20)
        rss0 = status_kib(gw.pid, "VmRSS")
        t0 = time.perf_counter()
        url_status, _ = exchange(gw_port, url)
        url_s = time.perf_counter() - t0
        hwm = status_kib(gw.pid, "VmHWM")
        hdr_status, _ = exchange(gw_port, b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: %s\r\n" % (b"p" * 1000) * 1000 + b"\r\n")
        body_head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (args.body_mb << 20)
        t0 = time.perf_counter()
        body_status, body_sent = exchange(gw_port, body, head=body_head)
        body_s = time.perf_counter() - t0
        print(f"{os.cpu_count()} cores shared by the clients, the upstream and the gateway; gateway flags: {' '.join(extra) or 'the defaults'}")
        print(f"huge URL ({args.url_mb} MB):     {url_status.decode(errors='replace')} in {url_s * 1e3:.0f} ms; "
              f"gateway RSS {rss0 / 1024:.1f} MiB before, peak {hwm / 1024:.1f} MiB (+{(hwm - rss0) / 1024:.1f})")
        print(f"huge headers (1 MB):  {hdr_status.decode(errors='replace')}")
        print(f"huge body ({args.body_mb} MB):    {body_status.decode(errors='replace')} in {body_s * 1e3:.0f} ms, "
              f"with {body_sent / 1e6:.2f} MB of the body sent by then (into the socket buffers)")

        r = asyncio.run(slowloris(gw_port, args.slowloris, gw.pid, args.seconds))
        print(f"slowloris: {r['n']} connections opened in {r['opened_s']}s, each sending a byte a second")
        print(f"  {'t (s)':>6} {'open (client)':>14} {'held (gateway)':>15} {'gateway RSS MiB':>16}")
        for t, alive, held, rss in r["timeline"]:
            print(f"  {t:>6} {alive:>14} {'' if held is None else held:>15} {rss / 1024:>16.1f}")
        said = {0: "closed unanswered", -1: "refused at connect", -2: "still held at the end"}
        cut = ", ".join(f"{n} {said.get(s, s)}" for s, n in sorted(r["cut"].items()))
        probes = [p for p in r["probe_ms"] if p == p]
        print(f"  cut: {cut}; the last {r['last_cut_s']}s after the first connection")
        print(f"  gateway RSS: {r['rss_before_kib'] / 1024:.1f} MiB before, peak {r['rss_peak_kib'] / 1024:.1f}, "
              f"after {r['rss_after_kib'] / 1024:.1f}")
        print(f"  a real request during the attack: {len(probes)}/{len(r['probe_ms'])} answered 200, "
              f"median {sorted(probes)[len(probes) // 2] if probes else float('nan'):.1f} ms, max {max(probes, default=float('nan')):.1f} ms")
    finally:
        bench.stop_all(procs)
        nats.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
