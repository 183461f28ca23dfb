"""`llmgw ctl label` and `llmgw ctl facility`: where nodes are, held domains.

Changes are events on the log (NodeLabeled, DomainHeld, DomainReleased),
published and then waited for in the read models (read-your-writes), as
every `ctl` change is; `facility hold --drain --wait` waits until nothing is
left to move out of the domain. The rules they feed are core/scheduling/facility.py's.
"""

from __future__ import annotations

import time

from ..core.contract import events as ev
from ..core.rules import admission
from ..core.folding import facility_facts
from ..ctl import views
from ..ctl.config import CONFIG
from ..ctl.readmodels import ReadModels

ABOUT = {
    "ctl label": (
        "Set or remove a node's location labels (site, room, row, rack, pdu) or its pool: KIND=NAME sets, KIND-\n"
        "removes. Set this way they win over the node's agent file until removed, when the agent's show again;\n"
        "a pool counts only when set this way (or by `ctl node admit`), unless the policy says admission: open.\n"
        "Placement spreads a model's replicas across racks and PDUs, and holds and power caps name domains\n"
        "of these labels (KIND/NAME).",
        ["llmgw ctl label gpu-1 rack=r4-12 pdu=pdu-a", "llmgw ctl label gpu-1 rack-",
         "llmgw ctl label gpu-1 llmgw.io/row=row-4", "llmgw ctl label gpu-1 pool=secure"],
    ),
    "ctl facility": (
        "The facility's domains (KIND/NAME: site, room, row, rack, pdu): nodes in each, GPUs used and free,\n"
        "the draw counted (measured, plus declared or derived for shards not measured yet) and its power cap\n"
        "(the catalog's facility.budgets), held or not, why and since when. `hold` and `release` change them.",
        ["llmgw ctl facility", "llmgw ctl facility -o json", "llmgw ctl facility hold rack/r4-12 --reason maintenance",
         "llmgw ctl facility release rack/r4-12"],
    ),
    "ctl facility hold": (
        "Hold a domain: nothing new is placed there. With --drain, its replicas are also moved: each is\n"
        "replaced elsewhere first (beside itself, like a restart with surge) and stopped once its replacement\n"
        "serves; one that fits nowhere else stays and says why. With --wait, returns once nothing is left to move.",
        ["llmgw ctl facility hold rack/r4-12 --reason 'PDU swap'",
         "llmgw ctl facility hold pdu/pdu-a --drain --reason maintenance --wait"],
    ),
    "ctl facility release": (
        "Release a held domain: placement may use it again (what was moved out stays where it went).",
        ["llmgw ctl facility release rack/r4-12"],
    ),
}


def add_parsers(verb, where_flags, wait_flags, dry_run_flags) -> None:
    """The verbs, on ctl's subparsers (`verb(name, help)` makes one)."""
    label = verb("label", "set (KIND=NAME) or remove (KIND-) a node's location labels or its pool")
    label.add_argument("node", metavar="NODE", help="the node (`llmgw ctl get nodes` lists them)")
    label.add_argument(
        "labels", nargs="+", metavar="KIND=NAME|KIND-",
        help=f"KIND one of {', '.join((*facility_facts.KINDS, *admission.KEYS))} (or its whole label, llmgw.io/rack); "
        "KIND- removes it",
    )
    wait_flags(label, "(nothing more to wait for: the read models show the location)")

    fac = verb("facility", "list the facility's domains; hold or release one")
    fac.add_argument("-o", "--output", choices=views.OUTPUTS, default="table",
                     help="table, wide (with when each hold began, whole), name, json or yaml")
    fac.add_argument("--timeout", type=float, default=CONFIG.catch_up_timeout_s, metavar="S",
                     help="seconds to wait for the read models to reach the end of the log")
    subs = fac.add_subparsers(dest="facility_verb", metavar="ACTION", help="hold or release (none: list the domains)")
    hold = subs.add_parser("hold", help="place nothing new in a domain (--drain: move what runs there)")
    where_flags(hold)
    hold.add_argument("domain", metavar="DOMAIN", help="KIND/NAME, e.g. rack/r4-12 or pdu/pdu-a")
    hold.add_argument("--drain", action="store_true", help="also move its replicas elsewhere (each replaced first)")
    hold.add_argument("--reason", default="", metavar="TEXT", help="why, shown wherever the hold refuses a placement")
    wait_flags(hold, "with --drain, no replica is left to move out of it (moved, or staying with a reason)")
    dry_run_flags(hold)
    release = subs.add_parser("release", help="let placement use a held domain again")
    where_flags(release)
    release.add_argument("domain", metavar="DOMAIN", help="the held domain, KIND/NAME")
    wait_flags(release, "(nothing more to wait for: the read models show it released)")
    dry_run_flags(release)


async def _dry_run_facility(args, where_, action: str) -> int:
    """`facility hold|release --dry-run`: what the hold (or release) would
    make the control plane do, nothing published (cli/ctl.py's _dry_run)."""
    from .ctl import _dry_run
    from .ctl_errors import NOT_FOUND, CtlError

    def as_if(state):
        if action == "release":
            if args.domain not in state.holds:
                raise CtlError(f"facility release: {args.domain} is not held", NOT_FOUND)
            return [ev.DomainReleased(at=0.0, domain=args.domain)], []
        return [ev.DomainHeld(at=0.0, domain=args.domain, drain=args.drain, reason=args.reason)], []

    how = " --drain" if action == "hold" and args.drain else ""
    return await _dry_run(args, where_, f"facility {action} {args.domain}{how}", as_if)


def _label_name(key: str) -> str:
    """A location's whole label name, or the pool's (the operator's to set: core/rules/admission.py)."""
    return facility_facts.label_name(key) or admission.label_name(key)


def parse_labels(items: list[str]) -> tuple[dict[str, str], list[str]]:
    """KIND=NAME and KIND- arguments as (set, remove); ValueError says what is wrong."""
    set_: dict[str, str] = {}
    remove: list[str] = []
    kinds = ", ".join((*facility_facts.KINDS, *admission.KEYS))
    for item in items:
        if item.endswith("-") and "=" not in item:
            key = item[:-1]
            if not _label_name(key):
                raise ValueError(f"{item!r}: {key!r} is not a location or pool ({kinds})")
            remove.append(_label_name(key))
            continue
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise ValueError(f"{item!r}: give KIND=NAME to set or KIND- to remove")
        if not _label_name(key):
            raise ValueError(f"{item!r}: {key!r} is not a location or pool ({kinds})")
        if "/" in value or len(value) > 64:
            raise ValueError(f"{item!r}: a name without '/', at most 64 characters")
        set_[_label_name(key)] = value
    return set_, remove


def in_domain(node: dict, domain: str) -> bool:
    kind, name = facility_facts.split_domain(domain)
    return node.get("location", {}).get(kind) == name


def drained_effect(models: ReadModels, domain: str):
    """What `hold --drain --wait` waits for: every replica with a shard in
    the domain gone, or refused (staying, with its reason)."""
    from .ctl_effect import Effect

    nodes = {n["name"] for n in models.nodes() if in_domain(n, domain)}
    left = [r for r in models.replicas() if set(r["nodes"]) & nodes and r["state"] != "stopping"]
    moving = [r for r in left if not r["restart"].startswith("refused")]
    stays = [r for r in left if r["restart"].startswith("refused")]
    where = f"{domain}: {len(moving)} replica(s) to move" + (
        f", {len(stays)} staying ({stays[0]['id']}: {stays[0]['restart_reason']})" if stays else "")
    return Effect(not moving, "", where)


async def cmd_label(args, where) -> int:
    from .ctl_bus import _fresh, _publish
    from .ctl_effect import _took_effect
    from .ctl_errors import BAD_INPUT, NOT_FOUND, OK, CtlError, did_you_mean

    try:
        set_, remove = parse_labels(args.labels)
    except ValueError as e:
        raise CtlError(f"label: {e}", BAD_INPUT)
    models = (await _fresh(where, CONFIG.catch_up_timeout_s)).models
    if models.node(args.node) is None:
        raise CtlError(f"label: there is no node {args.node}{did_you_mean(args.node, models.names('node'))} "
                       f"(`llmgw ctl get nodes` lists them)", NOT_FOUND)
    seq = await _publish(where, ev.NodeLabeled(at=time.time(), node=args.node, set=set_, remove=remove))
    said = " ".join([f"{k.removeprefix(facility_facts.PREFIX)}={v}" for k, v in set_.items()]
                    + [f"{k.removeprefix(facility_facts.PREFIX)}-" for k in remove])
    print(f"node {args.node} labeled {said} (event {seq})", flush=True)
    await _took_effect(args, where, seq, f"the labels of {args.node}", None)
    return OK


async def cmd_facility(args, where) -> int:
    from .ctl_bus import _fresh, _publish
    from .ctl_effect import _took_effect
    from .ctl_errors import BAD_INPUT, NOT_FOUND, OK, CtlError

    action = getattr(args, "facility_verb", None)
    if action is None:
        fresh = await _fresh(where, args.timeout)
        text = views.render("domains", fresh.models.domains(), args.output, width=views.terminal_width())
        if text:
            print(text, flush=True)
        return fresh.status
    problem = facility_facts.domain_problem(args.domain)
    if problem:
        raise CtlError(f"facility {action}: {problem}", BAD_INPUT)
    if args.dry_run:
        return await _dry_run_facility(args, where, action)
    models = (await _fresh(where, CONFIG.catch_up_timeout_s)).models
    rows = {r["domain"]: r for r in models.domains()}
    if action == "release":
        if not rows.get(args.domain, {}).get("held"):
            raise CtlError(f"facility release: {args.domain} is not held", NOT_FOUND)
        seq = await _publish(where, ev.DomainReleased(at=time.time(), domain=args.domain))
        print(f"{args.domain} released (event {seq}): placement may use it again", flush=True)
        await _took_effect(args, where, seq, f"the release of {args.domain}", None)
        return OK
    if args.domain not in rows:
        print(f"warning: no node is in {args.domain} now (`llmgw ctl facility` lists the domains); held all the same",
              flush=True)
    seq = await _publish(where, ev.DomainHeld(at=time.time(), domain=args.domain, drain=args.drain, reason=args.reason))
    how = ": its replicas will be moved elsewhere, each replaced first" if args.drain else ": nothing new is placed there"
    print(f"{args.domain} held (event {seq}){how}", flush=True)
    await _took_effect(args, where, seq, f"the hold of {args.domain}",
                       (lambda m: drained_effect(m, args.domain)) if args.drain else None)
    return OK
