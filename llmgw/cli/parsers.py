"""The parsers of `llmgw`'s subcommands, one function each (llmgw ctl's are
ctl_parsers.py, llmgw creds' creds.py): their flags, with defaults from the
components' config objects, and the command each runs (commands.py)."""

from __future__ import annotations

import argparse
import math

from ..console.config import DEFAULT_PORT as CONSOLE_PORT
from ..ctl.locate import DEFAULT_NATS
from .commands import (
    cmd_agent, cmd_completion, cmd_console, cmd_control, cmd_events, cmd_gateway, cmd_projections_rebuild, cmd_replay,
    cmd_up,
)  # fmt: skip


def _engine_ports_help() -> str:
    from ..core.contract.limits import LIMITS

    return (
        f"the ports the agent's engines may listen on (default: the agent file's engine_ports, else "
        f"{LIMITS.engine_port_first}-{LIMITS.engine_port_last}); those another program holds are found and not handed out"
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


def _share(text: str) -> float:
    """A share of a whole: above 0, at most 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a share is a number, not {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"a share is above 0 and at most 1 (0.5: half), not {text}")
    return value



NATS_HELP = "NATS URL(s), comma-separated (default: $LLMGW_NATS, else the local llmgw up's, else %s)" % DEFAULT_NATS
CREDS_HELP = "NATS credential, a .creds file (default: $LLMGW_CREDS, else the local llmgw up's)"


def _verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="store_true", help="log at debug level, with tracebacks")


def add_up(sub) -> None:
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


def add_control(sub) -> None:
    from ..control.config import LEASE_TTL_S, METRICS_LISTEN, NODE_GRACE_S
    from ..control.rates import NODE_BURST, NODE_RATE, NODE_RATE_WINDOW_S
    from ..core.contract.limits import LIMITS

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
        "--mass-silence", type=_share, default=LIMITS.mass_silence, metavar="SHARE",
        help="more than this share of the ready nodes silent at once (and more than one) is taken as trouble of "
        "the bus, and none of them is declared lost (1: never held back)",
    )  # fmt: skip
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
    control.add_argument("--creds", metavar="FILE", help=CREDS_HELP)
    control.add_argument(
        "--signing-key", metavar="FILE",
        help="the seed it signs agents' commands with (default: the local llmgw up's creds/keys/commands.nk; none: unsigned)",
    )  # fmt: skip
    _verbose(control)
    control.set_defaults(func=cmd_control)


def add_agent(sub) -> None:
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
    agent.add_argument("--creds", metavar="FILE", help=CREDS_HELP)
    agent.add_argument(
        "--command-key", metavar="KEY|FILE",
        help="the control plane's public command key (N...), or a file holding it (creds/commands.pub): only commands "
        "signed with it are obeyed (default: the agent file's command_key, $LLMGW_COMMAND_KEY, else the local llmgw up's)",
    )  # fmt: skip
    _verbose(agent)
    agent.set_defaults(func=cmd_agent)


def add_gateway(sub) -> None:
    from ..gateway import config as gateway_config

    gateway = sub.add_parser("gateway", help="serve the OpenAI API and route to ready replicas (stateless: run as many as needed)")
    gateway.add_argument("--nats", metavar="URL", help=NATS_HELP)
    gateway.add_argument("--creds", metavar="FILE", help=CREDS_HELP)
    gateway.add_argument("--name", help="the gateway's name in the load it reports (default: HOST-PORT)")
    gateway_config.add_arguments(gateway)  # --listen, --port, the limits and timeouts (llmgw/gateway/config.py)
    _verbose(gateway)
    gateway.set_defaults(func=cmd_gateway)


def add_console(sub) -> None:
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
    _verbose(console)
    console.set_defaults(func=cmd_console)


def add_projections(sub) -> None:
    projections = sub.add_parser("projections", help="the SQLite read models: rebuild them from the log")
    projections_sub = projections.add_subparsers(dest="what", required=True, metavar="ACTION", help="what to do")
    rebuild = projections_sub.add_parser(
        "rebuild", help="make the read models afresh from the whole log (a running projector moves to the new file)"
    )
    rebuild.add_argument("--nats", metavar="URL", help=NATS_HELP)
    rebuild.add_argument("--db", metavar="PATH", help="the SQLite file (default: $LLMGW_DB, else the local llmgw up's)")
    rebuild.add_argument("--creds", metavar="FILE", help=CREDS_HELP)
    rebuild.add_argument("-v", "--verbose", action="store_true", help="log at info level")
    rebuild.set_defaults(func=cmd_projections_rebuild)


def add_replay(sub) -> None:
    replay = sub.add_parser("replay", help="fold the log and show any moment of it, or verify its decisions")
    replay.add_argument(
        "file", nargs="?", metavar="FILE", help="a log file written by --export (default: the live log, from NATS)"
    )
    replay.add_argument("--nats", metavar="URL", help=NATS_HELP)
    replay.add_argument("--creds", metavar="FILE", help=CREDS_HELP)
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


def add_completion(sub) -> None:
    from ..ctl.completion import SHELLS

    completion = sub.add_parser("completion", help="print a shell completion script: bash, zsh or fish")
    completion.add_argument("shell", nargs="?", choices=SHELLS, help="the shell: bash, zsh or fish")
    completion.add_argument("--names", metavar="KIND", help=argparse.SUPPRESS)  # what the scripts ask at a Tab
    completion.set_defaults(func=cmd_completion)


def add_events(sub) -> None:
    events = sub.add_parser("events", help="the event contract: check or write events/schema/")
    events_sub = events.add_subparsers(dest="what", required=True, metavar="ACTION", help="what to do")
    schema = events_sub.add_parser("schema", help="check (default) or write events/schema/")
    schema.add_argument(
        "--write", action="store_true", help="write events/schema/ from the code instead of checking it"
    )
    schema.set_defaults(func=cmd_events)
