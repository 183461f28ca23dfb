"""What each view of the web console costs to render for 2,000 nodes: time to
first paint, measured in the browser (Debian's headless Chromium, driven by
Playwright), against a yardstick of 20 nodes served in the same run.

How the fleets are made: a log generated through the real core. Nodes
register (NodeRegistered, 8 GPUs each, with site/room/row/rack/pdu labels:
2 sites x 2 rooms x 5 rows x 20 racks x 5 nodes, two PDUs per rack), the
operator applies 24 models (1, 2, 4 and 8 GPUs per replica) sized to fill
about 70% of the GPUs, `decide` places them (each pass a Decided with its
basis, folded like the control plane's) and every shard reports ready; then
a gateway reports load on every model for ten minutes (a ModelLoad every
10 s: requests, tokens, cached prompt tokens, time to first byte), which the
Plots view draws. The
console folds that log as it folds a live one (Console._on_message) and
serves it over its real HTTP server; only the bus is absent (no action is
published here).

Each view is opened in a fresh page, the two fleets alternating, `--runs`
times; the figure is the median of the time from navigation start to the
view's first paint after its data came (the page marks `llmgw-painted-VIEW`
in a requestAnimationFrame after the paint of the rendered view), and the
size of its data and when it came (the rest is the browser's drawing).
"VIEW@past" is the view folded back to the middle of the log (time travel);
"map-zoom" the map zoomed into one site.

    .venv/bin/python benchmarks/console.py [--nodes 2000] [--runs 3] [--views map,fleet,...]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import threading
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmgw.bus.server import free_port  # noqa: E402
from llmgw.console.config import ConsoleConfig  # noqa: E402
from llmgw.console.server import Console  # noqa: E402
from llmgw.core.contract import events as ev  # noqa: E402
from llmgw.core.rules.decide import decide  # noqa: E402

VIEWS = ["map", "map@past", "map-zoom", "fleet", "fleet@past", "node", "node-gpus", "models", "replicas", "decisions",
         "quotas", "explain", "plots", "timeline"]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def make_log(nodes: int) -> list[tuple[int, str, bytes]]:
    records: list[tuple[int, str, bytes]] = []
    from llmgw.core.folding.fold import apply
    from llmgw.core.folding.state import State

    state = State()
    now = 1_800_000_000.0

    def emit(event: ev.Event) -> None:
        data = ev.encode(event)
        seq = len(records) + 1
        records.append((seq, ev.subject_for(event), data))
        apply(state, seq, records[-1][1], data)

    emit(ev.LeaderElected(at=now, term=1, leader="bench"))
    per_rack = 5
    for i in range(nodes):
        rack = i // per_rack
        site, room, row = rack // 200, (rack // 100) % 2, (rack // 20) % 5
        labels = {"llmgw.io/site": f"site-{site}", "llmgw.io/room": f"room-{site}-{room}",
                  "llmgw.io/row": f"row-{site}-{room}-{row}", "llmgw.io/rack": f"rack-{rack:03d}",
                  "llmgw.io/pdu": f"pdu-{rack:03d}{'ab'[i % 2]}"}
        emit(ev.NodeRegistered(at=now, node=f"node-{i:04d}", gpus=[ev.Gpu(index=g, model="H100", memory_gb=80.0)
                                                                   for g in range(8)],
                               memory_gb=1024.0, cpu_cores=128, labels=labels, agent="bench"))
    gpus_per = [1, 2, 4, 8]
    budget = int(nodes * 8 * 0.7)
    count = 24
    for m in range(count):
        g = gpus_per[m % 4]
        replicas = max(1, budget // count // g)
        emit(ev.ModelApplied(at=now, model=ev.ModelSpec(
            name=f"model-{m:02d}", owner=f"org/team-{m % 4}", min_replicas=replicas,
            profiles=[ev.ProfileSpec(name=f"g{g}", gpus=g)])))
    for _ in range(200):
        now += 1.0
        basis = state.seq
        actions = decide(state, now)
        if not actions:
            break
        emit(ev.Decided(at=now, basis=basis, actions=actions, leader="bench"))
        generation = state.seq  # a shard's generation is the sequence of the decision that placed it
        for a in actions:
            if isinstance(a, ev.PlaceReplica):
                for s in a.shards:
                    emit(ev.ShardStatus(at=now, node=s.node, replica=a.replica, shard=s.shard, generation=generation,
                                        state="ready", endpoint=f"http://{s.node}:{s.port}"))
    for step in range(60):  # ten minutes of load, for the plots
        now += 10.0
        for m in range(count):
            busy = (step + m) % 7
            emit(ev.ModelLoad(at=now, gateway="gw-bench", model=f"model-{m:02d}", in_flight=busy, queued=busy // 3,
                              last_used=now, requests=20 * busy, tokens_in=2000 * busy, tokens_out=500 * busy,
                              tokens_cached=900 * busy, ttft_p50=0.05 * (1 + busy), ttft_p90=0.12 * (1 + busy)))
    return records


async def project(records, db: Path) -> None:
    """The read models of the log, made by the projector itself (as `llmgw up` runs it)."""
    from llmgw.projections.projector import Projector

    projector = Projector(None, db, max_batch=2000)
    await projector.open(log_id="bench")
    for i in range(0, len(records), 2000):
        await projector.project(records[i : i + 2000])
    await projector.close()


class Served:
    """A console over a generated log and its read models, on its own loop in a thread."""

    def __init__(self, records, token: str, folder: Path) -> None:
        self.port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        db = folder / "readmodels.db"
        asyncio.run(project(records, db))
        self.console = Console(None, db, token, ConsoleConfig(port=self.port))
        for r in records:
            self.console._on_message(*r)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)

            async def start() -> None:
                self.console.server = await asyncio.start_server(self.console._serve, "127.0.0.1", self.port)
                ready.set()

            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(30)

    def stop(self) -> None:
        async def end() -> None:
            self.console.server.close()
            await asyncio.sleep(2 * self.console.config.tick_s)  # the event streams see the browser gone
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(end(), self.loop)
        self.thread.join(10)


def measure(browser, served: Served, token: str, view: str) -> tuple[float, int]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    base = f"http://127.0.0.1:{served.port}"
    page.goto(f"{base}/?token={token}")  # the cookie, then the landing view (the map) once
    page.wait_for_selector('body[data-painted="map"]', timeout=120_000)
    name, _, when = view.partition("@")
    target = {"node": "node/node-0000", "node-gpus": "node/node-0000", "explain": "explain/model-00",
              "plots": "plots/model-00", "map-zoom": "map/site=site-0"}.get(name, name)
    if name == "map-zoom":
        name = "map"  # map-zoom paints the map
    mid = served.console.state.seq // 2
    if when:
        page.goto("about:blank")
        page.goto(f"{base}/#{target}")  # where the page opens; the point in the log is set below
        page.wait_for_selector(f'body[data-painted="{name}"]', timeout=120_000)
        # No view of now still coming, and two frames, so that no paint of it is still to be marked.
        page.wait_for_function("() => !app.inflight", timeout=120_000)
        page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(r, 50))))")
        start = page.evaluate(f"performance.clearMarks(); app.rendered = {{}}; "
                              f"document.getElementById('atbox').value = '{mid}'; performance.now()")
        page.click('#atform button[type="submit"]')
        page.wait_for_selector(f'main[data-seq="{mid}"]', timeout=120_000)
        page.wait_for_function("n => performance.getEntriesByName(n).length > 0", arg=f"llmgw-painted-{name}",
                               timeout=120_000)
        painted = page.evaluate(f"performance.getEntriesByName('llmgw-painted-{name}').map(e => e.startTime)")
        ms = (painted[-1] - start) if painted else float("nan")
    else:
        page.goto("about:blank")
        page.goto(f"{base}/#{target}")
        if name == "node-gpus":  # the node's page with what its GPUs held, drawn once its own data came
            page.wait_for_selector('#gputimeline[data-painted="1"]', timeout=120_000)
        else:
            page.wait_for_selector(f'body[data-painted="{name}"]', timeout=120_000)
        painted = page.evaluate(f"performance.getEntriesByName('llmgw-painted-{name}').map(e => e.startTime)")
        ms = painted[0] if painted else float("nan")
    # Where the time went: its data parsed (the page's last llmgw-data mark before the paint), its HTML in
    # the page (llmgw-html); the rest is style, layout and paint. From the same start as `ms`.
    since = start if when else 0.0
    size, came, built = page.evaluate(
        "([since, paint]) => { const rs = performance.getEntriesByType('resource')"
        ".filter(e => e.name.includes('/api/') && !e.name.includes('/api/events') && e.startTime >= since);"
        "const last = (n) => Math.max(...performance.getEntriesByName(n).map(m => m.startTime).filter(t => t >= since && t <= paint));"
        "return [rs.reduce((s, e) => s + e.encodedBodySize, 0), last('llmgw-data') - since, last('llmgw-html') - since]; }",
        [since, since + ms])
    context.close()
    return ms, int(size), came, built


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2000, help="nodes of the big fleet")
    ap.add_argument("--small", type=int, default=20, help="nodes of the yardstick fleet")
    ap.add_argument("--runs", type=int, default=3, help="runs of each view on each fleet (the median is shown)")
    ap.add_argument("--views", default=",".join(VIEWS), help="the views to measure, comma-separated (default: all)")
    args = ap.parse_args()
    views = [v for v in args.views.split(",") if v]
    unknown = sorted(set(views) - set(VIEWS))
    if unknown:
        ap.error(f"--views: no view {', '.join(unknown)} (give some of {', '.join(VIEWS)})")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    t = time.perf_counter()
    big_log, small_log = make_log(args.nodes), make_log(args.small)
    made = time.perf_counter() - t
    token = "bench-token"
    folder = Path(tempfile.mkdtemp(prefix="llmgw-console-bench-"))
    big, small = Served(big_log, token, folder / "big"), Served(small_log, token, folder / "small")
    s = big.console.state
    print(f"fleets: {args.nodes} nodes ({len(s.replicas)} replicas, {sum(len(n.used) for n in s.nodes.values())} of "
          f"{sum(len(n.gpus) for n in s.nodes.values())} GPUs used, {len(big_log)} events) and {args.small} nodes "
          f"({len(small_log)} events); logs generated through the core in {made:.1f}s")
    results: dict[tuple[str, str], list[float]] = {}
    came: dict[tuple[str, str], list[float]] = {}
    built: dict[tuple[str, str], list[float]] = {}
    sizes: dict[tuple[str, str], int] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        try:
            for _ in range(args.runs):
                for view in views:
                    for label, served in (("big", big), ("small", small)):  # alternating A/B
                        ms, size, data_at, html_at = measure(browser, served, token, view)
                        results.setdefault((view, label), []).append(ms)
                        came.setdefault((view, label), []).append(data_at)
                        built.setdefault((view, label), []).append(html_at)
                        sizes[(view, label)] = size
        finally:
            browser.close()
            big.stop()
            small.stop()
            shutil.rmtree(folder, ignore_errors=True)
    print(f"\n{'view':<12} {'first paint, ' + str(args.nodes) + ' nodes':>26} {'data in':>9} {'HTML in':>9} {'data':>9} "
          f"{'first paint, ' + str(args.small) + ' nodes':>24} {'ratio':>7}")
    for view in views:
        b = statistics.median(results[(view, "big")])
        sm = statistics.median(results[(view, "small")])
        c, h = statistics.median(came[(view, "big")]), statistics.median(built[(view, "big")])
        print(f"{view:<12} {b:>23.0f} ms {c:>6.0f} ms {h:>6.0f} ms {sizes[(view, 'big')] / 1024:>6.0f} KB {sm:>21.0f} ms {b / sm:>6.1f}x")
    print("\n(first paint: navigation start to the paint after the view is drawn, median of "
          f"{args.runs}; data in: its data fetched and parsed; HTML in: built and in the page; the rest is style, "
          "layout and paint; VIEW@past: from asking for the middle of the log; map-zoom: the map of one site; "
          "node-gpus: to the paint of the node's GPU timeline, which comes after its page)")


if __name__ == "__main__":
    main()
