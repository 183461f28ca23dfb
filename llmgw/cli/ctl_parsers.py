"""`llmgw ctl`'s command line: each verb's parser and flags, and each
verb's description and examples (ABOUT, shown by --help: llmgw/cli/help_text.py).
The verbs themselves are ctl.py (and get.py, facility.py, node_ctl.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..ctl import views
from ..ctl.config import CONFIG
from . import facility as facility_cli
from . import get as get_cli
from . import node_ctl
from .ctl_errors import did_you_mean


def kind_type(allowed: tuple[str, ...]) -> Callable[[str], str]:
    """An argparse type: a kind by any of its names (plural, singular, short), as its plural."""

    def parse(text: str) -> str:
        kind = views.ALIASES.get(text.lower())
        if kind in allowed:
            return kind
        names = [n for k in allowed for n in (k, *views.KIND_NAMES[k])]
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a kind here{did_you_mean(text.lower(), names)}; "
            f"give one of {', '.join(f'{k} ({views.SINGULAR[k]}, {views.KIND_NAMES[k][1]})' for k in allowed)}"
        )

    parse.__name__ = "kind"
    parse.completions = [n for k in allowed for n in (k, *views.KIND_NAMES[k])]  # type: ignore[attr-defined]
    return parse


CATALOG_KINDS = {
    "model": ("models", "mo"), "owner": ("owners",), "apikey": ("apikeys", "api-key", "api-keys", "key", "keys"),
}  # fmt: skip


def _catalog_kind(text: str) -> str:
    """What `delete` removes, by any of its names."""
    for kind, names in CATALOG_KINDS.items():
        if text.lower() in (kind, *names):
            return kind
    every = [n for kind, names in CATALOG_KINDS.items() for n in (kind, *names)]
    raise argparse.ArgumentTypeError(f"{text!r} is not model, owner or apikey{did_you_mean(text.lower(), every)}")


_catalog_kind.completions = list(CATALOG_KINDS)  # type: ignore[attr-defined]


def _examples(*lines: str) -> list[str]:
    return [f"llmgw ctl {line}" for line in lines]


# Per command: its description and examples (see llmgw/cli/help_text.py, which shows them in --help).
ABOUT = {
    "ctl": (
        "Operate the fleet: publish a catalog, read what runs, restart, retry, read an engine's log.\n"
        "Reads come from the read models (SQLite, kept by the projector that llmgw up runs); every change\n"
        "returns once the read models include it (read-your-writes), and with --wait once it took effect.\n"
        "The local llmgw up is found by itself (.llmgw/up.json here or in a folder above); elsewhere give\n"
        "--nats URL (or $LLMGW_NATS) and --db PATH (or $LLMGW_DB).\n\n"
        "kinds: models (model, mo), nodes (node, no), replicas (replica, rs), decisions (decision, dec),\n"
        "quotas (quota, q), preemptions (preemption, pre), domains (domain, dom), owners (owner, own),\n"
        "apikeys (apikey, keys), leader (lead), policy (pol). Shell completion: `llmgw completion bash|zsh|fish`",
        _examples("get replicas", "get rs -o wide", "get decisions --watch --limit 3",
                  "apply -f deploy/catalog.cpu.yaml --wait", "describe replica smollm2-1"),
    ),
    "ctl apply": (
        "Publish the models, owners, API keys and policy of a catalog file that changed. A file with an error\n"
        "names the file, line and field of every error and publishes nothing. Returns once the read models\n"
        "include the change; with --wait, once every model of the file is placed and ready (or says why not).\n"
        "With --dry-run, publishes nothing and prints what the file changes (before → after) and what the\n"
        "control plane would then decide, in order, until the fleet settles.",
        _examples("apply -f deploy/catalog.cpu.yaml", "apply -f catalog.yaml --wait --timeout 600",
                  "apply -f catalog.yaml --dry-run", "apply -f catalog.yaml --dry-run -o json --ready-after 30"),
    ),
    "ctl delete": (
        "Remove a model (its replicas are drained and stopped), an owner or an API key from the catalog.\n"
        "With --wait, a model's return waits until its replicas are gone.",
        _examples("delete model qwen-8b --wait", "delete apikey team-a"),
    ),
    "ctl get": (
        "List things from the read models: models, nodes, replicas, decisions, quotas, preemptions or domains;\n"
        "and, live from the log, the catalog's owners and API keys (names, owners, limits; never a hash), who\n"
        "leads (leader) and the numbers the rules decide with (policy, beside their defaults). With names, only\n"
        "those (-o json: one object itself). Kinds go by any of their names (plural, singular or short: mo, no,\n"
        "rs, dec, q, pre, dom, own, keys, lead, pol). -l selects (labels, owner, class, state, any field),\n"
        "--sort-by orders, -o also takes jsonpath=TEMPLATE and custom-columns=HEADER:PATH,... as kubectl does\n"
        "(a listing is {\"kind\": \"List\", \"items\": [...]}, the rows as -o json shows them). It first waits (up\n"
        "to --timeout) for the read models to reach the end of the log. Tables fit the terminal; -o wide shows\n"
        "all of them.",
        _examples("get replicas", "get replica smollm2-1 -o yaml", "get rs --model smollm2 -o wide", "get no -o name",
                  "get rs -l state=ready,owner=org/team", "get mo -l 'class in (critical,standard)'",
                  "get no -l rack=r4-12", "get rs --sort-by .placed_at",
                  "get rs -o jsonpath='{range .items[*]}{.id}{\"\\t\"}{.state}{\"\\n\"}{end}'",
                  "get rs -o custom-columns=ID:.id,NODE:.nodes[0],STATE:.state", "get decisions --limit 10",
                  "get dec --watch", "get models --watch -o json", "get owners", "get apikeys",
                  "get replicas --no-headers | wc -l", "get policy"),
    ),
    "ctl describe": (
        "One model, replica or node: its state now and its history, every decision with its reason.",
        _examples("describe model smollm2", "describe rs smollm2-1", "describe node gpu-1 -o yaml"),
    ),
    "ctl restart": (
        "Replace replicas with new ones: each beside itself first (surge), then drained; or stopped first\n"
        "(--in-place). With --wait, returns once they are replaced and their models ready again.",
        _examples("restart qwen-8b-1 qwen-8b-2 --max-surge 1", "restart smollm2-1 --in-place --wait",
                  "restart qwen-8b-1 --dry-run"),
    ),
    "ctl retry": (
        "Try again a model parked after its replicas kept failing to start (fix the cause first: its\n"
        "`describe` says what failed). With --wait, returns once it is placed and ready.",
        _examples("retry qwen-8b --wait"),
    ),
    "ctl logs": (
        "The engine log of a replica, asked of the agents of its nodes (logs stay on the nodes).",
        _examples("logs smollm2-1", "logs smollm2-1 -n 20 -f"),
    ),
    "ctl explain-placement": (
        "For every node and profile, why a replica of the model would or would not go there: the next one\n"
        "when the model has fewer than it wants, else a further one. Folded from the log itself.",
        _examples("explain-placement llama-70b", "explain-placement smollm2 -o json"),
    ),
    **facility_cli.ABOUT,
    **node_ctl.ABOUT,
}


READ_TIMEOUT_HELP = (
    "seconds the whole command may take, whatever NATS does (first it waits for the read models to "
    "reach the end of the log; past it, they are shown as they are, exit 3 or 4)"
)


def add_parser(sub) -> None:
    ctl = sub.add_parser("ctl", help="operate the fleet: apply a catalog, get and describe what runs")
    _where_flags(ctl, None)
    verbs = ctl.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of these (llmgw ctl VERB --help says more)")

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help)
        _where_flags(p, argparse.SUPPRESS)  # also accepted after the verb
        return p

    apply_ = verb("apply", "publish the models, owners and API keys of a catalog file that changed")
    apply_.add_argument("-f", "--file", required=True, metavar="FILE", help="the catalog (YAML; see deploy/catalog.example.yaml)")
    _wait_flags(apply_, "every model of the file is placed and ready")
    dry_run_flags(apply_)

    delete = verb("delete", "remove a model, an owner or an API key from the catalog")
    delete.add_argument(
        "kind", type=_catalog_kind, metavar="KIND", help="model, owner or apikey (or models, mo, owners, apikeys, api-key)"
    )
    delete.add_argument("name", metavar="NAME", help="the model's, owner's or key's name")
    _wait_flags(delete, "a model's replicas are gone")

    get_cli.add_parser(verb, kind_type, READ_TIMEOUT_HELP)

    describe = verb("describe", "one model, replica or node: its state now and its history, with reasons")
    describe.add_argument(
        "kind", type=kind_type(("models", "replicas", "nodes")), metavar="KIND",
        help="model, replica or node (or plural, or mo, rs, no)",
    )  # fmt: skip
    describe.add_argument("name", metavar="NAME", help="the model's, replica's or node's name")
    describe.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text", help="text for people, json or yaml")
    describe.add_argument("--timeout", type=float, default=CONFIG.catch_up_timeout_s, metavar="S", help=READ_TIMEOUT_HELP)

    restart = verb("restart", "replace replicas: beside themselves (surge), or in place")
    restart.add_argument("replicas", nargs="+", metavar="REPLICA", help="the replicas to replace (ready ones)")
    restart.add_argument("--in-place", action="store_true", help="stop each first, then start its replacement")
    restart.add_argument(
        "--max-surge", type=int, default=0, metavar="N", help="replaced beside themselves at once (0 and 0: one at a time)"
    )
    restart.add_argument(
        "--max-unavailable", type=int, default=0, metavar="N", help="stopped first at once (0 and 0: one at a time)"
    )
    _wait_flags(restart, "they are replaced and their models ready again")
    dry_run_flags(restart)

    retry = verb("retry", "try again a model parked after its replicas kept failing to start")
    retry.add_argument("model", metavar="MODEL", help="the parked model")
    _wait_flags(retry, "it is placed and ready")

    logs = verb("logs", "the engine log of a replica, from the agents of its nodes")
    logs.add_argument("replica", metavar="REPLICA", help="the replica (`llmgw ctl get replicas` lists them)")
    logs.add_argument("-n", "--lines", type=int, default=100, metavar="N", help="the last N lines")
    logs.add_argument("-f", "--follow", action="store_true", help="then print lines as they are written (Ctrl-C ends)")

    explain = verb("explain-placement", "for every node, why a replica of a model would or would not go there")
    explain.add_argument("model", metavar="MODEL", help="the model (in the catalog)")
    explain.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text", help="text for people, json or yaml")

    facility_cli.add_parsers(verb, lambda p: _where_flags(p, argparse.SUPPRESS), _wait_flags, dry_run_flags)
    node_ctl.add_parsers(verb, lambda p: _where_flags(p, argparse.SUPPRESS), _wait_flags)

    from .commands import cmd_ctl

    ctl.set_defaults(func=cmd_ctl)


def _where_flags(p: argparse.ArgumentParser, default) -> None:
    p.add_argument("--nats", default=default, metavar="URL", help="NATS URL (default: $LLMGW_NATS, else the local llmgw up's)")
    p.add_argument(
        "--db", default=default, metavar="PATH", help="the read models' SQLite file (default: $LLMGW_DB, else the local llmgw up's)"
    )
    p.add_argument(
        "--creds", default=default, metavar="FILE",
        help="NATS credential (default: $LLMGW_CREDS, else the local llmgw up's creds/operator.creds)",
    )  # fmt: skip


def _wait_flags(p: argparse.ArgumentParser, effect: str) -> None:
    p.add_argument(
        "--wait", action="store_true",
        help=f"return once the change took effect: {effect} (progress on stderr; exit 5 if not in time or if it "
        f"cannot, with the reason). Without it: once the read models include the change",
    )  # fmt: skip
    p.add_argument(
        "--timeout", type=float, default=None, metavar="S",
        help=f"seconds the whole command may take, publishing and waiting, whatever NATS does (default: "
        f"{CONFIG.projected_timeout_s:g}, {CONFIG.effect_timeout_s:g} with --wait); NATS not answering in time is "
        f"exit 3, the read models not reaching the change exit 4, the change not taking effect exit 5",
    )  # fmt: skip


def dry_run_flags(p: argparse.ArgumentParser) -> None:
    """--dry-run and its options, for every command that changes the fleet."""
    p.add_argument(
        "--dry-run", action="store_true",
        help="publish nothing: fold the log, apply the change to a copy of the state and print what the control "
        "plane would decide until it settles (placements, stops, restarts, preemptions, waits), with simulated agents",
    )  # fmt: skip
    p.add_argument(
        "--ready-after", type=float, default=None, metavar="S",
        help="--dry-run: a placed shard is ready this long after (default: its profile's typical start time in the "
        "log, else 1 s)",
    )  # fmt: skip
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="--dry-run: text for people, or json")
