"""`llmgw`'s --help: each command's description and examples (ABOUT; llmgw
ctl's are in ctl_parsers.py), every flag's default shown, and the table of
exit statuses under each command."""

from __future__ import annotations

import argparse


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
