"""The exit status of every `llmgw` command: one table, shown by `--help`
and in the README, so a script can tell why a command failed."""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    OK = 0  # done
    NOT_FOUND = 1  # no such model, replica, node or file
    BAD_INPUT = 2  # a bad flag, argument or file: nothing was done
    UNREACHABLE = 3  # NATS or the read models cannot be reached
    BEHIND = 4  # the read models did not reach the log's end in time
    NOT_AS_WANTED = 5  # what --wait waited for did not happen; a check found differences
    INTERRUPTED = 130  # Ctrl-C (the end of a --watch or --follow)
    PIPE_CLOSED = 141  # the reader of the output went away (`| head`), as a shell counts SIGPIPE


MEANING = {
    Exit.OK: "done",
    Exit.NOT_FOUND: "no such model, replica, node or file (and a service's unexpected failure, in one line; -v: its traceback)",
    Exit.BAD_INPUT: "bad input (a flag, an argument, a catalog or log file): nothing was done",
    Exit.UNREACHABLE: "NATS or the read models unreachable (a get or describe still prints the read models as they are)",
    Exit.BEHIND: "the read models did not catch up with the log in time (likewise printed as they are)",
    Exit.NOT_AS_WANTED: (
        "not as wanted: what --wait waited for did not happen in time, or cannot (a parked model); "
        "replay --verify or events schema found differences"
    ),
    Exit.INTERRUPTED: "interrupted (Ctrl-C; the way a --watch or --follow ends)",
    Exit.PIPE_CLOSED: "the output's reader went away (`| head`)",
}


def table_text() -> str:
    """The table, for an epilog of --help."""
    return "exit status:\n" + "\n".join(f"  {int(code):>3}  {words}" for code, words in MEANING.items())
