"""The operator's changes as events on the log: published as the operator
(tried again, with the same message id, while the bus is busy, within the
command's deadline), and the check a restart asks of a replica first.
Shared by `llmgw ctl` and the console's actions."""

from __future__ import annotations

import uuid

from ..core.contract import events as ev
from . import deadline


async def publish_event(bus, event: ev.Event) -> int:
    """Publish one operator event on a bus already connected (as the operator); returns its sequence.
    The console publishes its actions through this too."""
    return await publish_on(bus, event, f"ctl-{uuid.uuid4().hex}")


async def publish_on(bus, event: ev.Event, msg_id: str) -> int:
    """Publish, tried again (the same Nats-Msg-Id: the stream drops a second
    copy) while the bus is busy, within the command's deadline."""
    subject, data = ev.subject_for(event), ev.encode(event)
    return await deadline.retrying(f"a publish to {subject}", lambda: bus.publish(subject, data, msg_id=msg_id))


def restart_problem(rid: str, rep: dict) -> str:
    """Why a replica (its read-model row) is not restarted now; "" when it may be."""
    if rep["state"] != "ready":
        return f"replica {rid} is {rep['state']}, not ready: only a serving replica is restarted"
    if rep["restart"] in ("queued", "replacing", "in place"):
        return f"replica {rid} is restarting already ({rep['restart']})"
    return ""
