"""How a `llmgw ctl` command reaches the log: the bus, connected as the
operator; the state folded from the whole log, or the catalog from the
operators' events alone; an operator event published; and the read models
awaited until they include the log's end (read-your-writes), within the
command's deadline (llmgw/ctl/deadline.py)."""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

from ..bus import read_log
from ..core.contract import events as ev
from ..core.folding.fold import apply
from ..core.folding.state import State
from ..ctl import deadline
from ..ctl.changes import publish_event
from ..ctl.config import CONFIG
from ..ctl.locate import Where
from ..ctl.readmodels import NoReadModels, ReadModels
from .ctl_errors import BEHIND, OK, UNREACHABLE, CtlError, say


async def _connect(where: Where):
    from ..bus.auth import CredentialError
    from ..bus.nats import NatsBus

    try:
        bus = await NatsBus.connect(where.nats, name="llmgw-ctl", creds=where.creds)
    except CredentialError as e:
        raise CtlError(str(e), UNREACHABLE)
    except ConnectionError as e:
        raise CtlError(f"{e} ({where.how_nats})", UNREACHABLE)
    bus.drain_at_close = False  # a drain of a frozen NATS would outlast --timeout (bus/nats.py)
    try:
        # Just started, `llmgw up` may not have made the streams yet.
        await bus.wait_for_streams(timeout=max(0.1, deadline.left(30.0)))
    except TimeoutError as e:
        await bus.close()
        raise CtlError(f"{e} (NATS at {where.nats})", UNREACHABLE)
    return bus


async def _live_state(where: Where) -> State:
    """The state folded from the whole log, as the control plane has it (not the read models)."""
    bus = await _connect(where)
    try:
        state = State()
        for seq, subject, data in await read_log(bus):
            apply(state, seq, subject, data)
    finally:
        await bus.close()
    return state


async def _catalog(bus) -> tuple[State, dict[tuple[str, str], int]]:
    """The catalog as the log has it, and the sequence of each model's latest
    event: folded from the operators' events alone (llmgw.ctl.>), which are
    all that define it, so the answer is exact without reading the whole log
    or trusting read models that may be behind."""
    state = State()
    latest: dict[tuple[str, str], int] = {}
    for seq, subject, data in await deadline.retrying("a read of the catalog", lambda: bus.read_matching("llmgw.ctl.>")):
        apply(state, seq, subject, data)
        try:
            event = ev.decode(data)
        except Exception:  # quarantined by the fold; says nothing of a model
            continue
        # The latest event of each model and key: what --wait waits for when nothing changed.
        if isinstance(event, ev.ModelApplied):
            latest[("model", event.model.name)] = seq
        elif isinstance(event, ev.ModelRemoved):
            latest[("model", event.name)] = seq
        elif isinstance(event, (ev.ApiKeyApplied, ev.ApiKeyRemoved)):
            latest[("apikey", event.name)] = seq
        elif isinstance(event, (ev.OwnerApplied, ev.OwnerRemoved)):
            latest[("owner", event.name)] = seq
        elif isinstance(event, ev.PolicyApplied):
            latest[("policy", "")] = seq
    return state, latest


async def _publish(where: Where, event: ev.Event) -> int:
    """Publish one operator event; returns its sequence."""
    bus = await _connect(where)
    try:
        return await publish_event(bus, event)
    finally:
        await bus.close()


def _lift_deadline() -> None:
    d = deadline.current()
    if d is not None:
        d.lift()


# --------------------------------------------------------------------------- waiting for the read models


async def wait_projected(db, seq: int, timeout: float, *, what: str) -> None:
    """Wait until the read models include event `seq`, saying so when it takes a while."""
    if db is None:
        raise CtlError("--wait needs the read models: give --db (or run llmgw up)", UNREACHABLE)
    models = ReadModels(db)
    started = time.monotonic()
    told = 0.0
    while True:
        try:
            at = models.position()
        except NoReadModels:
            at = 0
        if at >= seq:
            if told:
                say(f"  the read models reached event {seq}")
            return
        waited = time.monotonic() - started
        if waited >= timeout or _passed():
            raise CtlError(
                f"the read models at {db} stand at event {at} and did not reach {seq} ({what}) in {_total(timeout):g}s: "
                f"the projector is behind or not running (llmgw up runs it; `llmgw projections rebuild` remakes them)",
                BEHIND,
            )
        if waited - told >= CONFIG.progress_every_s:
            told = waited
            say(f"  waiting for the read models to reach event {seq} ({what}): at {at}, {waited:.0f}s")
        await asyncio.sleep(0.02)


def _passed() -> bool:
    """Whether the command's deadline (its --timeout) has passed."""
    d = deadline.current()
    return d is not None and d.passed()


def _total(timeout: float) -> float:
    """The time a wait was given, as the operator gave it: the command's --timeout."""
    d = deadline.current()
    return d.seconds if d is not None else timeout


class Fresh(NamedTuple):
    models: ReadModels
    status: int  # OK, or why the rows may be old: UNREACHABLE, BEHIND (they are shown, with a warning)


async def _last_seq(where: Where) -> int:
    bus = await _connect(where)
    try:
        return await deadline.retrying("about the log", bus.last_seq)
    finally:
        await bus.close()


async def _fresh(where: Where, timeout: float) -> Fresh:
    """The read models, once they include everything the log held when we
    asked (so a `get` after another process's `apply` sees it). When the log
    cannot be reached, or they do not catch up in time, the rows are shown as
    they are, with a warning, and the command's exit status says so."""
    if where.db is None:
        raise CtlError(
            "no read models found: run `llmgw up` here (or below the folder it runs in), or give --db PATH",
            UNREACHABLE,
        )
    models = ReadModels(where.db)
    try:
        # The log's end, within the command's deadline: else the rows as they are (exit 3).
        async with asyncio.timeout(deadline.left(timeout)):
            last = await _last_seq(where)
    except CtlError as e:
        say(f"warning: {e}; showing the read models as they are (event {models.position()})")
        return Fresh(models, e.status)
    except TimeoutError as e:  # (a BusUnavailable too)
        why = str(e) or f"NATS at {where.nats} did not answer in {_total(timeout):g}s"
        say(f"warning: {why}; showing the read models as they are (event {models.position()})")
        return Fresh(models, UNREACHABLE)
    try:
        await wait_projected(where.db, last, timeout, what="the end of the log")
    except CtlError as e:
        say(f"warning: {e}; showing them as they are")
        return Fresh(models, e.status)
    return Fresh(models, OK)
