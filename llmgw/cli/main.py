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
import os
import sys

from . import creds, ctl_parsers, parsers
from .help_text import ABOUT, Help, _every_command, _explained, version


def parser() -> argparse.ArgumentParser:
    from ..ctl.exits import table_text

    p = argparse.ArgumentParser(
        prog="llmgw", formatter_class=Help,
        description="A GPU fleet as one LLM service, folded from an event log on NATS JetStream.",
        epilog="examples:\n  llmgw up\n  llmgw ctl get replicas\n  llmgw ctl apply -f deploy/catalog.cpu.yaml --wait\n"
        "  llmgw COMMAND --help\n\n" + table_text(),
    )  # fmt: skip
    p.add_argument("--version", action="version", version=f"llmgw {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of these (llmgw COMMAND --help says more)")

    parsers.add_up(sub)
    parsers.add_control(sub)
    parsers.add_agent(sub)
    parsers.add_gateway(sub)
    parsers.add_console(sub)
    ctl_parsers.add_parser(sub)
    creds.add_parser(sub)
    parsers.add_projections(sub)
    parsers.add_replay(sub)
    parsers.add_completion(sub)
    parsers.add_events(sub)

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
