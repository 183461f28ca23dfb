"""`llmgw`: one command, a subcommand per component.

    llmgw up                 embedded NATS, control plane, projector, an agent, the demo model and a gateway
    llmgw control            the control plane alone, against a NATS you run
    llmgw agent              the node agent: runs this node's inference engines
    llmgw agent --simulate   a simulated node
    llmgw gateway            the OpenAI API, routed to ready replicas
    llmgw ctl apply -f FILE  publish a catalog; get, describe: read the read models
    llmgw projections rebuild  make the read models afresh from the log
    llmgw creds issue|list|revoke  the bus credentials of nodes, gateways, operators
    llmgw replay [FILE]      fold the log and look at any moment of it
    llmgw events schema      write or check the event contract files
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from ..ctl.locate import DEFAULT_NATS, locate


def _nats_url(args) -> str:
    """--nats, else $LLMGW_NATS, else the local `llmgw up`'s, else the default port."""
    return locate(args.nats).nats


def _creds(args):
    """The tools' credential: --creds, else $LLMGW_CREDS, else the local `llmgw up`'s (bus/auth.py)."""
    return locate(args.nats, creds=args.creds).creds


def _component(args, role: str, name: str | None) -> str | None:
    """A component's credential (args.creds) and the name it speaks as; exit 3 if they disagree."""
    from ..bus.auth import CredentialError, component_creds
    from ..ctl.locate import find_state_dir

    try:
        creds, name = component_creds(args.creds, role, name, state_dir=find_state_dir())
    except CredentialError as e:
        print(f"llmgw {args.command}: {e}", file=sys.stderr)
        sys.exit(3)
    args.creds = str(creds) if creds else None
    return name


def _setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


def _run_until_signalled(main_coro_factory) -> None:
    """Run an async service until SIGINT or SIGTERM, then let it stop cleanly."""

    from ..bus import auth

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        auth.when_refused(stop.set)  # a credential revoked while running: stop, then exit 3
        await main_coro_factory(stop)

    try:
        asyncio.run(runner())
    except (auth.CredentialRefused, auth.CredentialError) as e:
        print(f"llmgw: {e}", file=sys.stderr)
        sys.exit(3)
    except Exception as e:  # one line for people; the traceback with -v
        logging.getLogger("llmgw").debug("fatal", exc_info=True)
        if auth.refused():  # what the connection closing made fail
            print(f"llmgw: {auth.refused()}", file=sys.stderr)
            sys.exit(3)
        if isinstance(e, (ConnectionError, LookupError, TimeoutError)):
            sys.exit(f"llmgw: {e}")
        sys.exit(f"llmgw: {type(e).__name__}: {e}")
    if auth.refused():
        print(f"llmgw: {auth.refused()}", file=sys.stderr)
        sys.exit(3)


# ----------------------------------------------------------------- subcommands


def cmd_up(args) -> None:
    from .up import up

    sys.exit(
        up(
            state_dir=args.state_dir,
            nats_port=args.nats_port,
            nats_url=args.nats,
            agent=not args.no_agent,
            demo=not args.no_demo,
            agent_file=args.agent_file,
            node_name=args.name,
            gateway_port=None if args.no_gateway else args.gateway_port,
        )  # always with auth: bus/auth.py, under <state dir>/creds
    )


def cmd_control(args) -> None:
    from ..bus.nats import NatsBus
    from ..control.plane import ControlPlane
    from ..control.snapshots import SnapshotStore

    from ..telemetry import setup

    _component(args, "control", "control")
    _setup_logging(args.verbose)
    setup("llmgw-control")

    async def main(stop: asyncio.Event) -> None:
        bus = await NatsBus.connect(_nats_url(args), name="llmgw-control", forever=True, replicas=args.stream_replicas, creds=args.creds)
        snapshots = SnapshotStore(os.path.join(args.state_dir, "control", "snapshot.msgpack"))
        plane = ControlPlane(bus, snapshots=snapshots, node_grace=args.node_grace)
        try:
            await plane.run(stop)
        finally:
            await bus.close()

    _run_until_signalled(main)


def cmd_gateway(args) -> None:
    import re
    import socket

    from ..bus.nats import NatsBus
    from ..gateway.server import Gateway
    from ..telemetry import setup

    name = args.name
    if name is None and not (args.creds or os.environ.get("LLMGW_CREDS")):
        name = re.sub(r"[^A-Za-z0-9_-]", "-", f"{socket.gethostname().split('.')[0]}-{args.port}")[:64]
    name = _component(args, "gateway", name)  # a gateway's credential names it
    if not re.match(r"^[A-Za-z0-9_-]{1,64}$", name):
        sys.exit(f"llmgw gateway: a gateway name is letters, digits, _ and - (at most 64), not {name!r}")
    _setup_logging(args.verbose)
    setup("llmgw-gateway")
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass

    async def main(stop: asyncio.Event) -> None:
        bus = await NatsBus.connect(_nats_url(args), name=f"llmgw-gateway-{name}", forever=True, creds=args.creds)
        gateway = Gateway(
            bus, name=name, port=args.port, host=args.host, wait_s=args.wait_timeout,
            upstream_timeout=args.upstream_timeout,
        )  # fmt: skip
        try:
            await gateway.run(stop)
        finally:
            await bus.close()

    _run_until_signalled(main)


def default_node_name() -> str:
    """This machine's host name, as a node name (letters, digits, _ and -)."""
    import re
    import socket

    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0])[:64]
    return name or "node"


def cmd_agent(args) -> None:
    if not args.simulate and not args.name and not (args.creds or os.environ.get("LLMGW_CREDS")):
        args.name = default_node_name()
    args.name = _component(args, "agent", args.name)  # an agent's credential names its node
    if not args.simulate:
        return cmd_real_agent(args)
    if not args.name:
        sys.exit("llmgw agent: a simulated node needs --name")
    from ..agent.simulated import SimulatedAgent
    from ..bus.nats import NatsBus

    _setup_logging(args.verbose)

    async def main(stop: asyncio.Event) -> None:
        bus = await NatsBus.connect(_nats_url(args), name=f"llmgw-agent-{args.name}", forever=True, creds=args.creds)
        agent = SimulatedAgent(
            bus,
            args.name,
            args.gpus,
            gpu_memory_gb=args.gpu_memory,
            loading_after=args.loading_after,
            ready_after=args.ready_after,
            fail_models=frozenset(args.fail_model),
        )

        # Tests and demos make a shard fail on request: a core NATS request
        # on llmgw.sim.<node>.fail with the shard id as its body.
        async def on_fail(msg) -> None:
            ok = await agent.fail(msg.data.decode(), "failed on request")
            await msg.respond(b"failed" if ok else b"no such shard running")

        sub = await bus.nc.subscribe(f"llmgw.sim.{args.name}.fail", cb=on_fail)
        try:
            await agent.run(stop)
        finally:
            await sub.unsubscribe()
            await bus.close()

    _run_until_signalled(main)


def cmd_real_agent(args) -> None:
    from pathlib import Path

    from ..agent import agentfile
    from ..agent.node import NodeAgent, StateDirTaken
    from ..bus.auth import CredentialRefused
    from ..bus.nats import NatsBus
    from ..core.catalog import NAME_RE

    name = args.name or default_node_name()
    if not NAME_RE.match(name):
        sys.exit(f"llmgw agent: a node name is letters, digits, _ and - (at most 64), not {name!r}")
    try:
        agent_file = agentfile.load(args.agent_file)
    except agentfile.AgentFileError as e:
        print(f"llmgw agent: {e}", file=sys.stderr)
        sys.exit(2)
    state_dir = Path(args.state_dir or os.path.join(".llmgw", f"agent-{name}"))
    _setup_logging(args.verbose)
    log = logging.getLogger("llmgw.agent")
    url, creds = _nats_url(args), args.creds

    async def main(stop: asyncio.Event) -> None:
        # NATS may not be up yet (a node booting before it): wait for it, forever.
        delay = 0.5
        while True:
            try:
                bus = await NatsBus.connect(url, name=f"llmgw-agent-{name}", forever=True, creds=creds)
                break
            except CredentialRefused:
                raise  # waiting does not help: exit 3, saying which credential
            except ConnectionError as e:
                log.warning("%s; trying again in %gs", e, delay)
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    return
                except asyncio.TimeoutError:
                    delay = min(delay * 2, 5.0)
        agent = NodeAgent(
            bus,
            name,
            state_dir=state_dir,
            agent_file=agent_file,
            stop_engines_on_exit=args.stop_engines_on_exit,
            model_dirs=(state_dir / "models", state_dir.parent / "models"),
        )
        try:
            await agent.run(stop)
        except StateDirTaken as e:
            sys.exit(f"llmgw agent: {e}")
        finally:
            await bus.close()

    _run_until_signalled(main)


def cmd_ctl(args) -> None:
    from . import ctl

    try:
        sys.exit(asyncio.run(ctl.run(args)))
    except KeyboardInterrupt:  # the end of a --watch
        sys.exit(130)


def cmd_projections_rebuild(args) -> None:
    from ..bus.auth import CredentialError, CredentialRefused
    from ..projections.__main__ import rebuild_once

    where = locate(args.nats, args.db, args.creds)
    if where.db is None:
        sys.exit("llmgw projections rebuild: which database? give --db PATH (or run it where llmgw up runs)")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr)
    try:
        asyncio.run(rebuild_once(where.nats, str(where.db), wait_streams=5.0, creds=where.creds))
    except (CredentialRefused, CredentialError) as e:
        print(f"llmgw projections rebuild: {e}", file=sys.stderr)
        sys.exit(3)
    except (ConnectionError, LookupError, TimeoutError) as e:
        sys.exit(f"llmgw projections rebuild: {e}")


def cmd_replay(args) -> None:
    from ..replay import logfile, tool

    if args.file:
        try:
            records = logfile.read(args.file)
        except (OSError, ValueError) as e:
            sys.exit(f"llmgw replay: {args.file}: {e}")
    else:
        from ..bus import read_log
        from ..bus.auth import CredentialError, CredentialRefused
        from ..bus.nats import NatsBus

        async def fetch():
            bus = await NatsBus.connect(_nats_url(args), name="llmgw-replay", creds=_creds(args))
            try:
                return await read_log(bus)
            finally:
                await bus.close()

        try:
            records = asyncio.run(fetch())
        except (CredentialRefused, CredentialError) as e:
            print(f"llmgw replay: {e}", file=sys.stderr)
            sys.exit(3)
        except (ConnectionError, LookupError) as e:
            sys.exit(f"llmgw replay: {e}")
    sys.exit(tool.run(records, args))


def cmd_events(args) -> None:
    from .. import contract

    if args.write:
        for path in contract.write():
            print(f"wrote {path}")
        return
    current, saved = contract.schemas(), contract.committed()
    problems = contract.incompatibilities(saved, current)
    stale = sorted(t for t in current if saved.get(t) != current[t])
    for p in problems:
        print(f"incompatible: {p}")
    for t in stale:
        print(f"out of date: events/schema/{t}.json (run llmgw events schema --write)")
    if problems or stale:
        sys.exit(1)
    print(f"{len(current)} event schemas match the code")


# ----------------------------------------------------------------- parser


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmgw", description="A GPU fleet as one LLM service, folded from an event log.")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run NATS (embedded), the control plane, the projector and an agent on this machine")
    up.add_argument("--state-dir", default=".llmgw", help="where NATS keeps the log and the control plane its snapshots")
    up.add_argument("--nats-port", type=int, default=4222)
    up.add_argument("--nats", help="use this NATS server or cluster instead of starting one")
    up.add_argument("--no-agent", action="store_true", help="run no agent on this machine (and so no demo model)")
    up.add_argument("--no-demo", action="store_true", help="do not apply the demo model to an empty catalog")
    up.add_argument("--agent-file", help="the local agent's file (default: one written for this CPU-only machine)")
    up.add_argument("--name", help="the local node's name (default: the host name)")
    up.add_argument("--gateway-port", type=int, default=8080, help="the port of the gateway's OpenAI API (default 8080)")
    up.add_argument("--no-gateway", action="store_true", help="run no gateway")
    up.set_defaults(func=cmd_up)

    control = sub.add_parser("control", help="run the control plane")
    control.add_argument("--nats", help=f"NATS URL (default $LLMGW_NATS or {DEFAULT_NATS})")
    control.add_argument("--state-dir", default=".llmgw")
    control.add_argument("--node-grace", type=float, default=10.0, help="seconds without a heartbeat before a node is lost")
    control.add_argument(
        "--stream-replicas", type=int, default=1, choices=(1, 3, 5), help="JetStream replicas of the streams it creates (3 in a cluster)"
    )
    control.add_argument("--creds", help="NATS credential, a .creds file (default $LLMGW_CREDS, else the local llmgw up's)")
    control.add_argument("-v", "--verbose", action="store_true")
    control.set_defaults(func=cmd_control)

    agent = sub.add_parser("agent", help="run a node agent: the engines of this node (or, with --simulate, none)")
    agent.add_argument("--simulate", action="store_true", help="a simulated node: runs no engine")
    agent.add_argument("--name", help="the node's name (default: the host name; required with --simulate)")
    agent.add_argument("--agent-file", help="what this node has that NVML cannot say (YAML; see llmgw/agent/agentfile.py)")
    agent.add_argument(
        "--state-dir", help="engines' logs and what the agent remembers across restarts (default .llmgw/agent-NAME)"
    )
    agent.add_argument(
        "--stop-engines-on-exit", action="store_true",
        help="stop the engines when the agent stops (llmgw up); by default they outlive it and are adopted again",
    )  # fmt: skip
    agent.add_argument("--gpus", type=int, default=8, help="GPUs of a simulated node")
    agent.add_argument("--gpu-memory", type=float, default=80.0, help="GB per simulated GPU")
    agent.add_argument("--loading-after", type=float, default=0.1, help="seconds from starting to loading")
    agent.add_argument("--ready-after", type=float, default=0.5, help="seconds from loading to ready")
    agent.add_argument("--fail-model", action="append", default=[], help="shards of this model fail instead of becoming ready")
    agent.add_argument("--nats")
    agent.add_argument("--creds", help="NATS credential, a .creds file (default $LLMGW_CREDS, else the local llmgw up's)")
    agent.add_argument("-v", "--verbose", action="store_true")
    agent.set_defaults(func=cmd_agent)

    gateway = sub.add_parser("gateway", help="serve the OpenAI API and route to ready replicas (stateless: run as many as needed)")
    gateway.add_argument("--nats", help=f"NATS URL (default $LLMGW_NATS, else the local llmgw up, else {DEFAULT_NATS})")
    gateway.add_argument("--port", type=int, default=8080, help="the port of the OpenAI API (0: any free one)")
    gateway.add_argument(
        "--host", default="0.0.0.0",
        help="where to listen once the catalog defines API keys (until then, and without keys, 127.0.0.1 only)",
    )  # fmt: skip
    gateway.add_argument("--name", help="the gateway's name in the load it reports (default HOST-PORT)")
    gateway.add_argument(
        "--wait-timeout", type=float, default=300.0,
        help="seconds a request waits for a ready replica (an on-demand model waking) before 503",
    )  # fmt: skip
    gateway.add_argument("--upstream-timeout", type=float, default=600.0, help="seconds to wait for an engine's first byte")
    gateway.add_argument("--creds", help="NATS credential, a .creds file (default $LLMGW_CREDS, else the local llmgw up's)")
    gateway.add_argument("-v", "--verbose", action="store_true")
    gateway.set_defaults(func=cmd_gateway)

    from . import ctl

    ctl.add_parser(sub)
    from . import creds

    creds.add_parser(sub)

    projections = sub.add_parser("projections", help="the SQLite read models")
    projections_sub = projections.add_subparsers(dest="what", required=True)
    rebuild = projections_sub.add_parser(
        "rebuild", help="make the read models afresh from the whole log (a running projector moves to the new file)"
    )
    rebuild.add_argument("--nats", help="NATS URL (default $LLMGW_NATS, else the local llmgw up)")
    rebuild.add_argument("--db", help="the SQLite file (default $LLMGW_DB, else the local llmgw up's)")
    rebuild.add_argument("--creds", help="NATS credential, a .creds file (default $LLMGW_CREDS, else the local llmgw up's)")
    rebuild.add_argument("-v", "--verbose", action="store_true")
    rebuild.set_defaults(func=cmd_projections_rebuild)

    replay = sub.add_parser("replay", help="fold the log and show any moment of it")
    replay.add_argument("file", nargs="?", help="a log file (from --export); without it, the live log")
    replay.add_argument("--nats")
    replay.add_argument("--creds", help="NATS credential, a .creds file (default $LLMGW_CREDS, else the local llmgw up's)")
    replay.add_argument("--at", help="stop at this sequence number or time (ISO 8601 or Unix seconds)")
    who = replay.add_mutually_exclusive_group()
    who.add_argument("--model", help="the history of one model")
    who.add_argument("--replica", help="the history of one replica")
    who.add_argument("--node", help="the history of one node")
    replay.add_argument("--verify", action="store_true", help="decide again at every recorded decision and compare")
    replay.add_argument("--quarantined", action="store_true", help="list the quarantined events")
    replay.add_argument("--export", metavar="FILE", help="write the log to a file")
    replay.add_argument("--json", action="store_true", help="JSON for tools instead of tables")
    replay.set_defaults(func=cmd_replay)

    events = sub.add_parser("events", help="the event contract")
    events_sub = events.add_subparsers(dest="what", required=True)
    schema = events_sub.add_parser("schema", help="check (default) or write events/schema/")
    schema.add_argument("--write", action="store_true")
    schema.set_defaults(func=cmd_events)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    args.func(args)
