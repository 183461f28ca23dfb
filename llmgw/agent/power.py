"""What a node's GPUs draw, measured, and when that is worth a NodePower event.

Measured draw is an input of placement (core/scheduling/facility.py: a domain's draw
counts what its nodes measure), so it must be in the log for replay to
decide the same; but NVML's power reading moves by a few watts every
second, and an event per node per second is 2,000 events a second on a
fleet of 2,000 nodes for nothing. So a reading is sent only when it changed
by enough to matter (`CHANGE_W`, or `CHANGE_SHARE` of the last one sent),
and at most once every `MIN_INTERVAL_S` per node; a change held back by the
interval is sent once the interval has passed (the heartbeat asks again).
A registration forgets what was measured (the fold counts a re-registered
node's shards at their declared draw again), so the first reading after
one is always sent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger("llmgw.agent")

MIN_INTERVAL_S = 5.0  # at most one NodePower per node this often
CHANGE_W = 50.0  # a change smaller than this (and than CHANGE_SHARE) is not sent
CHANGE_SHARE = 0.05


@dataclass
class Coalescer:
    """Decides which readings become NodePower events (see the module's docstring)."""

    min_interval_s: float = MIN_INTERVAL_S
    change_w: float = CHANGE_W
    change_share: float = CHANGE_SHARE
    sent_w: float | None = None  # the last reading sent (None: none since the registration)
    sent_at: float = 0.0

    def reset(self) -> None:
        """A registration: the next reading is sent whatever it is."""
        self.sent_w = None

    def due(self, watts: float, now: float) -> bool:
        """Whether this reading is to be sent now; if so, it counts as sent."""
        if self.sent_w is not None:
            if abs(watts - self.sent_w) < max(self.change_w, self.change_share * self.sent_w):
                return False
            if now - self.sent_at < self.min_interval_s:
                return False
        self.sent_w, self.sent_at = watts, now
        return True


def nvml_power() -> dict[int, float] | None:
    """Watts per GPU index, as NVML reads them now; None where NVML is not
    installed or finds no GPU (a CPU machine: no NodePower is sent)."""
    try:
        import pynvml  # nvidia-ml-py: optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        out = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            out[i] = round(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, 1)  # milliwatts
        return out or None
    except Exception as e:
        log.debug("NVML power: %s", e)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def nvml_power_limit(handle) -> float:
    """A GPU's enforced power limit in watts (its derived draw before any
    measurement), 0 where NVML cannot say."""
    try:
        import pynvml

        return round(pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0, 1)
    except Exception:
        return 0.0
