"""`llmgw`: one command, a subcommand per component.

    llmgw up                 embedded NATS, control plane, projector, an agent, the demo model and a gateway
    llmgw control            the control plane alone, against a NATS you run
    llmgw agent              the node agent: runs this node's inference engines
    llmgw agent --simulate   a simulated node
    llmgw gateway            the OpenAI API, routed to ready replicas
    llmgw ctl apply -f FILE  publish a catalog; get, describe: read the read models
    llmgw console            the web console: the fleet, its history, the operator's actions
    llmgw projections rebuild  make the read models afresh from the log
    llmgw creds issue|list|revoke  the bus credentials of nodes, gateways, operators
    llmgw replay [FILE]      fold the log and look at any moment of it
    llmgw events schema      write or check the event contract files
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import sys

from ..ctl.locate import DEFAULT_NATS, locate


def _nats_url(args) -> str:
    """--nats, else $LLMGW_NATS, else the local `llmgw up`'s, else the default port."""
    return locate(args.nats).nats


def _fail(message: str, status: int) -> None:
    """One line on stderr, and the exit status of the table (llmgw/ctl/exits.py)."""
    print(message, file=sys.stderr, flush=True)
    sys.exit(status)


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
        _fail(f"llmgw {args.command}: {e}", 3)
    args.creds = str(creds) if creds else None
    return name


def _signer(args):
    """The control plane's command-signing key (bus/signing.py); exit 2 if the one given cannot be read."""
    from ..bus import signing
    from ..ctl.locate import find_state_dir

    try:
        return signing.find_signer(args.signing_key, state_dir=find_state_dir())
    except signing.CommandKeyError as e:
        _fail(f"llmgw {args.command}: {e}", 2)


def _verifier(args, from_agent_file: str = ""):
    """An agent's command key (bus/signing.py find_verifier); exit 2 if the one given cannot be read."""
    from ..bus import signing
    from ..ctl.locate import find_state_dir

    try:
        return signing.find_verifier(args.command_key, from_agent_file, state_dir=find_state_dir())
    except signing.CommandKeyError as e:
        _fail(f"llmgw {args.command}: {e}", 2)


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
        _fail(f"llmgw: {e}", 3)  # (a ConnectionError too: said first, with what to do)
    except (ConnectionError, LookupError, TimeoutError) as e:
        _fail(f"llmgw: {e}", 3)  # NATS or its streams unreachable (llmgw/ctl/exits.py)
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
                               node_rate=args.node_rate)
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
    from ..bus.auth import DEFAULTS, CredentialError, Keystore, speaker
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


def default_node_name() -> str:
    """This machine's host name, as a node name (letters, digits, _ and -)."""
    import re
    import socket

    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0])[:64]
    return name or "node"


def _label_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"{text!r}: a label is KEY=VALUE (llmgw.io/rack=r4-12)")
    return key, value


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
    from ..core.catalog import NAME_RE

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


# ----------------------------------------------------------------- parser


def _engine_ports_help() -> str:
    from ..core.placement import PORT_BASE, PORT_LIMIT

    return (
        f"the ports the agent's engines may listen on (default: the agent file's engine_ports, else "
        f"{PORT_BASE}-{PORT_LIMIT}); those another program holds are found and not handed out"
    )


ENGINE_PORTS_HELP = _engine_ports_help()


def _port_range(text: str):
    from ..agent.agentfile import PortRange

    try:
        return PortRange.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _seconds(text: str) -> float:
    """A number of seconds: finite and not negative."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seconds are a number, not {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"seconds must be a finite number, not negative: {text}")
    return value


class Help(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written; every flag's default shown
    (except the empty ones: off, none, nothing)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or "default" in text or default in (None, False, argparse.SUPPRESS, [], ""):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            text += " (default: %(default)s)"
        return text


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("llmgw")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


from ..console.config import DEFAULT_PORT as CONSOLE_PORT  # noqa: E402

NATS_HELP = "NATS URL(s), comma-separated (default: $LLMGW_NATS, else the local llmgw up's, else %s)" % DEFAULT_NATS

# Per command: what it does (its --help's first lines), and examples.
ABOUT = {
    "up": (
        "Run a whole fleet on this machine: an embedded NATS (JetStream) keeping the log under --state-dir, the\n"
        "control plane, the projector, an agent for this machine, the demo model (SmolLM2 on llama.cpp, on the\n"
        "CPU) and a gateway. Ctrl-C stops it all; running it again resumes from the same log.",
        ["llmgw up", "llmgw up --no-demo --gateway-port 9000", "llmgw up --nats nats://nats-1:4222 --no-agent"],
    ),
    "control": (
        "Run the control plane against a NATS you run: it folds the log, decides (placement, scaling, restarts,\n"
        "preemption) and publishes its decisions fenced, so a stale or second leader is refused.",
        [
            "llmgw control --nats nats://nats-1:4222,nats://nats-2:4222 --stream-replicas 3",
            "llmgw control --metrics-listen 0.0.0.0:9464   # /metrics for a Prometheus elsewhere",
        ],
    ),
    "agent": (
        "Run the node agent: it starts and watches this node's inference engines and reports them on the log.\n"
        "With --simulate, a simulated node that runs no engine (for tests, demos and benchmarks); with --fleet N,\n"
        "N of them in one process over one connection, on a fleet credential (llmgw creds issue fleet NAME).",
        [
            "llmgw agent --agent-file deploy/agent.example.yaml",
            "llmgw agent --simulate --name gpu-1 --gpus 8",
            "llmgw agent --simulate --name gpu-2 --label llmgw.io/rack=r4-12 --label llmgw.io/pdu=pdu-a --watts-per-gpu 350",
            "llmgw agent --simulate --fleet 2000 --name 'sim-{i:04d}' --gpus 8 --no-serve   # one process, one connection",
        ],
    ),
    "gateway": (
        "Serve the OpenAI API (/v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings) and route\n"
        "each request to a ready replica. Stateless: run as many as needed.",
        ["llmgw gateway --port 8080", "llmgw gateway --nats nats://nats-1:4222 --port 0 --wait-timeout 30"],
    ),
    "console": (
        "Serve the web console: the fleet by site, room, row, rack and PDU, its models, replicas, decisions,\n"
        "preemptions and quotas, live; any moment of the log (time travel); why a model would go where; and\n"
        "the operator's actions (labels, holds, restarts, retries), published with the console's own credential,\n"
        "which may publish those and nothing else (`llmgw creds issue console NAME`). Only for whoever\n"
        "opens the URL it prints (it carries the token); llmgw up runs one on --console-port.",
        ["llmgw console", "llmgw console --port 9081 --token-file .llmgw/console.token",
         "llmgw console --listen 0.0.0.0 --nats nats://nats-1:4222 --db /var/lib/llmgw/rm.db --creds console.creds"],
    ),
    "projections": ("The SQLite read models that `llmgw ctl` reads.", ["llmgw projections rebuild"]),
    "projections rebuild": (
        "Make the read models afresh from the whole log, showing progress; a projector running on the same\n"
        "file moves to the new one by itself.",
        ["llmgw projections rebuild", "llmgw projections rebuild --nats nats://nats-1:4222 --db /var/lib/llmgw/rm.db"],
    ),
    "replay": (
        "Fold the log (the live one, or a file written by --export) and show the state at any moment,\n"
        "the history of one model, replica or node, or check every recorded decision (--verify).\n"
        "--what-if CATALOG decides the history again under another catalog and policy and reports, model by\n"
        "model, recorded vs what-if, and the first decision that diverged (deterministic: the same file on the\n"
        "same log gives the same report, byte for byte). Exit 0 when nothing differs, 5 when something does.",
        [
            "llmgw replay", "llmgw replay --model qwen-8b", "llmgw replay --at 2026-05-01T12:00:00",
            "llmgw replay --verify", "llmgw replay --export day.jsonl && llmgw replay day.jsonl --json",
            "llmgw replay day.jsonl --what-if catalog.yaml --from 120 --to 2026-05-01T13:00:00",
        ],
    ),
    "creds": (
        "The bus credentials of a fleet: one per node, gateway and operator, each allowed to say only what\n"
        "its role may (llmgw/bus/auth.py). Issue, list and revoke them; a revoked node is treated as lost.",
        ["llmgw creds issue agent gpu-7", "llmgw creds list", "llmgw creds revoke agent gpu-7"],
    ),
    "creds issue": (
        "Issue a credential (a NATS .creds file) for a node's agent, a gateway, an operator, a control plane\n"
        "or a projector, from the key store of the local llmgw up (or --dir).",
        ["llmgw creds issue agent gpu-7", "llmgw creds issue operator alice --dir /etc/llmgw/creds"],
    ),
    "creds list": ("Every credential issued, live or revoked.", ["llmgw creds list", "llmgw creds list --json"]),
    "creds revoke": (
        "Revoke a credential: the server refuses it from then on, and a revoked node is treated as lost.",
        ["llmgw creds revoke agent gpu-7"],
    ),
    "creds init": (
        "Make a key store for a fleet's servers (deploy/nats/): the operator and account keys and the\n"
        "server's auth configuration.",
        ["llmgw creds init --dir /etc/llmgw/creds"],
    ),
    "creds command-key": (
        "Print the public key of the control plane's command-signing key (creds/commands.pub): every agent is\n"
        "given it (--command-key, or the agent file's command_key) and obeys only commands signed with it.",
        ["llmgw creds command-key", "llmgw creds command-key --dir /etc/llmgw/creds > /etc/llmgw/commands.pub"],
    ),
    "completion": (
        "Print a completion script for bash, zsh or fish: commands, verbs, kinds, flags and their values, made\n"
        "from this command line's own parser; at a Tab, the names of models, replicas and nodes come from the\n"
        "local read models (no NATS).",
        ["llmgw completion bash > /etc/bash_completion.d/llmgw", "source <(llmgw completion bash)",
         "source <(llmgw completion zsh)", "llmgw completion fish > ~/.config/fish/completions/llmgw.fish"],
    ),
    "events": ("The event contract as files (events/schema/).", ["llmgw events schema", "llmgw events schema --write"]),
    "events schema": (
        "Check that events/schema/ matches the code (and that no change breaks the log's contract), or write it.",
        ["llmgw events schema", "llmgw events schema --write"],
    ),
}


def _explained(p: argparse.ArgumentParser, about: tuple[str, list[str]] | None) -> None:
    """A command's --help: its description, examples and the exit statuses."""
    from ..ctl.exits import table_text

    p.formatter_class = Help
    if about is not None:
        description, examples = about
        p.description = description
        p.epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples) + "\n\n" + table_text()
    else:
        p.epilog = table_text()


def _every_command(p: argparse.ArgumentParser, path: str = ""):
    """(its path, the parser) for every command and subcommand under p, once each."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias
                    continue
                seen.add(id(sub))
                here = f"{path} {name}".strip()
                yield here, sub
                yield from _every_command(sub, here)


def parser() -> argparse.ArgumentParser:
    from ..control.config import LEASE_TTL_S, METRICS_LISTEN, NODE_GRACE_S
    from ..control.rates import NODE_BURST, NODE_RATE, NODE_RATE_WINDOW_S
    from ..gateway import config as gateway_config
    from ..ctl.exits import table_text

    p = argparse.ArgumentParser(
        prog="llmgw", formatter_class=Help,
        description="A GPU fleet as one LLM service, folded from an event log on NATS JetStream.",
        epilog="examples:\n  llmgw up\n  llmgw ctl get replicas\n  llmgw ctl apply -f deploy/catalog.cpu.yaml --wait\n"
        "  llmgw COMMAND --help\n\n" + table_text(),
    )  # fmt: skip
    p.add_argument("--version", action="version", version=f"llmgw {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of these (llmgw COMMAND --help says more)")

    up = sub.add_parser("up", help="run NATS (embedded), the control plane, the projector, an agent and a gateway here")
    up.add_argument(
        "--state-dir", default=".llmgw", metavar="DIR",
        help="where the log (NATS), the snapshots, the read models and the agent's files live",
    )  # fmt: skip
    up.add_argument("--nats-port", type=int, default=4222, metavar="PORT", help="the port of the embedded NATS server")
    up.add_argument("--nats", metavar="URL", help="use this NATS server or cluster instead of starting one")
    up.add_argument("--no-agent", action="store_true", help="run no agent on this machine (and so no demo model)")
    up.add_argument("--no-demo", action="store_true", help="do not apply the demo model to an empty catalog")
    up.add_argument(
        "--agent-file", metavar="FILE", help="the local agent's file (default: one written for this CPU-only machine)"
    )
    up.add_argument("--name", help="the local node's name (default: the host name)")
    up.add_argument("--gateway-port", type=int, default=8080, metavar="PORT", help="the port of the gateway's OpenAI API")
    up.add_argument(
        "--gateway-listen", default="127.0.0.1", metavar="ADDR",
        help="the address of the gateway's OpenAI API (0.0.0.0: every interface)",
    )  # fmt: skip
    up.add_argument("--no-gateway", action="store_true", help="run no gateway")
    up.add_argument(
        "--wait-timeout", type=_seconds, metavar="SECONDS",
        help="the gateway's --wait-timeout: how long a request waits for a replica on its way (placing, loading, "
        "waking) before 503 (default: the gateway's, 300); one that cannot be served now (no room, over a limit, "
        "parked) gets 503 at once",
    )  # fmt: skip
    up.add_argument(
        "--metrics-port", type=int, default=0, metavar="PORT",
        help="the port of the control plane's Prometheus /metrics, on 127.0.0.1 (default: a free one, printed)",
    )  # fmt: skip
    up.add_argument("--engine-ports", type=_port_range, metavar="FIRST-LAST", help=ENGINE_PORTS_HELP)
    up.add_argument(
        "--console-port", type=int, default=CONSOLE_PORT, metavar="PORT",
        help="the port of the web console (taken: up runs without one, saying so)",
    )  # fmt: skip
    up.add_argument(
        "--console-listen", default="127.0.0.1", metavar="ADDR",
        help="the address of the web console (0.0.0.0: every interface; it needs its token all the same)",
    )  # fmt: skip
    up.add_argument("--no-console", action="store_true", help="run no web console")
    up.set_defaults(func=cmd_up)

    control = sub.add_parser("control", help="run the control plane against a NATS you run")
    control.add_argument("--nats", metavar="URL", help=NATS_HELP)
    control.add_argument(
        "--state-dir", default=".llmgw", metavar="DIR", help="where the control plane keeps its snapshots (DIR/control/)"
    )
    control.add_argument(
        "--node-grace", type=float, default=NODE_GRACE_S, metavar="S",
        help="seconds without a heartbeat (while heartbeats can be read) before a node is lost",
    )
    control.add_argument(
        "--node-rate", type=float, default=NODE_RATE, metavar="N",
        help=f"events a second a node may send (averaged over {NODE_RATE_WINDOW_S} s, plus {NODE_BURST} at once) "
        "before it is muted until an operator unmutes it (`llmgw ctl node unmute`); 0: never",
    )
    control.add_argument(
        "--lease-ttl", type=float, default=LEASE_TTL_S, metavar="S",
        help="seconds the leader's lease lives without renewal: a standby takes over within about this (the bucket's, once made)",
    )
    control.add_argument(
        "--metrics-listen", default=METRICS_LISTEN, metavar="ADDR:PORT",
        help=f"serve the control plane's Prometheus /metrics there (default {METRICS_LISTEN}; 'off': none)",
    )  # fmt: skip
    control.add_argument(
        "--stream-replicas", type=int, default=1, choices=(1, 3, 5), help="JetStream replicas of the streams it creates (3 in a cluster)"
    )
    control.add_argument("--creds", metavar="FILE", help="NATS credential, a .creds file (default: $LLMGW_CREDS, else the local llmgw up's)")
    control.add_argument(
        "--signing-key", metavar="FILE",
        help="the seed it signs agents' commands with (default: the local llmgw up's creds/keys/commands.nk; none: unsigned)",
    )  # fmt: skip
    control.add_argument("-v", "--verbose", action="store_true", help="log at debug level, with tracebacks")
    control.set_defaults(func=cmd_control)

    agent = sub.add_parser("agent", help="run a node agent: the engines of this node (or, with --simulate, none)")
    agent.add_argument("--simulate", action="store_true", help="a simulated node: runs no engine")
    agent.add_argument(
        "--name", help="the node's name (default: the host name; required with --simulate; with --fleet, a pattern: sim-{i:04d})"
    )
    agent.add_argument(
        "--agent-file", metavar="FILE",
        help="what this node has that NVML cannot say (YAML; see deploy/agent.example.yaml); with --simulate, its labels",
    )
    agent.add_argument(
        "--state-dir", metavar="DIR", help="engines' logs and what the agent remembers across restarts (default: .llmgw/agent-NAME)"
    )
    agent.add_argument(
        "--stop-engines-on-exit", action="store_true",
        help="stop the engines when the agent stops (llmgw up); by default they outlive it and are adopted again",
    )  # fmt: skip
    agent.add_argument(
        "--engine-ports", type=_port_range, metavar="FIRST-LAST",
        help=ENGINE_PORTS_HELP + "; with --simulate, its simulated engines listen on them (default: ports the system picks)",
    )  # fmt: skip
    agent.add_argument("--gpus", type=int, default=8, metavar="N", help="GPUs of a simulated node")
    agent.add_argument("--gpu-memory", type=float, default=80.0, metavar="GB", help="GB per simulated GPU")
    agent.add_argument("--loading-after", type=float, default=0.1, metavar="S", help="simulated: seconds from starting to loading")
    agent.add_argument("--ready-after", type=float, default=0.5, metavar="S", help="simulated: seconds from loading to ready")
    agent.add_argument(
        "--fail-model", action="append", default=[], metavar="MODEL",
        help="simulated: shards of this model fail instead of becoming ready (repeat for more)",
    )  # fmt: skip
    agent.add_argument(
        "--never-start", action="store_true",
        help="simulated: start nothing it is given and say nothing of it (tests the start deadline)",
    )  # fmt: skip
    agent.add_argument(
        "--watts-per-gpu", type=float, default=0.0, metavar="W",
        help="simulated: the draw measured of each GPU in use, sent as node.power (0: none measured)",
    )  # fmt: skip
    agent.add_argument(
        "--gpu-power", type=float, default=0.0, metavar="W",
        help="simulated: each GPU's power limit, its derived draw before a measurement (0: not said)",
    )  # fmt: skip
    agent.add_argument(
        "--power-interval", type=float, default=5.0, metavar="S",
        help="simulated: at most one node.power this often (a change held back is sent after it)",
    )  # fmt: skip
    from .simulate import add_arguments as add_fleet_arguments

    add_fleet_arguments(agent)
    agent.add_argument("--nats", metavar="URL", help=NATS_HELP)
    agent.add_argument("--creds", metavar="FILE", help="NATS credential, a .creds file (default: $LLMGW_CREDS, else the local llmgw up's)")
    agent.add_argument(
        "--command-key", metavar="KEY|FILE",
        help="the control plane's public command key (N...), or a file holding it (creds/commands.pub): only commands "
        "signed with it are obeyed (default: the agent file's command_key, $LLMGW_COMMAND_KEY, else the local llmgw up's)",
    )  # fmt: skip
    agent.add_argument("-v", "--verbose", action="store_true", help="log at debug level, with tracebacks")
    agent.set_defaults(func=cmd_agent)

    gateway = sub.add_parser("gateway", help="serve the OpenAI API and route to ready replicas (stateless: run as many as needed)")
    gateway.add_argument("--nats", metavar="URL", help=NATS_HELP)
    gateway.add_argument("--creds", metavar="FILE", help="NATS credential, a .creds file (default: $LLMGW_CREDS, else the local llmgw up's)")
    gateway.add_argument("--name", help="the gateway's name in the load it reports (default: HOST-PORT)")
    gateway_config.add_arguments(gateway)  # --listen, --port, the limits and timeouts (llmgw/gateway/config.py)
    gateway.add_argument("-v", "--verbose", action="store_true", help="log at debug level, with tracebacks")
    gateway.set_defaults(func=cmd_gateway)

    console = sub.add_parser("console", help="serve the web console: the fleet, any moment of its history, actions")
    console.add_argument("--port", type=int, default=CONSOLE_PORT, metavar="PORT", help="the port it listens on")
    console.add_argument(
        "--listen", default="127.0.0.1", metavar="ADDR", help="the address it listens on (0.0.0.0: every interface)"
    )
    console.add_argument(
        "--token-file", metavar="FILE",
        help="read the token from FILE (made, readable by its owner alone, when missing); without it, a new token each run",
    )  # fmt: skip
    console.add_argument("--nats", metavar="URL", help=NATS_HELP)
    console.add_argument(
        "--db", metavar="PATH", help="the read models' SQLite file (default: $LLMGW_DB, else the local llmgw up's)"
    )
    console.add_argument(
        "--creds", metavar="FILE",
        help="the console's NATS credential (`llmgw creds issue console NAME`): it may publish only the actions the "
        "console offers (default: the local llmgw up's, creds/console-local.creds)",
    )  # fmt: skip
    console.add_argument("-v", "--verbose", action="store_true", help="log at debug level, with tracebacks")
    console.set_defaults(func=cmd_console)

    from . import ctl_parsers

    ctl_parsers.add_parser(sub)
    from . import creds

    creds.add_parser(sub)

    projections = sub.add_parser("projections", help="the SQLite read models: rebuild them from the log")
    projections_sub = projections.add_subparsers(dest="what", required=True, metavar="ACTION", help="what to do")
    rebuild = projections_sub.add_parser(
        "rebuild", help="make the read models afresh from the whole log (a running projector moves to the new file)"
    )
    rebuild.add_argument("--nats", metavar="URL", help=NATS_HELP)
    rebuild.add_argument("--db", metavar="PATH", help="the SQLite file (default: $LLMGW_DB, else the local llmgw up's)")
    rebuild.add_argument("--creds", metavar="FILE", help="NATS credential, a .creds file (default: $LLMGW_CREDS, else the local llmgw up's)")
    rebuild.add_argument("-v", "--verbose", action="store_true", help="log at info level")
    rebuild.set_defaults(func=cmd_projections_rebuild)

    replay = sub.add_parser("replay", help="fold the log and show any moment of it, or verify its decisions")
    replay.add_argument(
        "file", nargs="?", metavar="FILE", help="a log file written by --export (default: the live log, from NATS)"
    )
    replay.add_argument("--nats", metavar="URL", help=NATS_HELP)
    replay.add_argument("--creds", metavar="FILE", help="NATS credential, a .creds file (default: $LLMGW_CREDS, else the local llmgw up's)")
    replay.add_argument("--at", metavar="SEQ|TIME", help="stop at this sequence number or time (ISO 8601 or Unix seconds)")
    who = replay.add_mutually_exclusive_group()
    who.add_argument("--model", help="the history of one model")
    who.add_argument("--replica", help="the history of one replica")
    who.add_argument("--node", help="the history of one node")
    replay.add_argument("--verify", action="store_true", help="decide again at every recorded decision and compare")
    replay.add_argument("--quarantined", action="store_true", help="list the quarantined events")
    replay.add_argument("--export", metavar="FILE", help="write the log to a file")
    replay.add_argument("--json", action="store_true", help="JSON for tools instead of tables")
    replay.add_argument(
        "--what-if", metavar="CATALOG", dest="what_if",
        help="decide the history again under this catalog file (its models, owners and policy: sections replace the "
        "log's) and report recorded vs what-if side by side, with the first decision that diverged",
    )  # fmt: skip
    replay.add_argument("--from", metavar="SEQ|TIME", dest="from_", help="--what-if: from this sequence or time (default: the log's start)")
    replay.add_argument("--to", metavar="SEQ|TIME", help="--what-if: to this sequence or time (default: the log's end)")
    replay.add_argument(
        "--ready-after", type=float, default=None, metavar="S",
        help="--what-if: a placed shard is ready this long after (default: as the log shows for its profile)",
    )  # fmt: skip
    replay.set_defaults(func=cmd_replay)

    from ..ctl.completion import SHELLS

    completion = sub.add_parser("completion", help="print a shell completion script: bash, zsh or fish")
    completion.add_argument("shell", nargs="?", choices=SHELLS, help="the shell: bash, zsh or fish")
    completion.add_argument("--names", metavar="KIND", help=argparse.SUPPRESS)  # what the scripts ask at a Tab
    completion.set_defaults(func=cmd_completion)

    events = sub.add_parser("events", help="the event contract: check or write events/schema/")
    events_sub = events.add_subparsers(dest="what", required=True, metavar="ACTION", help="what to do")
    schema = events_sub.add_parser("schema", help="check (default) or write events/schema/")
    schema.add_argument(
        "--write", action="store_true", help="write events/schema/ from the code instead of checking it"
    )
    schema.set_defaults(func=cmd_events)

    abouts = {**ABOUT, **ctl_parsers.ABOUT}
    for path, command in _every_command(p):
        _explained(command, abouts.get(path))
        command.set_defaults(_parser=command)  # the deepest command's wins: its usage for a bad flag
    return p


def main(argv: list[str] | None = None) -> None:
    from ..ctl.exits import Exit

    p = parser()
    args, extra = p.parse_known_args(argv)
    if extra and isinstance(getattr(args, "names", None), list) and not any(e.startswith("-") for e in extra):
        # `ctl get rs -o json smollm2-1`: names after a flag, as kubectl takes them (argparse
        # gives a positional list only the words before the first flag).
        args.names, extra = [*args.names, *extra], []
    if extra:
        # A flag that no command takes: say so with the usage of the command it was given to.
        getattr(args, "_parser", p).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`| head`): no traceback, and no second error when Python flushes at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(Exit.PIPE_CLOSED)
