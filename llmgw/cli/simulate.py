"""`llmgw agent --simulate`: one simulated node, or a fleet of them in one process.

    llmgw agent --simulate --name gpu-1 --gpus 8                  one node, its own agent credential
    llmgw agent --simulate --fleet 2000 --name 'sim-{i:04d}'      2,000 nodes over one connection
    llmgw agent --simulate --fleet-file fleet.yaml                nodes, shapes and racks from a file

A fleet connects with a `fleet` credential (bus/auth.py: it may speak for
any node on llmgw.agent.*, nothing else), issued on first use in a local
`llmgw up`'s folder as every component's is, or given with --creds.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from ..agent import fleet as fleet_mod
from .running import _component, _fail, _nats_url, _run_until_signalled, _setup_logging

FLEET_CREDENTIAL = "sim"  # the name of the fleet credential a local llmgw up issues


def _label_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"{text!r}: a label is KEY=VALUE (llmgw.io/rack=r4-12)")
    return key, value


def add_arguments(agent) -> None:
    """The flags of a simulated fleet (`llmgw agent --simulate --fleet N`)."""
    agent.add_argument(
        "--fleet", type=int, metavar="N",
        help="simulated: N nodes in this one process over --connections shared connections; --name is then a "
        f"pattern ({{i}}: 1..N; default {fleet_mod.NAME_PATTERN})",
    )  # fmt: skip
    agent.add_argument(
        "--fleet-file", metavar="FILE", help="simulated: the fleet's nodes, GPU shapes and labels from a YAML file (llmgw/agent/fleet.py)"
    )
    agent.add_argument(
        "--label", type=_label_arg, action="append", default=[], metavar="KEY=VALUE",
        help="simulated: a node label, e.g. llmgw.io/rack=r4-12 (repeat for more); with --fleet a pattern with {i}, "
        "{rack}, {pdu}, besides llmgw.io/rack=rack-{rack:04d} and llmgw.io/pdu=pdu-{pdu:04d} (a --label of that key replaces them)",
    )  # fmt: skip
    agent.add_argument(
        "--nodes-per-rack", type=int, default=fleet_mod.NODES_PER_RACK, metavar="N", help="simulated fleet: nodes to a rack ({rack})"
    )
    agent.add_argument(
        "--nodes-per-pdu", type=int, default=fleet_mod.NODES_PER_PDU, metavar="N", help="simulated fleet: nodes to a PDU ({pdu})"
    )
    agent.add_argument("--gpu-model", default="SIM-80GB", metavar="NAME", help="the model of a simulated node's GPUs")
    agent.add_argument("--connections", type=int, default=1, metavar="K", help="simulated fleet: NATS connections its nodes share")
    agent.add_argument("--heartbeat", type=float, default=1.0, metavar="S", help="simulated: seconds between a node's heartbeats")
    agent.add_argument(
        "--no-serve", action="store_true",
        help="simulated: ready shards serve no HTTP engine (thousands of nodes, nothing asking them)",
    )  # fmt: skip


def _shapes(args) -> list[fleet_mod.NodeShape]:
    from ..yamlfile import YamlFileError

    if args.fleet_file:
        try:
            return fleet_mod.load_fleet_file(args.fleet_file)
        except YamlFileError as e:
            _fail(f"llmgw agent: {e}", 2)
    labels = dict(args.label) if args.label else None
    try:
        return fleet_mod.shapes_from_pattern(
            args.fleet, args.name or fleet_mod.NAME_PATTERN, gpus=args.gpus, gpu_memory_gb=args.gpu_memory,
            gpu_model=args.gpu_model, labels=labels, per_rack=args.nodes_per_rack, per_pdu=args.nodes_per_pdu,
        )  # fmt: skip
    except fleet_mod.FleetError as e:
        _fail(f"llmgw agent: {e}", 2)


def cmd_simulated(args) -> None:
    from ..agent.protocol import MAX_TERM_JUMP
    from ..bus.nats import NatsBus
    from .running import _verifier

    many = args.fleet is not None or args.fleet_file
    key_in_file, max_term_jump = "", MAX_TERM_JUMP
    if many:
        if args.connections < 1:
            _fail("llmgw agent: --connections: at least 1", 2)
        if args.engine_ports and not args.no_serve:
            # Each node's engines would listen on the same ports of this one host.
            _fail("llmgw agent: --engine-ports with a fleet needs --no-serve: its nodes share this host's ports", 2)
        shapes = _shapes(args)
        explicit = args.creds or os.environ.get("LLMGW_CREDS")
        who = _component(args, "fleet", None if explicit else FLEET_CREDENTIAL)
        label = f"fleet-{who or 'sim'}"
    else:
        args.name = _component(args, "agent", args.name)  # an agent's credential names its node
        if not args.name:
            _fail("llmgw agent: a simulated node needs --name", 2)
        labels = {}
        if args.agent_file:  # a simulated node's labels (its site, rack, PDU) and command key from an agent file
            from ..agent import agentfile

            try:
                loaded = agentfile.load(args.agent_file)
            except agentfile.AgentFileError as e:
                _fail(f"llmgw agent: {e}", 2)
            labels, key_in_file, max_term_jump = dict(loaded.labels), loaded.command_key, loaded.max_term_jump
        labels.update(args.label)  # the agent file's, then --label's
        shapes = [
            fleet_mod.NodeShape(
                name=args.name, gpus=args.gpus, gpu_memory_gb=args.gpu_memory, gpu_model=args.gpu_model, labels=labels
            )
        ]
        label = args.name
    command_key = _verifier(args, key_in_file)  # whose commands its nodes obey (agent/protocol.py)
    _setup_logging(args.verbose)
    url = _nats_url(args)

    async def main(stop: asyncio.Event) -> None:
        buses = []
        try:
            for k in range(args.connections if many else 1):
                buses.append(await NatsBus.connect(url, name=f"llmgw-agent-{label}-{k}", forever=True, stop=stop, creds=args.creds))
            fleet = fleet_mod.Fleet(
                buses, shapes, spread=fleet_mod.START_SPREAD_S if many else 0.0,
                loading_after=args.loading_after, ready_after=args.ready_after, fail_models=frozenset(args.fail_model),
                never_start=args.never_start,
                heartbeat=args.heartbeat, serve=not args.no_serve, watts_per_gpu=args.watts_per_gpu,
                power_limit_w=args.gpu_power, power_interval_s=args.power_interval, command_key=command_key,
                max_term_jump=max_term_jump, engine_ports=args.engine_ports,
            )  # fmt: skip
            # whose commands they obey, once for all
            next(iter(fleet.agents.values())).gate.say_how(f"{len(shapes)} simulated nodes" if many else "")
            await fleet.run(stop)
        finally:
            for bus in buses:
                await bus.close()

    _run_until_signalled(main)
