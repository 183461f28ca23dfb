"""One deadline for a whole `llmgw ctl` command: its --timeout holds
whatever NATS does.

Why (issue 35, finding 8): after NATS went away, two `ctl apply --timeout 15`
hung for more than 6 minutes, and during a flood of the bus `ctl apply` died
with a traceback (a JetStream API "429 too many requests"). Each call to
NATS had a bound of its own, or none: 2 s to connect, 10 s for the streams,
five publishes of 5 s each, a 5 s drain at close, and a read of the
operators' events that waited for messages with no bound at all. So the
command's --timeout bounded only its wait for the read models.

Now `llmgw ctl` runs every verb under one `Deadline` (`running`): the
waits for the read models and for the effect take what is left of it (and
fail as they always did, exit 4 or 5), a call to NATS that the bus answers
busy or not at all is tried again with a growing pause while time is left
(`retrying`), and an asyncio timeout a moment past the deadline (the
backstop) cancels whatever still waits on NATS: the command then says in
one line that NATS did not answer in time, exit 3.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time

from .config import CONFIG


class Deadline:
    """When the command must be done by (monotonic clock), and the backstop that enforces it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = max(0.0, seconds)
        self.at = time.monotonic() + self.seconds
        self._scope: asyncio.Timeout | None = None
        self.lifted = False

    def left(self) -> float:
        """Seconds left (0 once passed; unbounded once lifted)."""
        if self.lifted:
            return float("inf")
        return max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        return self.left() <= 0

    def lift(self) -> None:
        """No deadline from now on: a `--watch` or `--follow` has printed what
        it was asked for in time, and then runs until Ctrl-C."""
        self.lifted = True
        if self._scope is not None:
            self._scope.reschedule(None)

    def expired(self) -> bool:
        """Whether the backstop cancelled the command."""
        return self._scope is not None and self._scope.expired()


# The deadline of the command this task runs (ctl.run sets it); a helper
# that is called outside a command (a test, the console) has none.
_current: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("llmgw_ctl_deadline", default=None)


def current() -> Deadline | None:
    return _current.get()


def left(default: float) -> float:
    """What is left of the command's deadline, at most `default` (all of `default` outside a command)."""
    d = current()
    return default if d is None else min(default, d.left())


@contextlib.asynccontextmanager
async def running(seconds: float):
    """Run the body as a command with this deadline: its backstop fires
    `CliConfig.backstop_grace_s` after it, so that the waits which check the
    deadline themselves (and say what they waited for) speak first."""
    deadline = Deadline(seconds)
    token = _current.set(deadline)
    try:
        async with asyncio.timeout(deadline.seconds + CONFIG.backstop_grace_s) as scope:
            deadline._scope = scope
            yield deadline
    finally:
        _current.reset(token)


async def retrying(what: str, call, *, trouble=None):
    """`call()`, tried again while the bus answers busy (a JetStream API 429,
    "too many requests") or not at all (a timeout, no responders, an
    election), with a pause that grows from `CliConfig.retry_first_s` to
    `retry_longest_s`, while the command's deadline leaves time; then the last
    error as a `BusUnavailable` that says it in one line.

    Safe for what ctl calls through it: reads, and publishes that carry a
    Nats-Msg-Id (a retry of one that did land is a duplicate the stream drops)."""
    from ..bus import BusUnavailable
    from ..bus.nats_trouble import describe_trouble, is_trouble

    trouble = trouble or is_trouble
    pause = CONFIG.retry_first_s
    while True:
        try:
            return await call()
        except Exception as e:
            if not (trouble(e) or isinstance(e, BusUnavailable)):
                raise
            d = current()
            remaining = d.left() if d is not None else 0.0
            if remaining <= pause:
                said = str(e) if isinstance(e, BusUnavailable) else (
                    f"NATS did not answer {what} ({describe_trouble(e)}): "
                    "the bus is busy, electing a stream leader, or unreachable"
                )  # fmt: skip
                raise BusUnavailable(f"{said}; tried again while --timeout lasted" if d is not None else said) from None
            await asyncio.sleep(pause)
            pause = min(pause * 2, CONFIG.retry_longest_s)
