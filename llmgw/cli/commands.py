"""What each `llmgw` subcommand runs: a component (up, control, agent,
gateway, console), or a tool (ctl, projections rebuild, replay, completion,
events schema). Their parsers are parsers.py; what they share is running.py."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from ..ctl.locate import locate
from .running import _component, _creds, _fail, _nats_url, _run_until_signalled, _setup_logging, _signer, _verifier, default_node_name


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
            engine_ports=args.engine_ports,
            gateway_listen=args.gateway_listen,
            console_port=None if args.no_console else args.console_port,
            console_listen=args.console_listen,
            metrics_port=args.metrics_port,
            wait_timeout=args.wait_timeout,
        )  # always with auth: bus/auth.py, under <state dir>/creds
    )


def cmd_control(args) -> None:
    from ..bus.nats import NatsBus
    from ..control.config import ControlConfig
    from ..control.plane import ControlPlane
    from ..control.snapshots import SnapshotStore

    from ..telemetry import setup

    _component(args, "control", "control")
    signer = _signer(args)
    if args.metrics_listen not in ("", "off"):
        from ..control.config import listen_address

        try:
            listen_address(args.metrics_listen)
        except ValueError as e:
            _fail(f"llmgw control: --metrics-listen: {e}", 2)
    _setup_logging(args.verbose)
    setup("llmgw-control")

    async def main(stop: asyncio.Event) -> None:
        bus = await NatsBus.connect(
            _nats_url(args), name="llmgw-control", forever=True, replicas=args.stream_replicas, stop=stop,
            creds=args.creds,
        )  # fmt: skip
        snapshots = SnapshotStore(os.path.join(args.state_dir, "control", "snapshot.msgpack"))
        metrics = "" if args.metrics_listen in ("", "off") else args.metrics_listen
        config = ControlConfig(node_grace=args.node_grace, lease_ttl=args.lease_ttl, metrics_listen=metrics,
                               node_rate=args.node_rate, mass_silence=args.mass_silence)
        plane = ControlPlane(bus, snapshots=snapshots, config=config, signer=signer)
        try:
            await plane.run(stop)
        finally:
            await bus.close()

    _run_until_signalled(main)


def cmd_gateway(args) -> None:
    import re
    import socket

    from ..bus.nats import NatsBus
    from ..gateway.config import from_args
    from ..gateway.server import Gateway
    from ..telemetry import setup

    try:
        config = from_args(args)
    except ValueError as e:
        _fail(f"llmgw gateway: {e}", 2)
    name = args.name
    if name is None and not (args.creds or os.environ.get("LLMGW_CREDS")):
        name = re.sub(r"[^A-Za-z0-9_-]", "-", f"{socket.gethostname().split('.')[0]}-{config.port}")[:64]
    name = _component(args, "gateway", name)  # a gateway's credential names it
    if not re.match(r"^[A-Za-z0-9_-]{1,64}$", name):
        _fail(f"llmgw gateway: a gateway name is letters, digits, _ and - (at most 64), not {name!r}", 2)
    _setup_logging(args.verbose)
    setup("llmgw-gateway")
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass

    async def main(stop: asyncio.Event) -> None:
        bus = await NatsBus.connect(
            _nats_url(args), name=f"llmgw-gateway-{name}", forever=True, stop=stop, creds=args.creds
        )
        gateway = Gateway(bus, name=name, config=config)
        try:
            await gateway.run(stop)
        finally:
            await bus.close()

    _run_until_signalled(main)


def cmd_console(args) -> None:
    from ..bus.server import port_is_taken
    from ..console import server
    from ..console.config import ConsoleConfig
    from ..ctl.exits import Exit

    where = locate(args.nats, args.db, None)  # (the tools' credential is not the console's: below)
    creds = _console_creds(args)
    if args.listen in ("127.0.0.1", "localhost") and port_is_taken(args.port):
        _fail(f"llmgw console: the port {args.port} is taken: give another with --port", Exit.BAD_INPUT)
    try:
        token = server.token_from(args.token_file)
    except OSError as e:
        _fail(f"llmgw console: the token file {args.token_file}: {e.strerror or e}", Exit.BAD_INPUT)
    config = ConsoleConfig(port=args.port, listen=args.listen)
    _setup_logging(args.verbose)

    def ready(console) -> None:
        port = console.server.sockets[0].getsockname()[1]
        print(f"llmgw console: {server.console_url(args.listen, port, token)}", flush=True)

    async def main(stop: asyncio.Event) -> None:
        try:
            await server.serve(where.nats, str(where.db) if where.db else None, creds, token, config, stop,
                               on_ready=ready)
        except OSError as e:
            if isinstance(e, ConnectionError):
                raise
            _fail(f"llmgw console: cannot listen on {args.listen}:{args.port}: {e.strerror or e}", Exit.BAD_INPUT)

    _run_until_signalled(main)


def _console_creds(args) -> str | None:
    """The console's own credential (role console: it may publish only the
    actions it offers; issue 35, finding 9). --creds when given, and it must be
    a console's (not $LLMGW_CREDS: that is the tools' credential); else the
    local `llmgw up`'s, issued on first use; else none (a NATS without auth)."""
    from ..bus.auth import DEFAULTS, CredentialError
    from ..bus.keystore import Keystore, speaker
    from ..ctl.locate import find_state_dir
    from .up import CONSOLE_NAME

    try:
        if args.creds:
            speaker(args.creds, "console", None)
            return args.creds
        state = find_state_dir()
        keys = Keystore(state / DEFAULTS.creds_dir) if state is not None else None
        if keys is not None and keys.exists():
            return str(keys.ensure("console", CONSOLE_NAME))
    except CredentialError as e:
        _fail(f"llmgw console: {e} (`llmgw creds issue console NAME` makes one)", 3)
    return None



def cmd_agent(args) -> None:
    if args.simulate:
        from .simulate import cmd_simulated

        return cmd_simulated(args)
    if args.fleet is not None or args.fleet_file:
        _fail("llmgw agent: --fleet and --fleet-file are for simulated nodes: add --simulate", 2)
    if not args.name and not (args.creds or os.environ.get("LLMGW_CREDS")):
        args.name = default_node_name()
    args.name = _component(args, "agent", args.name)  # an agent's credential names its node
    return cmd_real_agent(args)


def cmd_real_agent(args) -> None:
    from pathlib import Path

    from ..agent import agentfile
    from ..agent.node import NodeAgent, StateDirTaken
    from ..bus.auth import CredentialRefused
    from ..bus.nats import NatsBus
    from ..core.contract.catalog import NAME_RE

    name = args.name or default_node_name()
    if not NAME_RE.match(name):
        _fail(f"llmgw agent: a node name is letters, digits, _ and - (at most 64), not {name!r}", 2)
    try:
        agent_file = agentfile.load(args.agent_file)
    except agentfile.AgentFileError as e:
        print(f"llmgw agent: {e}", file=sys.stderr)
        sys.exit(2)
    if args.engine_ports:
        agent_file.engine_ports = args.engine_ports  # the flag wins over the file
    state_dir = Path(args.state_dir or os.path.join(".llmgw", f"agent-{name}"))
    command_key = _verifier(args, agent_file.command_key)
    _setup_logging(args.verbose)
    url, creds = _nats_url(args), args.creds

    async def main(stop: asyncio.Event) -> None:
        # NATS may not be up yet (a node booting before it): connect waits for
        # it, forever; a credential refused raises at once (exit 3, saying which).
        try:
            bus = await NatsBus.connect(url, name=f"llmgw-agent-{name}", forever=True, stop=stop, creds=creds)
        except CredentialRefused:
            raise
        except ConnectionError:
            return  # stopped while waiting
        agent = NodeAgent(
            bus,
            name,
            state_dir=state_dir,
            agent_file=agent_file,
            stop_engines_on_exit=args.stop_engines_on_exit,
            model_dirs=(state_dir / "models", state_dir.parent / "models"),
            command_key=command_key,
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
    from ..ctl.exits import Exit

    where = locate(args.nats, args.db, args.creds)
    if where.db is None:
        print("llmgw projections rebuild: which database? give --db PATH (or run it where llmgw up runs)", file=sys.stderr)
        sys.exit(Exit.BAD_INPUT)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr)
    try:
        asyncio.run(rebuild_once(where.nats, str(where.db), wait_streams=5.0, creds=where.creds))
    except (CredentialRefused, CredentialError) as e:
        print(f"llmgw projections rebuild: {e}", file=sys.stderr)
        sys.exit(3)
    except (ConnectionError, LookupError, TimeoutError) as e:
        print(f"llmgw projections rebuild: {e} ({where.how_nats})", file=sys.stderr)
        sys.exit(Exit.UNREACHABLE)


def cmd_replay(args) -> None:
    from ..replay import logfile, tool
    from ..ctl.exits import Exit

    if args.file:
        try:
            records = logfile.read(args.file)
        except OSError as e:
            print(f"llmgw replay: {args.file}: {e.strerror or e}", file=sys.stderr)
            sys.exit(Exit.NOT_FOUND if isinstance(e, FileNotFoundError) else Exit.BAD_INPUT)
        except ValueError as e:
            print(f"llmgw replay: {args.file}: {e}", file=sys.stderr)
            sys.exit(Exit.BAD_INPUT)
    else:
        from ..bus.auth import CredentialError, CredentialRefused
        from ..bus.nats import NatsBus
        from ..ctl.progress import read_log_showing_progress

        where = locate(args.nats)

        async def fetch():
            bus = await NatsBus.connect(where.nats, name="llmgw-replay", creds=_creds(args))
            try:
                return await read_log_showing_progress(bus, "llmgw replay: reading the log")
            finally:
                await bus.close()

        try:
            records = asyncio.run(fetch())
        except (CredentialRefused, CredentialError) as e:
            print(f"llmgw replay: {e}", file=sys.stderr)
            sys.exit(Exit.UNREACHABLE)
        except (ConnectionError, LookupError, TimeoutError) as e:
            print(f"llmgw replay: {e} ({where.how_nats})", file=sys.stderr)
            sys.exit(Exit.UNREACHABLE)
    sys.exit(tool.run(records, args))


def cmd_completion(args) -> None:
    """A completion script for the shell named, made from this very parser;
    --names KIND (what the scripts call at a Tab): the names in the local read models."""
    from ..ctl import completion

    if args.names is not None:
        for name in completion.names(args.names):
            print(name)
        return
    if args.shell is None:
        _fail(f"llmgw completion: name a shell: {', '.join(completion.SHELLS)}", 2)
    from .main import parser

    print(completion.script(args.shell, parser()), end="")


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
        from ..ctl.exits import Exit

        sys.exit(Exit.NOT_AS_WANTED)
    print(f"{len(current)} event schemas match the code")
