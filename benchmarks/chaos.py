"""Chaos, measured: leader takeover, a rolling restart through a kill -9 of
the leader, and a 3-server NATS cluster losing its stream leader mid-burst.

    python benchmarks/chaos.py [--kills N] [--skip takeover,rolling,cluster]

Real processes only (tests/chaos_fleet.py): nats-server, `llmgw control`
(three: one leader, two standbys), simulated agents, `llmgw ctl`, a gateway.
Everything on free loopback ports, stopped by PID at the end.

  takeover   kill -9 of the leader, N times (the killed one started again
             as a standby each time), a catalog change applied right after
             each kill so that there is something to decide: seconds from
             the kill to the new leader's `leader.elected` and to its first
             decision, median and worst of N. The lease is the default
             (llmgw/control/config.py LEASE_TTL_S); the goal is <= 5 s.
  rolling    4 replicas restarted with --max-surge 1, the leader killed
             after the first replacement is placed: the fewest replicas
             ready after the restart was asked, GPUs held twice, decisions
             and commands by non-leaders, nodes falsely lost, replay --verify.
  cluster    3 nats-servers (deploy/nats/ configs, R3 streams), a burst of
             `ctl apply` and gateway requests, kill -9 of the stream leader
             of LLMGW in the middle: acknowledged applies missing from the
             log, nodes falsely lost, whether every component recovered
             by itself (a leader, an apply and a request that work after).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from llmgw.bus.server import free_port  # noqa: E402
from tests import chaos_fleet as cf  # noqa: E402


def say(text: str) -> None:
    print(text, flush=True)


def _non_leader_commands(url: str, elected_terms: set[int]) -> int:
    return sum(1 for _, c in cf.commands_sent(url) if c.term not in elected_terms)


def takeover(root: Path, kills: int) -> dict:
    server = cf.single_server(root)
    fleet = cf.Fleet(root / "fleet", server.url)
    took_elected, took_decided = [], []
    try:
        for i in range(3):
            fleet.control(f"control-{i}", lease_ttl=3.0)
        for name in ("gpu-1", "gpu-2"):
            fleet.agent(name, gpus=8)
        fleet.projector()  # `ctl apply` returns once the read models include the change
        fleet.apply(cf.catalog(2))
        cf.wait_until("2 ready", lambda: cf.ready_count(server.url) == 2, 60)
        restarts = 0
        for k in range(kills):
            leader = cf.wait_until("a leader", lambda: cf.leader_now(fleet), 30)
            cf.wait_until("two standbys", lambda: len((cf.leader_now(fleet) or {"rows": []})["rows"]) >= 3, 30)
            name = fleet.by_pid(cf.pid_of(leader["id"]))
            killed_at = fleet.kill9(name)
            fleet.apply(cf.catalog(3 if k % 2 == 0 else 2))  # something to decide

            def new_decision():
                s = cf.story(cf.records(server.url))
                el = [e for e in s.elections if e[2] != leader["id"] and e[3] >= killed_at - 0.5]
                if not el:
                    return None
                first = next((at for seq, who, at in s.decisions if who == el[0][2] and seq > el[0][0]), None)
                return (el[0][3], first) if first is not None else None

            elected, decided = cf.wait_until("the new leader's first decision", new_decision, 60, every=0.1)
            took_elected.append(elected - killed_at)
            took_decided.append(decided - killed_at)
            say(f"  kill {k + 1}: elected after {elected - killed_at:.2f}s, first decision after {decided - killed_at:.2f}s")
            restarts += 1
            fleet.control(f"{name}-again{restarts}", lease_ttl=3.0)  # back as a standby
        s = cf.story(cf.records(server.url))
        return {
            "kills": kills,
            "elected_median_s": statistics.median(took_elected), "elected_worst_s": max(took_elected),
            "takeover_median_s": statistics.median(took_decided), "takeover_worst_s": max(took_decided),
            "decisions_by_non_leaders": s.decisions_by_non_leaders,
            "commands_by_non_leaders": _non_leader_commands(server.url, {e[1] for e in s.elections}),
            "nodes_falsely_lost": len(s.nodes_lost),
        }
    finally:
        fleet.stop()
        server.stop()


def rolling(root: Path) -> dict:
    server = cf.single_server(root)
    fleet = cf.Fleet(root / "fleet", server.url)
    try:
        for i in range(3):
            fleet.control(f"control-{i}")
        for name in ("gpu-1", "gpu-2"):
            fleet.agent(name, gpus=4)
        fleet.projector()
        fleet.apply(cf.catalog(4))
        cf.wait_until("4 ready", lambda: cf.ready_count(server.url) == 4, 60)
        leader = cf.wait_until("a leader", lambda: cf.leader_now(fleet), 30)
        out = fleet.ctl("restart", "m-1", "m-2", "m-3", "m-4", "--max-surge", "1")
        restart_seq = int(re.search(r"\(event (\d+)\)", out.stdout).group(1))
        cf.wait_until("the first replacement", lambda: "m-5" in cf.fold(cf.records(server.url)).replicas, 30, every=0.1)
        killed_at = fleet.kill9(fleet.by_pid(cf.pid_of(leader["id"])))

        def restarted():
            state = cf.fold(cf.records(server.url))
            ready = {r.id for r in state.replicas.values() if r.state == "ready"}
            return len(ready) == 4 and not ready & {"m-1", "m-2", "m-3", "m-4"}

        started = time.monotonic()
        cf.wait_until("every replica replaced", restarted, 120)
        s = cf.story(cf.records(server.url), watch_from=(restart_seq,))
        new = next(e for e in s.elections if e[2] != leader["id"])
        return {
            "takeover_s": s.first_decision_of(new[2]) - killed_at,
            "restart_done_after_kill_s": time.monotonic() - started,
            "fewest_ready_during_restart": s.min_ready_after[restart_seq],
            "gpus_held_twice": len(s.gpu_twice),
            "decisions_by_non_leaders": s.decisions_by_non_leaders,
            "commands_by_non_leaders": _non_leader_commands(server.url, {e[1] for e in s.elections}),
            "nodes_falsely_lost": len(s.nodes_lost),
            "replay_verify": cf.verify(server.url, root),
        }
    finally:
        fleet.stop()
        server.stop()


def cluster(root: Path) -> dict:
    nats = cf.Cluster(root / "nats").start()
    fleet = cf.Fleet(root / "fleet", nats.url)
    gw_port = free_port()
    try:
        for i in range(2):
            fleet.control(f"control-{i}", replicas=3)
        # The control planes make the streams (R3) before anyone else may.
        cf.wait_until("a leader", lambda: fleet.ctl("get", "leader").returncode == 0, 60)
        for name in ("gpu-1", "gpu-2", "gpu-3"):
            fleet.agent(name, gpus=4)
        fleet.projector()  # `ctl apply` returns once the read models include the change
        fleet.start("gateway", "gateway", "--nats", nats.url, "--port", str(gw_port), "--listen", "127.0.0.1",
                    "--wait-timeout", "20")
        fleet.apply(cf.catalog(2))
        cf.wait_until("2 ready", lambda: cf.ready_count(nats.url) == 2, 60)
        acked: list[int] = []
        failed: list[str] = []
        answers = {"ok": 0, "failed": 0}
        stop = threading.Event()

        def traffic() -> None:
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
            while not stop.is_set():
                req = urllib.request.Request(f"http://127.0.0.1:{gw_port}/v1/chat/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=30) as r:
                        r.read()
                    answers["ok"] += 1
                except Exception:
                    answers["failed"] += 1
                time.sleep(0.05)

        t = threading.Thread(target=traffic)
        t.start()
        victim = nats.stream_leader("LLMGW")
        killed_at = None
        for i in range(30):
            if i == 10:
                nats.kill9(victim)
                killed_at = time.time()
            out = fleet.apply(cf.catalog(0, name=f"burst-{i}"))
            got = re.findall(r"\(event (\d+)\)", out.stdout)
            if out.returncode == 0:
                acked += [int(x) for x in got]
            else:
                failed.append(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}")
        # Recovered by itself: a leader, an apply, requests answered.
        cf.wait_until("a leader after", lambda: cf.leader_now(fleet), 60)
        after = cf.wait_until("an apply after", lambda: fleet.apply(cf.catalog(3)).returncode == 0, 60)
        cf.wait_until("3 ready after", lambda: cf.ready_count(nats.url) == 3, 60)
        ok_before = answers["ok"]
        cf.wait_until("requests answered after", lambda: answers["ok"] > ok_before + 3, 60)
        stop.set()
        t.join(60)
        recs = cf.records(nats.url)
        seqs = {seq for seq, _, _ in recs}
        s = cf.story(recs)
        alive = {n: p.poll() is None for n, p in fleet.procs.items()}
        return {
            "killed_stream_leader": f"nats-{victim + 1}",
            "applies_acknowledged": len(acked),
            "applies_refused_with": sorted(set(failed)),
            "acknowledged_missing_from_log": len([a for a in acked if a not in seqs]),
            "nodes_falsely_lost": len(s.nodes_lost),
            "gateway_requests_ok": answers["ok"], "gateway_requests_failed": answers["failed"],
            "components_alive": all(alive.values()), "dead": [n for n, a in alive.items() if not a],
            "recovered": bool(after),
            "decisions_by_non_leaders": s.decisions_by_non_leaders,
            "since_kill_s": time.time() - (killed_at or time.time()),
        }
    finally:
        fleet.stop()
        nats.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=5, help="takeovers to measure (default 5)")
    p.add_argument("--skip", default="", help="comma-separated: takeover, rolling, cluster")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--keep", help="run in this folder and keep it (the processes' logs)")
    args = p.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    figures = {}
    with tempfile.TemporaryDirectory(prefix="llmgw-chaos-") as tmp:
        root = Path(args.keep or tmp)
        if "takeover" not in skip:
            say(f"takeover: kill -9 of the leader, {args.kills} times")
            figures["takeover"] = takeover(root / "takeover", args.kills)
            say(json.dumps(figures["takeover"], indent=2))
        if "rolling" not in skip:
            say("rolling restart of 4 replicas (--max-surge 1), the leader killed mid-way")
            figures["rolling"] = rolling(root / "rolling")
            say(json.dumps(figures["rolling"], indent=2))
        if "cluster" not in skip:
            say("3-server cluster: kill -9 of the LLMGW stream leader mid-burst")
            figures["cluster"] = cluster(root / "cluster")
            say(json.dumps(figures["cluster"], indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
