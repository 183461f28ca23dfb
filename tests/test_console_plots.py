"""The console's plots and timelines (issue 34, parts 1 and 2), driven by
Playwright in a real headless Chromium against a real `llmgw up` with its
gateway and two simulated nodes, asked through the gateway with the official
`openai` SDK. Every value a chart draws (read from uPlot's own data arrays)
is compared with what the fold says at that time of the log
(replay.tool.fold_until over the exported log) or with the gateways' load
reports in the log; the timeline's marks with the decisions in the log, their
reasons shown on hover; a node's GPU timeline with what its GPUs hold. At
1280x800 and 390 px wide; screenshots under the module's tmp dir."""

from __future__ import annotations

import bisect
import math

# (A predicate Playwright waits for is given as a function, "() => ...": an expression it would eval, which
# the console's Content-Security-Policy refuses.)

import pytest

from llmgw.bus.server import free_port
from llmgw.core.contract import events as ev
from llmgw.core.rules.scaling import decided
from llmgw.core.folding.state import LIVE_SHARD_STATES
from llmgw.replay import logfile
from llmgw.replay.tool import fold_until

from .test_console import WAIT_MS, Fleet, location, request, shot, show

openai = pytest.importorskip("openai")
pytest.importorskip("playwright.sync_api")
# The same marks (nats, chromium), and the same browser fixture, one per module.
from .test_console import browser, pytestmark  # noqa: E402,F401

CATALOG = """
owners:
  - name: org/chat
    guarantee: {{gpus: 2}}
models:
  - name: chat
    owner: org/chat
    min_replicas: {chat}
    profiles:
      - {{name: one, gpus: 1, pool: main}}
  - name: big
    owner: org/big
    min_replicas: 1
    profiles:
      - {{name: two, gpus: 2, pool: main}}
"""
SYSTEM = "You are a careful assistant of the llmgw fleet who answers in one short sentence and never more than that"
ASKED = 12  # requests sent to chat: half streamed


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    gateway = free_port()
    f = Fleet(tmp_path_factory.mktemp("plots"), "--gateway-port", str(gateway))
    try:
        f.agent("gpu-1", location("par1", "r1", "pdu-1a"))
        f.agent("gpu-2", location("par1", "r2", "pdu-2a"))
        f.wait_for(lambda: len([n for n in f.ctl_json("nodes") if n["state"] == "ready"]) == 2, "the nodes did not register")
        for name in ("gpu-1", "gpu-2"):
            out = f.llmgw("ctl", "node", "admit", name)
            assert out.returncode == 0, out.stdout + out.stderr
        catalog = f.folder / "catalog.yaml"
        for chat in (2, 3, 2):  # placed; one more (desired 3); one fewer (one drained)
            catalog.write_text(CATALOG.format(chat=chat))
            out = f.llmgw("ctl", "apply", "-f", str(catalog), "--wait", "--timeout", "90")
            assert out.returncode == 0, out.stdout + out.stderr
            if chat == 2 and not hasattr(f, "asked"):
                f.gateway = f"http://127.0.0.1:{gateway}/v1"
                f.asked = ask(f.gateway)
        # The gateway's reports of those requests are in the log (the last says zero in flight).
        f.wait_for(lambda: sum(e.get("requests", 0) for e in f.log() if e["type"] == "model.load" and e["model"] == "chat")
                   == ASKED, "the gateway did not report the requests", timeout=60)
        f.shots = f.folder / "screenshots"
        f.shots.mkdir()
        yield f
    finally:
        f.stop()


def ask(base_url: str) -> list:
    """ASKED questions with one long system prompt (the engines find it in their cache after the first)."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=60, max_retries=0)
    said = []
    for i in range(ASKED):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"question number {i}?"}]
        if i % 2:
            stream = client.chat.completions.create(model="chat", messages=messages, stream=True, max_tokens=16)
            said.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        else:
            answer = client.chat.completions.create(model="chat", messages=messages, max_tokens=16)
            said.append(answer.choices[0].message.content)
    assert all(said), said
    return said


def opened(browser, fleet, width: int = 1280, height: int = 800, **kw):
    context = browser.new_context(viewport={"width": width, "height": height}, **kw)
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.goto(fleet.url)
    pg.wait_for_selector("body[data-painted]")
    return context, pg


@pytest.fixture
def page(browser, fleet):
    context, pg = opened(browser, fleet)
    yield pg
    context.close()
    assert not pg.errors, pg.errors


def records(fleet) -> list[tuple[int, str, bytes]]:
    path = fleet.folder / "plots-log.jsonl"
    out = fleet.llmgw("replay", "--export", str(path))
    assert out.returncode == 0, out.stderr
    return logfile.read(path)


def drawn(pg) -> dict:
    """Every chart's data as uPlot holds it (x first), and the slider's line, from one response."""
    return pg.evaluate("""() => Object.fromEntries(Object.entries(window.llmgwCharts).map(([id, u]) =>
        [id, {data: u.data.map((s) => Array.from(s)), labels: u.series.slice(1).map((s) => s.label), at: u.llmgwAt,
              width: u.width}]))""")


def log_times(recs) -> list[float]:
    """Each event's time as the log goes: never back (as the console and fold_until count it)."""
    out, t = [], 0.0
    for _, _, data in recs:
        t = max(t, ev.decode(data).at)
        out.append(t)
    return out


# --------------------------------------------------------------------------- plots


def test_each_plot_draws_the_fleets_real_data(page, fleet):
    show(page, "plots/chat")
    page.wait_for_selector('figure[data-plot="owners"] canvas')
    charts = drawn(page)
    recs = records(fleet)
    assert set(charts) == {"replicas", "requests", "queued", "ttft", "prefix", "tokens", "owners", "usage"}
    x = charts["replicas"]["data"][0]
    assert len(x) == 121 and all(c["data"][0] == x for c in charts.values())
    assert x[0] == pytest.approx(ev.decode(recs[0][2]).at, abs=1e-3)

    # Steps: as the fold has them at each time of the chart.
    ready, desired = charts["replicas"]["data"][1:]
    queued, in_flight = charts["queued"]["data"][1:]
    owners = dict(zip(charts["owners"]["labels"], charts["owners"]["data"][1:]))
    assert set(owners) == {"org/chat", "org/big"}
    for i, t in enumerate(x):
        then = fold_until(recs, ("time", t))
        chat = then.models.get("chat")
        assert ready[i] == sum(1 for r in then.replicas.values() if r.model == "chat" and r.state == "ready"), (i, t)
        assert desired[i] == (decided(chat) if chat else 0), (i, t)
        assert queued[i] == (sum(lo.queued for lo in chat.load.values()) if chat else 0), (i, t)
        assert in_flight[i] == (sum(lo.in_flight for lo in chat.load.values()) if chat else 0), (i, t)
        for owner, gpus in owners.items():
            held = sum(len(s.gpus) for r in then.replicas.values() if r.owner == owner
                       for s in r.shards if s.state in LIVE_SHARD_STATES)
            assert gpus[i] == held, (owner, i, t)
    assert max(desired) == 3 and desired[-1] == 2 and ready[-1] == 2 and max(ready) == 3
    assert owners["org/big"][-1] == 2 and owners["org/chat"][-1] == 2

    # Rates and ratios: the gateway's load reports in the log, bucket by bucket.
    times = log_times(recs)
    loads = [(times[i], ev.decode(d)) for i, (_, s, d) in enumerate(recs) if b'"model.load"' in d]
    loads = [(t, e) for t, e in loads if e.model == "chat"]
    assert sum(e.requests for _, e in loads) == ASKED and sum(e.tokens_cached for _, e in loads) > 0
    at = [t for t, _ in loads]
    series = {k: charts[c]["data"][1 + n] for c, keys in (("requests", ["requests_s"]), ("ttft", ["p50", "p90"]),
                                                          ("prefix", ["prefix_hit"]), ("tokens", ["in", "out"]))
              for n, k in enumerate(keys)}
    for i in range(1, len(x)):
        a = bisect.bisect_left(at, x[0]) if i == 1 else bisect.bisect_right(at, x[i - 1])
        b = bisect.bisect_right(at, x[i])
        got = [e for _, e in loads[a:b]]
        width = x[i] - x[i - 1]
        assert series["requests_s"][i] == pytest.approx(sum(e.requests for e in got) / width, rel=1e-3, abs=1e-3), i
        assert series["out"][i] == pytest.approx(sum(e.tokens_out for e in got) / width, rel=1e-3, abs=1e-3), i
        tin = sum(e.tokens_in for e in got)
        assert series["in"][i] == pytest.approx(tin / width, rel=1e-3, abs=1e-3), i
        hit = sum(e.tokens_cached for e in got) / tin if tin else None
        assert series["prefix_hit"][i] == (pytest.approx(hit, abs=1e-4) if hit is not None else None), i
        timed = [(max(e.requests, 1), e.ttft_p50, e.ttft_p90) for e in got if e.ttft_p50 > 0]
        w = sum(n for n, _, _ in timed)
        for k, j in (("p50", 1), ("p90", 2)):
            want = sum(n * p[j - 1] for n, *p in timed) / w if w else None
            assert series[k][i] == (pytest.approx(want, abs=1e-4) if want is not None else None), (k, i)
    assert sum(r * (x[i] - x[i - 1]) for i, r in enumerate(series["requests_s"]) if i) == pytest.approx(ASKED, abs=0.05)
    hits = [h for h in series["prefix_hit"] if h is not None]
    assert hits and max(hits) > 0 and all(0 <= h <= 1 for h in hits)
    assert [p for p in series["p50"] if p is not None] and all(0 < p < 60 for p in series["p50"] if p is not None)
    # Tokens per owner: the gateways' usage reports of the model (every --usage-interval), all of them.
    usage = dict(zip(charts["usage"]["labels"], charts["usage"]["data"][1:]))
    reported = sum(r.tokens_in + r.tokens_out for _, _, d in recs if b'"usage.reported"' in d
                   for r in ev.decode(d).rows if r.model == "chat")
    drawn_tokens = sum(v * (x[i] - x[i - 1]) for vals in usage.values() for i, v in enumerate(vals) if i)
    assert drawn_tokens == pytest.approx(reported, abs=0.5)
    shot(page, fleet, "plots")

    # Another model: its own series, the same owners.
    page.select_option("#p-model", "big")
    page.wait_for_selector("main h2:has-text('Plots: big')")
    page.wait_for_function("() => window.llmgwCharts.replicas && window.llmgwCharts.replicas.data[1].at(-1) === 1")
    assert drawn(page)["requests"]["data"][1][1:] == [0] * 120  # never asked


def test_a_click_on_a_chart_moves_the_slider_there_and_a_drag_narrows_the_window(page, fleet):
    show(page, "plots/chat")
    page.wait_for_selector('figure[data-plot="replicas"] canvas')
    box = page.locator('figure[data-plot="replicas"] .u-over').bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    page.wait_for_selector("#live:has-text('at event')")
    page.wait_for_function("() => window.llmgwCharts.replicas && window.llmgwCharts.replicas.llmgwAt !== null")
    charts = drawn(page)
    x = charts["replicas"]["data"][0]
    seq = int(page.get_attribute("main", "data-seq"))
    assert x[0] < charts["replicas"]["at"] <= x[-1]
    said = page.inner_text("#atsaid")
    assert f"at event {seq}" in said
    shot(page, fleet, "plots-past")
    page.click("#golive")
    page.wait_for_selector("#live:has-text('live')")
    # A drag across the middle: the window is that stretch, for every chart.
    page.mouse.move(box["x"] + box["width"] * 0.25, box["y"] + 20)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + 20, steps=5)
    page.mouse.up()
    page.wait_for_selector("#p-whole")
    page.wait_for_function(f"() => window.llmgwCharts.replicas.data[0][0] > {x[0] + 1}")
    narrow = drawn(page)["replicas"]["data"][0]
    assert x[0] < narrow[0] < narrow[-1] < x[-1]
    page.click("#p-whole")
    page.wait_for_selector("#p-whole", state="detached")


# --------------------------------------------------------------------------- timeline


def test_the_timeline_has_a_lane_per_model_with_each_reason_on_hover_and_moves_the_slider(page, fleet):
    show(page, "timeline")
    recs = records(fleet)
    decisions = [(seq, ev.decode(d)) for seq, _, d in recs if b'"control.decided"' in d]
    places = {m: [(seq, a) for seq, e in decisions for a in e.actions if isinstance(a, ev.PlaceReplica) and a.model == m]
              for m in ("chat", "big")}
    drains = [(seq, a) for seq, e in decisions for a in e.actions if isinstance(a, ev.StopReplica) and a.replica.startswith("chat-")]
    assert len(places["chat"]) >= 3 and drains
    def marks(model: str, kind: str) -> list[tuple[int, int]]:
        # (event, how many) of each mark: those of a kind within a thousandth of the window are one
        return page.locator(f'.tl-lane[data-lane="{model}"] .tl-mark[data-kind="{kind}"]').evaluate_all(
            "ms => ms.map(m => [Number(m.dataset.seq), Number(m.dataset.n)])")

    for model in ("chat", "big"):
        assert page.locator(f'.tl-lane[data-lane="{model}"]').count() == 1
        placed = marks(model, "placed")
        assert sum(n for _, n in placed) == len(places[model])
        assert {seq for seq, _ in placed} <= {seq for seq, _ in places[model]}
        assert sum(n for _, n in marks(model, "ready")) == len(places[model])  # each placed one came up
    assert sum(n for _, n in marks("chat", "drained")) == len(drains)
    shot(page, fleet, "timeline")

    # Hover: what happened and why, as the decision says.
    seq, place = places["chat"][-1]  # the third replica, placed alone
    mark = page.locator(f'.tl-lane[data-lane="chat"] .tl-mark[data-kind="placed"][data-seq="{seq}"]').first
    mark.hover()
    page.wait_for_selector(f'#tl-tip[data-seq="{seq}"]')
    tip = page.inner_text("#tl-tip")
    assert f"placed {place.replica}" in tip and place.reason in tip and f"event {seq}" in tip
    seq, stop = drains[-1]
    page.locator(f'.tl-lane[data-lane="chat"] .tl-mark[data-kind="drained"][data-seq="{seq}"]').first.hover()
    page.wait_for_selector(f'#tl-tip[data-seq="{seq}"]')
    assert stop.reason in page.inner_text("#tl-tip")
    shot(page, fleet, "timeline-hover")

    # A click: the slider goes to that decision, and a line marks it across the lanes.
    page.locator(f'.tl-lane[data-lane="chat"] .tl-mark[data-kind="drained"][data-seq="{seq}"]').first.click()
    page.wait_for_selector(f'main[data-seq="{seq}"]')
    page.wait_for_selector(".tl-cursor")
    assert page.locator(".tl-cursor").count() == 2  # a line per lane
    assert page.input_value("#slider") == str(seq) and f"at event {seq}" in page.inner_text("#atsaid")
    assert str(stop.replica) in page.text_content("#pointdecision")  # the decision at that point, with its facts
    shot(page, fleet, "timeline-past")


def test_a_node_page_shows_what_its_gpus_held(page, fleet):
    recs = records(fleet)
    state = fold_until(recs, None)
    node = max(state.nodes.values(), key=lambda n: len(n.used)).name
    show(page, f"node/{node}")
    page.wait_for_selector(f'#gputimeline[data-node="{node}"] .tl-lane')
    lanes = page.locator("#gputimeline .tl-lane[data-gpu]")
    assert lanes.count() == len(state.nodes[node].gpus)
    now = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#gputimeline .tl-lane[data-gpu]')].map((l) =>
        [l.dataset.gpu, [...l.querySelectorAll('.tl-seg')].map((s) => [s.dataset.replica, Number(s.dataset.to)])]))""")
    ends = max(to for segs in now.values() for _, to in segs)
    # What each GPU holds now is its last segment, open to the window's end; every replica it ever held is there.
    for g in state.nodes[node].gpus:
        holder = state.nodes[node].used.get(g.index)
        if holder:
            assert now[str(g.index)][-1] == [holder.rpartition(".")[0], ends], g.index
    placed_here = {a.replica for _, _, d in recs if b'"control.decided"' in d for a in ev.decode(d).actions
                   if isinstance(a, ev.PlaceReplica) and any(s.node == node for s in a.shards)}
    assert {r for segs in now.values() for r, _ in segs} == placed_here
    shot(page, fleet, "node-gpus")


# --------------------------------------------------------------------------- narrow screens, no token


def test_a_phone_sized_screen_shows_the_plots_and_timelines_without_breaking(browser, fleet):
    context, pg = opened(browser, fleet, 390, 844, is_mobile=True)
    try:
        for view in ("plots/chat", "timeline", "node/gpu-1"):
            show(pg, view)
            if view.startswith("plots"):
                pg.wait_for_selector('figure[data-plot="owners"] canvas')
                charts = drawn(pg)
                assert len(charts) == 8 and all(0 < c["width"] <= 390 for c in charts.values())
                assert charts["replicas"]["data"][1][-1] == 2
            if view.startswith("node"):
                pg.wait_for_selector("#gputimeline .tl-lane")
            assert pg.evaluate("document.documentElement.scrollWidth") <= 390 + 1, view
            pg.screenshot(path=str(fleet.shots / f"phone-{view.split('/')[0]}.png"), full_page=True)
        assert not pg.errors, pg.errors
    finally:
        context.close()


def test_the_plots_and_timelines_need_the_token(fleet):
    for path in ("/api/plots?model=chat", "/api/timeline", "/api/gpus/gpu-1", "/static/plots.js"):
        status, body = request(fleet, path)
        assert status == 401 and b"chat" not in body and b"gpu-1" not in body, path
    status, body = request(fleet, "/api/plots?model=nope", headers={"Cookie": f"llmgw_console={fleet.token}"})
    assert status == 404 and b"no model nope" in body
    status, body = request(fleet, "/api/plots?from=x", headers={"Cookie": f"llmgw_console={fleet.token}"})
    assert status == 400 and b"is not Unix seconds" in body
    assert math.isfinite(float(__import__("json").loads(request(fleet, "/api/timeline", headers={
        "Cookie": f"llmgw_console={fleet.token}"})[1])["to"]))


def test_the_plots_follow_the_log_in_the_same_charts(page, fleet):
    """(Last: it asks once more.) Drawn anew, a chart would lose the pointer's drag and flicker at every event."""
    show(page, "plots/chat")
    page.wait_for_selector('figure[data-plot="requests"] canvas')
    before = drawn(page)["requests"]["data"]
    page.evaluate("window.__requests = window.llmgwCharts.requests")
    client = openai.OpenAI(base_url=fleet.gateway, api_key="unused", timeout=60, max_retries=0)
    assert client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "one more?"}]).choices
    page.wait_for_function(f"() => window.llmgwCharts.requests.data[0].at(-1) > {before[0][-1]} && "
                           "window.llmgwCharts.requests.data[1].some((r, i) => i && r > 0)")
    page.wait_for_function("() => window.__requests === window.llmgwCharts.requests")
    after = drawn(page)["requests"]["data"]
    x = after[0]
    counted = sum(r * (x[i] - x[i - 1]) for i, r in enumerate(after[1]) if i)
    assert counted == pytest.approx(ASKED + 1, abs=0.05) or counted == pytest.approx(ASKED, abs=0.05)  # (its report may lag)
    assert page.evaluate("document.querySelectorAll('figure[data-plot=\"requests\"] canvas').length") == 1
