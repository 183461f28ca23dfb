"""`llmgw ctl`: the operator's commands (a minimal set; the full CLI reads
projections and is its own piece of work)."""

from __future__ import annotations

import itertools
import sys
import time
import uuid

from ..bus import read_log
from ..core import events as ev
from ..core.fold import apply
from ..core.state import State
from ..ctl.catalog_file import CatalogError, load


def add_parser(sub) -> None:
    ctl = sub.add_parser("ctl", help="operate the fleet")
    ctl.add_argument("--nats", help="NATS URL (default $LLMGW_NATS or the local llmgw up)")
    verbs = ctl.add_subparsers(dest="verb", required=True)
    apply_ = verbs.add_parser("apply", help="publish the models of a catalog file that changed")
    apply_.add_argument("-f", "--file", required=True)
    delete = verbs.add_parser("delete", help="remove a model from the catalog")
    delete.add_argument("kind", choices=["model"])
    delete.add_argument("name")
    from .main import cmd_ctl

    ctl.set_defaults(func=cmd_ctl)


async def _state(bus) -> State:
    state = State()
    for seq, subject, data in await read_log(bus):
        apply(state, seq, subject, data)
    return state


async def run(args, url: str) -> int:
    from ..bus.nats import NatsBus

    specs: list[ev.ModelSpec] = []
    if args.verb == "apply":
        try:
            specs = load(args.file)  # before connecting: a bad file publishes nothing
        except CatalogError as e:
            print(f"llmgw ctl apply: {e}", file=sys.stderr)
            return 2
    try:
        bus = await NatsBus.connect(url, name="llmgw-ctl")
    except ConnectionError as e:
        print(f"llmgw ctl: {e}", file=sys.stderr)
        return 3
    ids = (f"ctl-{uuid.uuid4().hex[:12]}-{n}" for n in itertools.count())
    try:
        await bus.wait_for_streams(timeout=10)
        state = await _state(bus)
        if args.verb == "apply":
            changed = 0
            for spec in specs:
                current = state.models.get(spec.name)
                if current is not None and current.spec == spec:
                    print(f"model {spec.name} unchanged")
                    continue
                event = ev.ModelApplied(at=time.time(), model=spec)
                seq = await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=next(ids))
                print(f"model {spec.name} {'configured' if current else 'created'} (event {seq})")
                changed += 1
            return 0
        if args.verb == "delete":
            if args.name not in state.models:
                print(f"llmgw ctl delete: there is no model {args.name}", file=sys.stderr)
                return 1
            event = ev.ModelRemoved(at=time.time(), name=args.name)
            seq = await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=next(ids))
            print(f"model {args.name} deleted (event {seq})")
            return 0
    except TimeoutError as e:
        print(f"llmgw ctl: {e}", file=sys.stderr)
        return 3
    finally:
        await bus.close()
    return 0
