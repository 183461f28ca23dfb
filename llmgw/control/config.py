"""Every timeout and interval of the control plane, in one place, with named defaults."""

from __future__ import annotations

import msgspec

from ..core.contract.limits import LIMITS
from .rates import NODE_BURST, NODE_RATE, NODE_RATE_WINDOW_S
from ..gateway.config import address as listen_address  # "ADDR:PORT", as the gateway's --metrics-listen

NODE_GRACE_S = 10.0  # without a heartbeat (while they could be read) before a node is lost
RESEND_AFTER_S = 5.0  # an outstanding command is sent again after this long
TICK_S = 1.0  # the longest a pass waits when nothing changes
SNAPSHOT_EVERY = 50_000  # events folded between snapshots, at most
SNAPSHOT_INTERVAL_S = 30.0
# The frozen state collected once for cyclic garbage (control/heap.py): a
# full collection, ~0.5 s at 16,000 nodes, on the loop.
RECLAIM_EVERY_S = 3600.0
# The lease (leader election, LEADER_BUCKET): a leader renews every
# RENEW_EVERY_S a key that lives LEASE_TTL_S after each write, and stops
# acting LEASE_MARGIN_S before it could have expired; a standby tries to
# take it every CAMPAIGN_EVERY_S. A killed leader is replaced within about
# LEASE_TTL_S + CAMPAIGN_EVERY_S (Kubernetes' default lease is 15 s).
LEASE_TTL_S = 3.0
RENEW_EVERY_S = 0.5
LEASE_MARGIN_S = 0.5
CAMPAIGN_EVERY_S = 0.2
STANDBY_REPORT_EVERY_S = 1.0  # a standby says how far it has folded
BUS_PROBE_EVERY_S = 1.0  # whether the heartbeats can be read now
BUS_PROBE_TIMEOUT_S = 2.0
# /metrics (Prometheus) of `llmgw control`: on loopback unless told otherwise
# (it names every node and model); 9464 is the port OpenTelemetry's
# Prometheus exporters use. "" or "off": none. (The class's default is none:
# a control plane embedded in a test or a benchmark serves nothing unasked.)
METRICS_LISTEN = "127.0.0.1:9464"


class ControlConfig(msgspec.Struct, kw_only=True):
    node_grace: float = NODE_GRACE_S
    resend_after: float = RESEND_AFTER_S
    tick: float = TICK_S
    snapshot_every: int = SNAPSHOT_EVERY
    snapshot_interval: float = SNAPSHOT_INTERVAL_S
    reclaim_every: float = RECLAIM_EVERY_S
    lease_ttl: float = LEASE_TTL_S
    renew_every: float = RENEW_EVERY_S
    lease_margin: float = LEASE_MARGIN_S
    campaign_every: float = CAMPAIGN_EVERY_S
    standby_report_every: float = STANDBY_REPORT_EVERY_S
    bus_probe_every: float = BUS_PROBE_EVERY_S
    bus_probe_timeout: float = BUS_PROBE_TIMEOUT_S
    # More than this share of the nodes silent at once is the bus (core/folding/
    # liveness.py): safe to set, whether nodes were lost is recorded (NodeLost).
    mass_silence: float = LIMITS.mass_silence
    # A node past this many events a second (averaged over node_rate_window
    # seconds, plus node_burst at once) is muted (control/rates.py); 0: never.
    node_rate: float = NODE_RATE
    node_rate_window: int = NODE_RATE_WINDOW_S
    node_burst: int = NODE_BURST
    metrics_listen: str = ""  # ADDR:PORT of /metrics; "" none (the CLI's default: METRICS_LISTEN)
