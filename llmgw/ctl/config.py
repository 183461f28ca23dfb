"""The operator CLI's limits and defaults, in one place, each named."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CliConfig:
    # A read (get, describe, logs) first waits this long for the read models to reach the log's end.
    catch_up_timeout_s: float = 5.0
    # A change (apply, delete, restart, retry) waits this long for the read models to include it
    # (read-your-writes, what every change does) ...
    projected_timeout_s: float = 30.0
    # ... and with --wait, this long for it to take effect (placed and ready; gone; replaced).
    effect_timeout_s: float = 300.0
    # A command with no --timeout (explain-placement, logs) is bounded by this all the same (issue 35, finding 8).
    command_timeout_s: float = 60.0
    # Past a command's deadline, the backstop cancels what still waits on NATS this much later, so that the
    # waits which check the deadline themselves (for the read models: exit 4; for the effect: exit 5) speak
    # first (llmgw/ctl/deadline.py).
    backstop_grace_s: float = 0.5
    # A call the bus answers busy (a JetStream API 429) or not at all is tried again after this pause,
    # doubled each time up to the longest, while the deadline leaves time.
    retry_first_s: float = 0.25
    retry_longest_s: float = 2.0
    # How often long work (a --wait, a rebuild, reading a long log, fetching weights) says where it stands.
    # $LLMGW_PROGRESS_S sets it (0: at every step, as the tests do).
    progress_every_s: float = 1.0
    # How often `get --watch` looks at the read models again.
    watch_interval_s: float = 0.2
    # `describe model` folds the gateways' load reports into one line per interval this long (loadfold.py).
    load_interval_s: float = 60.0
    # "did you mean": how alike a name must be to be suggested (difflib's ratio), and how many.
    suggest_cutoff: float = 0.6
    suggest_count: int = 3


def config() -> CliConfig:
    every = os.environ.get("LLMGW_PROGRESS_S")
    return CliConfig(progress_every_s=float(every)) if every else CliConfig()


CONFIG = config()
