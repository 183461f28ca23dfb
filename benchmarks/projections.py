"""How fast the log is projected into the SQLite read models.

    python benchmarks/projections.py [--events N] [--batch B] [--also-batch B2] [--repeat R] [--no-nats]

The log is a simulated fleet recorded through the real core (`fleetgen.py`,
default 200,000 events, cached under benchmarks/.cache/). Every figure
includes the SQLite commits: an event counts once its rows and the position
are committed.

(a) the projector's own batch function (`Projector.project`): records read
    from the file, fed in batches of B (default: the projector's own
    MAX_BATCH, what it takes from a backlog), each one fold + rows + one
    transaction, into a fresh database each time; the best of R runs (default
    3: the cores here are shared and noisy). The headline figure. Goal:
    >= 20,000 events/s. Then once in batches of B2 (default 2,000), for
    comparison.
(b) the same through a `MemoryBus`: `Projector.start()` following the log,
    the callback queueing, the writer task taking batches of up to B.
(c) through a real nats-server: the stream loaded first (not timed), then a
    projector from an empty database to the last sequence (`NatsBus.follow`,
    its fast catch-up reader); then `rebuild()` of a fresh file; then a
    restart over the finished database, which folds the whole log without
    writing a row (what a restart after a crash costs, before the tail).

Checks: the state folded equals the generator's own, and the entity tables
hold exactly the rows of that state (`rows.all_entity_rows`).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import signal
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import fleetgen  # noqa: E402

from llmgw.bus.memory import MemoryBus  # noqa: E402
from llmgw.bus.nats import NatsBus  # noqa: E402
from llmgw.bus.server import NatsServer, free_port  # noqa: E402
from llmgw.core.folding.fold import apply, encode_state  # noqa: E402
from llmgw.core.folding.state import State  # noqa: E402
from llmgw.projections import Projector, rebuild  # noqa: E402
from llmgw.projections.projector import MAX_BATCH  # noqa: E402
from llmgw.projections.rows import COLUMNS, all_entity_rows  # noqa: E402
from llmgw.replay import logfile  # noqa: E402

GOAL = 20_000
LOAD_BATCH = 5000
now = time.perf_counter


def say(*args) -> None:
    print(*args, flush=True)


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def digest(state: State) -> str:
    return hashlib.sha256(encode_state(state)).hexdigest()


def rows_match(db: Path, state: State) -> bool:
    want = all_entity_rows(state)
    conn = sqlite3.connect(db)
    try:
        for t in ("models", "nodes", "replicas", "shards"):
            got = conn.execute(f"SELECT {', '.join(COLUMNS[t])} FROM {t}").fetchall()
            if sorted(got) != sorted(getattr(want, t).values()):
                return False
        return True
    finally:
        conn.close()


def table_sizes(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        counts = [f"{t} {conn.execute(f'SELECT count(*) FROM {t}').fetchone()[0]:,}" for t in COLUMNS]
    finally:
        conn.close()
    return ", ".join(counts) + f"; {db.stat().st_size / 1e6:.0f} MB"


# ---------------------------------------------------------------------- (a)


async def bench_direct(records: list, db: Path, batch: int) -> tuple[float, State]:
    projector = Projector(None, db, max_batch=batch)
    await projector.open(log_id="bench")
    cpu0, t0 = time.process_time(), now()
    for i in range(0, len(records), batch):
        await projector.project(records[i : i + batch])
    seconds, cpu = now() - t0, time.process_time() - cpu0
    await projector.close()
    say(f"    {len(records):,} events in {seconds:.2f} s ({cpu:.2f} s CPU, both threads), "
        f"{projector.batches} transactions: {rate(len(records), seconds):,.0f} events/s")
    return seconds, projector.state


# ---------------------------------------------------------------------- (b)


async def bench_memory(records: list, db: Path, batch: int) -> float:
    bus = MemoryBus()
    bus.log = [(subject, data) for _, subject, data in records]
    projector = Projector(bus, db, max_batch=batch)
    t0 = now()
    await projector.start()
    if not await projector.wait_for(len(records), timeout=600):
        raise RuntimeError(f"the projector stopped at {projector.position}")
    seconds = now() - t0
    await projector.close()
    say(f"    {len(records):,} events in {seconds:.2f} s, {projector.batches} transactions: "
        f"{rate(len(records), seconds):,.0f} events/s")
    return seconds


# ---------------------------------------------------------------------- (c)


async def load(bus: NatsBus, records: list) -> float:
    js = bus.nc.jetstream(timeout=60.0, publish_async_max_pending=LOAD_BATCH * 2)
    t = now()
    for i in range(0, len(records), LOAD_BATCH):
        chunk = records[i : i + LOAD_BATCH]
        futures = [await js.publish_async(s, d, headers={"Nats-Msg-Id": f"bench-{seq}"}) for seq, s, d in chunk]
        acks = await asyncio.gather(*futures)
        if acks[-1].seq != chunk[-1][0]:
            raise RuntimeError(f"stream sequence {acks[-1].seq} is not the log's {chunk[-1][0]}: was the stream empty?")
    return now() - t


async def follow_to_end(url: str, db: Path, last: int, batch: int) -> tuple[float, int, int]:
    bus = await NatsBus.connect(url, name="bench-projector")
    try:
        projector = Projector(bus, db, max_batch=batch)
        t0 = now()
        stood_at = await projector.start()
        if not await projector.wait_for(last, timeout=600):
            raise RuntimeError(f"the projector stopped at {projector.position}")
        if stood_at >= last:  # a restart with nothing to write: wait until the fold caught up
            while projector.state.seq < last:
                await asyncio.sleep(0.005)
        seconds = now() - t0
        await projector.close()
        return seconds, stood_at, projector.batches
    finally:
        await bus.close()


async def bench_nats(records: list, tmp: Path, batch: int, results: dict) -> None:
    n = len(records)
    server = NatsServer(tmp / "nats", port=free_port())
    server.start()
    try:
        bus = await NatsBus.connect(server.url, name="bench-load")
        try:
            await bus.ensure_streams()
            load_s = await load(bus, records)
            last = await bus.last_seq()
        finally:
            await bus.close()
        say(f"    loaded {n:,} messages in {load_s:.1f} s (not a figure); stream last seq {last}")
        db = tmp / "nats.db"
        seconds, _, batches = await follow_to_end(server.url, db, last, batch)
        results["c_follow"] = rate(n, seconds)
        results["c_same"] = rows_match(db, results["state"])
        say(f"    empty database to seq {last}: {seconds:.2f} s, {batches} transactions: "
            f"{results['c_follow']:,.0f} events/s; rows {'equal' if results['c_same'] else 'DIFFER from'} the state's")
        bus = await NatsBus.connect(server.url, name="bench-rebuild")
        try:
            t0 = now()
            await rebuild(bus, tmp / "rebuilt.db")
            seconds = now() - t0
        finally:
            await bus.close()
        results["c_rebuild"] = rate(n, seconds)
        say(f"    rebuild() into a fresh file: {seconds:.2f} s: {results['c_rebuild']:,.0f} events/s")
        seconds, stood_at, batches = await follow_to_end(server.url, db, last, batch)
        results["c_restart"] = seconds
        say(f"    restart at seq {stood_at} (fold only, {batches} transactions): caught up in {seconds:.2f} s")
    finally:
        server.stop()


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=200_000, help="events in the recorded log (default 200,000)")
    p.add_argument("--batch", type=int, default=MAX_BATCH,
                   help=f"most events per transaction (default {MAX_BATCH}, the projector's)")
    p.add_argument("--also-batch", type=int, default=2000,
                   help="(a) again with this batch size (default 2000; 0: skip)")
    p.add_argument("--repeat", type=int, default=3, help="run (a) this many times and keep the best (default 3)")
    p.add_argument("--no-nats", action="store_true", help="skip (c), the real nats-server")
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # finally blocks stop the nats-server
    n = a.events

    path, info, generated = fleetgen.cached(n)
    say(f"recorded log: {path.name} ({path.stat().st_size / 1e6:.0f} MB, "
        + ("generated now" if generated else "from the cache") + "): "
        + ", ".join(f"{k} {v:,}" for k, v in info["kinds"].items()))
    records = logfile.read(path)
    state = State()
    t0 = now()
    for seq, subject, data in records:
        apply(state, seq, subject, data)
    fold_only = now() - t0
    say(f"    the fold alone (fold.apply, no rows): {rate(n, fold_only):,.0f} events/s")

    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-proj-") as d:
        tmp = Path(d)
        say(f"\n(a) Projector.project, batches of {a.batch}")
        runs = []
        for i in range(max(a.repeat, 1)):
            db = tmp / f"direct-{i}.db"
            seconds, folded = asyncio.run(bench_direct(records, db, a.batch))
            runs.append(seconds)
            if i:
                db.unlink()
        seconds = min(runs)
        results["a"] = rate(n, seconds)
        results["a_s"] = seconds
        results["state"] = folded
        results["a_state"] = digest(folded) == info["state_sha256"]
        results["a_rows"] = rows_match(tmp / "direct-0.db", folded)
        say(f"    {table_sizes(tmp / 'direct-0.db')}")
        if a.also_batch:
            say(f"\n(a') Projector.project, batches of {a.also_batch}")
            seconds, _ = asyncio.run(bench_direct(records, tmp / "direct2.db", a.also_batch))
            results["a2"] = rate(n, seconds)

        say(f"\n(b) Projector following a MemoryBus, batches of up to {a.batch}")
        results["b"] = rate(n, asyncio.run(bench_memory(records, tmp / "memory.db", a.batch)))

        if not a.no_nats:
            say("\n(c) Projector following a real nats-server")
            asyncio.run(bench_nats(records, tmp, a.batch, results))

    r = results
    w = 44
    say(f"\n== figures: {n:,} events ==")
    best = f", best of {a.repeat}" if a.repeat > 1 else ""
    say(f"projected {n:,} events in {r['a_s']:.1f} s: {r['a']:,.0f} events/s (goal >= {GOAL:,}; batches of "
        f"{a.batch:,}{best})  {'ok' if r['a'] >= GOAL else 'MISSED'}")
    say(f"{'(a) batches of up to':{w - 7}} {a.batch:>6,}: {r['a']:>10,.0f} events/s")
    if "a2" in r:
        say(f"{'(a) batches of up to':{w - 7}} {a.also_batch:>6,}: {r['a2']:>10,.0f} events/s")
    say(f"{'(b) following a MemoryBus:':{w}} {r['b']:>10,.0f} events/s")
    if "c_follow" in r:
        say(f"{'(c) following nats-server, empty database:':{w}} {r['c_follow']:>10,.0f} events/s")
        say(f"{'(c) rebuild() from nats-server:':{w}} {r['c_rebuild']:>10,.0f} events/s")
        say(f"{'(c) restart over a full database:':{w}} {r['c_restart']:>10.2f} s "
            f"to fold {n:,} events, nothing written")
    checks = [("state = the generator's", r["a_state"]), ("entity rows = the state's", r["a_rows"])]
    if "c_same" in r:
        checks.append(("rows via nats-server = the state's", r["c_same"]))
    say("checks: " + ", ".join(f"{name}: {'yes' if ok else 'NO'}" for name, ok in checks))


if __name__ == "__main__":
    main()
