"""`--wait` in `llmgw ctl`: what every change does once published, waiting
until the read models include it and, with --wait, until it took effect in
the fleet (as the read models show it), saying how it stands as it goes;
and what "took effect" means for a model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import NamedTuple

from ..ctl.config import CONFIG
from ..ctl.locate import Where
from ..ctl.progress import Progress
from ..ctl.readmodels import NoReadModels, ReadModels
from .ctl_bus import _passed, _total, wait_projected
from .ctl_errors import NOT_AS_WANTED, UNREACHABLE, CtlError, say


class Effect(NamedTuple):
    done: bool
    impossible: str  # why it cannot take effect as things stand ("" when it may)
    where: str  # how it stands, for the progress lines


async def wait_effect(
    where: Where, check: Callable[[ReadModels], Effect], timeout: float, *, what: str, started: float | None = None
) -> None:
    """--wait: until `check` says the change took effect in the fleet (as the
    read models show it), saying how it stands whenever that changes (and
    about once a second while it waits); CtlError NOT_AS_WANTED if it cannot
    or does not in time."""
    if where.db is None:
        raise CtlError("--wait needs the read models: give --db (or run llmgw up)", UNREACHABLE)
    models = ReadModels(where.db)
    progress = Progress()
    if started is not None:  # the command's wait began earlier (for the read models)
        progress.started = started
    said = ""
    while True:
        try:
            effect = check(models)
        except NoReadModels:
            effect = Effect(False, "", "no read models yet")
        if effect.done:
            if progress.told:
                say(f"  {effect.where}")
            say(f"{what}: done in {progress.elapsed():.1f}s")
            return
        if effect.impossible:
            raise CtlError(f"{what}: cannot take effect: {effect.impossible}", NOT_AS_WANTED)
        waited = progress.elapsed()
        if waited >= timeout or _passed():
            raise CtlError(f"{what}: not done in {_total(timeout):g}s: {effect.where}", NOT_AS_WANTED)
        if effect.where != said or progress.due():
            said = effect.where
            progress.last = time.monotonic()
            progress.say(f"  waiting ({waited:.0f}s): {effect.where}")
        await asyncio.sleep(0.1)


def model_effect(models: ReadModels, name: str) -> Effect:
    """A model took effect: as many ready replicas as it wants, each running
    a profile of its catalog entry now, no restart pending; parked: it cannot."""
    m = models.model(name)
    if m is None:
        return Effect(False, "", f"{name}: not in the read models yet")
    if m["parked"]:
        return Effect(False, f"{name} is parked: {m['parked']} (fix it, then `llmgw ctl retry {name}`)", "")
    current = {p["fingerprint"] for p in m["profiles"]}
    reps = models.replicas(name)
    ready = [r for r in reps if r["state"] == "ready" and r["fingerprint"] in current and not r["restart"]]
    old = [r for r in reps if r["fingerprint"] not in current or r["restart"]]
    want = m["desired"]
    parts = [f"{name}: {len(ready)}/{want} ready"]
    for r in reps:
        if r in ready:
            continue
        why = f": {r['reason']}" if r["reason"] and r["state"] != "ready" else ""
        restart = f", restart {r['restart']}" if r["restart"] else ""
        parts.append(f"{r['id']} {r['state']}{restart}{why}")
    if m["waiting"]:
        parts.append(f"waiting: {m['waiting']}")
    refused = [r for r in reps if r["restart"].startswith("refused")]
    if refused:
        return Effect(False, f"the restart of {refused[0]['id']} was {refused[0]['restart']}", "; ".join(parts))
    return Effect(len(ready) >= want and not old, "", "; ".join(parts))


def _timeout(args, waiting_for_effect: bool) -> float:
    if args.timeout is not None:
        return args.timeout
    return CONFIG.effect_timeout_s if waiting_for_effect else CONFIG.projected_timeout_s


async def _took_effect(args, where: Where, seq: int, what: str, check: Callable[[ReadModels], Effect] | None) -> None:
    """What every change does once published: wait until the read models
    include it (read-your-writes; skipped when no read models are known and
    --wait was not given); with --wait, then until it took effect."""
    if where.db is None and not args.wait:
        return
    started = time.monotonic()
    timeout = _timeout(args, args.wait)
    if seq:
        await wait_projected(where.db, seq, timeout, what=what)
    if args.wait and check is not None:
        await wait_effect(where, check, timeout, what=what, started=started)


def _all(checks: list[Callable[[ReadModels], Effect]]) -> Callable[[ReadModels], Effect]:
    def check(models: ReadModels) -> Effect:
        effects = [c(models) for c in checks]
        impossible = next((e.impossible for e in effects if e.impossible), "")
        return Effect(all(e.done for e in effects), impossible, "; ".join(e.where for e in effects if e.where))

    return check
