"""What a `llmgw ctl` command says when it fails: its error (a message and
an exit status from the one table, llmgw/ctl/exits.py), a suggestion for a
name close to a known one, and messages on stderr with what they quote from
the log escaped."""

from __future__ import annotations

import difflib
import sys

from ..ctl import views
from ..ctl.config import CONFIG
from ..ctl.exits import Exit

OK, NOT_FOUND, BAD_INPUT, UNREACHABLE, BEHIND, NOT_AS_WANTED = (
    Exit.OK, Exit.NOT_FOUND, Exit.BAD_INPUT, Exit.UNREACHABLE, Exit.BEHIND, Exit.NOT_AS_WANTED,
)  # fmt: skip


class CtlError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def did_you_mean(name: str, known) -> str:
    """ ' (did you mean x?)' for a name close to known ones, else ''."""
    close = difflib.get_close_matches(name, list(known), n=CONFIG.suggest_count, cutoff=CONFIG.suggest_cutoff)
    if not close:
        return ""
    return f" (did you mean {' or '.join(close)}?)"


def say(text: str) -> None:
    """A message on stderr; what it quotes from the log (names, reasons) with its control characters escaped."""
    print(views.printable_lines(text), file=sys.stderr, flush=True)


def _clean(text: str) -> str:
    """An error, as the terminal may show it: it can quote what the log said (a name, a reason)."""
    return views.printable(text)


def _said(e: Exception) -> str:
    """What an error says to an operator. A bare client timeout ("nats:
    timeout", from a call the bus did not wrap) says what it means: a CI run
    printed only that when the stream leader was killed mid-apply."""
    from ..bus import BusUnavailable
    from ..bus.nats_trouble import describe_trouble, is_trouble

    if is_trouble(e) and not isinstance(e, BusUnavailable):
        return f"NATS did not answer ({describe_trouble(e)}): the bus is electing a stream leader, or is unreachable"
    return str(e)
