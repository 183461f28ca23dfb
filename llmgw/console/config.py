"""The console's limits and timeouts, with their named defaults."""

from __future__ import annotations

import msgspec

DEFAULT_PORT = 8081
COOKIE = "llmgw_console"


class ConsoleConfig(msgspec.Struct, kw_only=True, frozen=True):
    port: int = DEFAULT_PORT
    listen: str = "127.0.0.1"  # loopback: the console acts as the operator
    # How often the server looks whether the log moved, for the live views (server-sent events).
    tick_s: float = 0.25
    keepalive_s: float = 15.0  # an SSE comment so that proxies keep the stream open
    max_body: int = 64 * 1024  # an action's JSON body
    header_timeout_s: float = 10.0  # a client that sends its request this slowly is dropped
    decisions_limit: int = 200  # rows of the Decisions and Preemptions views
    history_limit: int = 300  # events of a node's history
    facts_limit: int = 60  # the events shown as the facts a decision was taken on
    states_cached: int = 4  # folded past states kept (time travel back and forth over one point)
    plot_points: int = 120  # buckets of a plot's window, unless the page asks for another number
    plot_points_max: int = 2000
    timeline_limit: int = 2000  # the last marks of a model's lane (and segments of a GPU) in a window
    timeline_cells: int = 1000  # a lane's marks of one kind within 1/1000 of its window are drawn as one
    # An action's banner: how long it waits for a decision the fold says is due
    # before it says that none came (followup.py; most actions need none, said at once).
    follow_settle_s: float = 10.0


CONFIG = ConsoleConfig()
