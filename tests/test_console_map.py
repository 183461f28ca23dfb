"""The console's Map view and the fixes of issue 34 (part 3 and the console's
part of 4), driven by Playwright in Debian's headless Chromium against a real
`llmgw up` with simulated nodes: three GPU nodes in two racks and a CPU-only
node `vm` with no location (as the demo's), running a GPU model and a model
on the CPU alone.

The map: every node a cell of its domain's heat map (the pixels are read back
and checked against the fleet's use), CPU-only nodes and models shown, a click
zooms into a domain; a node page lists what runs there now; the label action's
banner says that nothing needs to follow; the slider's box follows the
slider; a restart asks first (dismissed: nothing published); the page has a
favicon (no 404). At 1280x800 and 390 px wide; screenshots under the module's
tmp dir."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.test_console import CHROMIUM, WAIT_MS, Fleet, location, request, show
from tests.test_console import browser  # noqa: F401 - the module's browser fixture

playwright_api = pytest.importorskip("playwright.sync_api")
pytestmark = [
    pytest.mark.nats,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no chromium (.ci/run installs it)"),
]

CATALOG = """
models:
  - name: chat
    min_replicas: 2
    profiles:
      - {name: one, gpus: 1, pool: main}
  - name: tiny
    min_replicas: 1
    profiles:
      - {name: cpu, gpus: 0, cpu_cores: 2, memory_gb: 4, pool: cpu}
"""
# The CPU-only node: no GPU, 8 cores, no location label (the demo's `vm`).
VM = "nodes:\n  - name: vm\n    gpus: 0\n    cpu_cores: 8\n    memory_gb: 32\n    labels: {llmgw.io/pool: cpu}\n"
NODES = ("gpu-1", "gpu-2", "gpu-3", "vm")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = Fleet(tmp_path_factory.mktemp("console-map"))
    try:
        f.agent("gpu-1", location("par1", "r1", "pdu-1a"))
        f.agent("gpu-2", location("par1", "r1", "pdu-1a"))
        f.agent("gpu-3", location("par1", "r2", "pdu-2a"))
        (f.folder / "vm.yaml").write_text(VM)
        with open(f.folder / "vm.log", "wb") as log:  # a fleet file: a single simulated agent has no cores
            f.procs.append(subprocess.Popen(
                [sys.executable, "-m", "llmgw", "agent", "--simulate", "--fleet-file", str(f.folder / "vm.yaml")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=f.folder, start_new_session=True,
            ))  # fmt: skip
        f.wait_for(lambda: len([n for n in f.ctl_json("nodes") if n["state"] == "ready"]) == 4, "the nodes did not register")
        for name in NODES:
            out = f.llmgw("ctl", "node", "admit", name)  # the pools their agent files claim (core/rules/admission.py)
            assert out.returncode == 0, out.stdout + out.stderr
        (f.folder / "catalog.yaml").write_text(CATALOG)
        out = f.llmgw("ctl", "apply", "-f", str(f.folder / "catalog.yaml"))
        assert out.returncode == 0, out.stderr

        def ready() -> bool:
            return {"chat-1", "chat-2", "tiny-1"} <= {r["id"] for r in f.ctl_json("replicas") if r["state"] == "ready"}

        f.wait_for(ready, "chat and tiny were not placed and ready", timeout=90)
        f.shots = f.folder / "screenshots"
        f.shots.mkdir()
        yield f
    finally:
        f.stop()


@pytest.fixture(params=[(1280, 800), (390, 844)], ids=["desktop", "phone"])
def page(request, browser, fleet):  # noqa: F811
    width, height = request.param
    context = browser.new_context(viewport={"width": width, "height": height}, is_mobile=width < 500)
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    missing: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    pg.goto(fleet.url)
    pg.wait_for_selector('body[data-painted="map"]')  # the landing view
    pg.width, pg.tag = width, "desktop" if width > 500 else "phone"
    yield pg
    context.close()
    assert not errors, errors
    assert not missing, f"404s in the console's network log: {missing}"


def shot(pg, fleet, name: str) -> None:
    pg.screenshot(path=str(fleet.shots / f"{name}-{pg.tag}.png"), full_page=True)


def cells(pg) -> dict[str, dict]:
    """node -> its cell as drawn: the tile's domain and the pixel at the cell's middle (r, g, b)."""
    return pg.evaluate("""() => {
      const out = {};
      for (const c of document.querySelectorAll('#fleetmap canvas.fm-cells')) {
        const size = Number(c.dataset.size), cols = Number(c.dataset.cols), ratio = c.width / c.clientWidth;
        const cx = c.getContext('2d');
        c.dataset.nodes.split(' ').filter(Boolean).forEach((n, i) => {
          const x = ((i % cols) * (size + 1) + size / 2) * ratio, y = (Math.floor(i / cols) * (size + 1) + size / 2) * ratio;
          const [r, g, b] = cx.getImageData(Math.floor(x), Math.floor(y), 1, 1).data;
          out[n] = {domain: c.closest('.fm-tile').dataset.domain || '', rgb: [r, g, b]};
        });
      }
      return out;
    }""")


def wait_map(pg, zoom: str) -> None:
    """Until the map is drawn zoomed to `zoom` (its hash)."""
    pg.wait_for_selector(f'#fleetmap[data-zoom-at="{zoom}"] canvas.fm-cells[data-nodes]')


def no_overflow(pg) -> None:
    assert pg.evaluate("document.documentElement.scrollWidth") <= pg.width + 1


# --------------------------------------------------------------------------- the map


def test_the_map_shows_every_node_coloured_by_use_with_cpu_only_nodes_and_models(page, fleet):
    got = cells(page)
    assert set(got) == set(NODES)
    # Grouped by site: par1's three nodes in one tile, the vm (no location) in another.
    assert {n: c["domain"] for n, c in got.items()} == {"gpu-1": "site/par1", "gpu-2": "site/par1", "gpu-3": "site/par1", "vm": ""}
    assert "no site" in page.inner_text("#fleetmap")
    # The colours are the fleet's use: a GPU node with chat on it blue (more used, darker), an idle one grey,
    # the CPU-only node purple (its cores, tiny's 2 of 8).
    used = {n["name"]: n["gpus_used"] for n in fleet.ctl_json("nodes")}
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        r, g, b = got[name]["rgb"]
        if used[name]:
            assert b > r and b > g and b > 150, (name, got[name])  # blue
        else:
            assert (r, g, b) == (229, 231, 235), (name, got[name])  # idle grey (#e5e7eb)
    r, g, b = got["vm"]["rgb"]
    assert r > g and b > g, got["vm"]  # purple: a CPU-only node in use
    # The models, GPU and CPU alike, in the list and on the nodes' cards.
    models = page.inner_text(".fm-models")
    assert "chat" in models and "2 GPU(s)" in models
    assert "tiny" in models and "CPU on 1 node(s)" in models
    vm = page.inner_text('.fm-card[data-node="vm"]')
    assert "no GPU" in vm and "tiny (CPU)" in vm and "cpu 2/8" in vm
    for name, n in used.items():
        if name != "vm":
            assert page.get_attribute(f'.fm-card[data-node="{name}"]', "data-gpus-used") == str(n)
    # A cell says in words what it shows (its title, on hover).
    page.hover('.fm-tile:not([data-domain]) canvas.fm-cells', position={"x": 4, "y": 4})
    assert "vm" in page.get_attribute(".fm-tile:not([data-domain]) canvas.fm-cells", "title")
    assert "tiny (CPU)" in page.get_attribute(".fm-tile:not([data-domain]) canvas.fm-cells", "title")
    no_overflow(page)
    shot(page, fleet, "map")
    # The Fleet view shows the model on the CPU-only node too (it had only "cpu 2/8 mem 4/32G").
    show(page, "fleet")
    assert "tiny (CPU)" in page.inner_text('.n[data-node="vm"]')


def test_a_click_on_a_domain_zooms_into_it(page, fleet):
    page.click('.fm-tile[data-domain="site/par1"]')
    wait_map(page, "#map/site=par1")
    got = cells(page)
    # par1's nodes only, by rack now (one room, one row: no click through them).
    assert {n: c["domain"] for n, c in got.items()} == {"gpu-1": "rack/r1", "gpu-2": "rack/r1", "gpu-3": "rack/r2"}
    assert "room hall-1" in page.inner_text(".fm-crumbs")
    shot(page, fleet, "map-site")
    page.click('.fm-tile[data-domain="rack/r1"]')
    wait_map(page, "#map/site=par1/rack=r1")
    assert set(cells(page)) == {"gpu-1", "gpu-2"}
    assert sorted(page.locator(".fm-card").evaluate_all("cs => cs.map(c => c.dataset.node)")) == ["gpu-1", "gpu-2"]
    assert "rack r1" in page.inner_text(".fm-crumbs") and "2 node(s)" in page.inner_text("main h2")
    no_overflow(page)
    shot(page, fleet, "map-rack")
    # Back out, by the trail.
    page.click('.fm-crumbs a[href="#map"]')
    wait_map(page, "#map")
    assert set(cells(page)) == set(NODES)


def test_a_node_page_lists_what_runs_there_now(page, fleet):
    tiny = next(r for r in fleet.ctl_json("replicas") if r["id"] == "tiny-1")
    page.click('.fm-card[data-node="vm"] a')
    page.wait_for_selector('main[data-view="node"] tr[data-replica="tiny-1"]')
    row = page.inner_text('tr[data-replica="tiny-1"]')
    port = tiny["endpoint"].rsplit(":", 1)[1]
    assert "tiny" in row and "ready" in row and port in row and "CPU only" in row and "2 core(s)" in row, row
    chat = next(r for r in fleet.ctl_json("replicas") if r["id"] == "chat-1")
    show(page, f"node/{chat['nodes'][0]}")
    row = page.inner_text('tr[data-replica="chat-1"]')
    assert "chat" in row and "ready" in row and "GPU " in row and chat["endpoint"].rsplit(":", 1)[1] in row, row
    no_overflow(page)
    shot(page, fleet, "node-running")


# --------------------------------------------------------------------------- the fixes


def test_the_label_banner_says_that_nothing_needs_to_follow(page, fleet):
    if page.tag == "phone":
        pytest.skip("one label change is enough (the desktop run)")
    show(page, "node/gpu-3")
    page.fill('#labelform input[name="rack"]', "r3")
    page.click('#labelform button[type="submit"]')
    page.wait_for_selector('#actionsaid [data-follow]:not([data-follow="pending"])')
    said = page.inner_text("#actionsaid")
    assert page.get_attribute("#actionsaid [data-follow]", "data-follow") == "nothing", said
    assert "No decision needs to follow" in said and "waiting" not in said
    shot(page, fleet, "label-banner")


def test_the_sliders_box_follows_the_slider(page, fleet):
    last = int(page.get_attribute("#slider", "max"))
    point = max(1, last // 2)
    page.fill("#slider", str(point))  # sets the range and fires its input and change
    page.wait_for_selector(f'main[data-seq="{point}"]')
    assert page.input_value("#atbox") == str(point)
    page.fill("#slider", str(point + 1))
    assert page.input_value("#atbox") == str(point + 1)
    page.click("#golive")
    page.wait_for_selector("#live:has-text('live')")
    assert page.input_value("#atbox") == ""


def test_a_restart_asks_first_and_a_no_publishes_nothing(page, fleet):
    if page.tag == "phone":
        pytest.skip("the desktop run restarts")
    show(page, "replicas")
    target = next(r["id"] for r in fleet.ctl_json("replicas") if r["model"] == "chat" and r["state"] == "ready")
    before = fleet.log()[-1]["seq"]
    asked: list[str] = []

    def dismiss(d):
        asked.append(d.message)
        d.dismiss()

    page.once("dialog", dismiss)
    page.click(f'button[data-restart="{target}"]')
    page.wait_for_function("() => true")
    assert asked and target in asked[0]
    assert page.is_hidden("#actionsaid")
    assert not [e for e in fleet.log() if e["seq"] > before and e["type"] == "replicas.restart"]
    page.once("dialog", lambda d: d.accept())
    page.click(f'button[data-restart="{target}"]')
    page.wait_for_selector("#actionsaid [data-follow]:not([data-follow=\"pending\"])")
    assert page.get_attribute("#actionsaid [data-follow]", "data-follow") == "followed", page.inner_text("#actionsaid")
    assert "chat" in page.inner_text("#actionsaid .followed")
    event = next(e for e in reversed(fleet.log()) if e["type"] == "replicas.restart")
    assert event["replicas"] == [target]


def test_the_page_has_a_favicon(page, fleet):
    href = page.get_attribute('link[rel="icon"]', "href")
    assert href == "/static/favicon.svg"
    status = page.evaluate("h => fetch(h).then(r => r.status)", href)
    assert status == 200
    status, body = request(fleet, "/favicon.ico")  # asked without the token: an icon, nothing of the fleet
    assert status == 200 and body.startswith(b"<svg")
