"""The core's limits: sizes, counts, budgets and timeouts, in one frozen
object with named defaults (as the gateway's GatewayConfig), read from
here by every site. They were module constants scattered over the core
(passes.py, facility.py, placement.py, state.py, fold.py, liveness.py,
scaling.py, figures.py, whatif.py, redecide.py): a reader could not see
them together, nor tell which of them a recorded log depends on.

Two kinds of number stay elsewhere, on purpose:

- **The rules' tunables** (a minimum lifetime, a back-off, the most
  victims...) are `Policy` (policy.py): an operator sets them, the log
  records them (PolicyApplied), and replay and `--what-if` vary them.
- **The contract's bounds** (bounds.py: the longest name, the most GPUs of
  a node...) are part of the event types themselves: they are checked when
  an event is decoded and written into events/schema/, so a changed bound
  changes which recorded events can be read at all. They change as the
  contract does (fields only ever added), never as a setting.

**Replay.** A limit here that changes what the fold or decide produces
(marked *fold* or *decide* below) must be the same when a log is replayed,
or `replay --verify` and `--what-if` would find differences the log never
had. They are therefore **fixed**: the one object `LIMITS`, in force for
the whole process, is part of the code, not of the log nor of any
setting. Changing one is changing the core: a *fold* limit bumps
FOLD_VERSION (fold.py; snapshots and read models are then rebuilt), a
*decide* limit changes the benchmarks' log hashes
(`benchmarks/placement.py`), as any change of a rule does. Recording them
in the log (as Policy is) was the alternative; none of them is a choice an
operator makes about the fleet (they are the size of a NATS message, how
much history the state keeps verbatim...), so the log stays free of them.

Those that change nothing recorded may be set where they are used
(*free* below): `mass_silence` by the control plane's config
(ControlConfig.mass_silence, `llmgw control --mass-silence`: whether nodes
are declared lost is recorded, as NodeLost, so replay needs no setting), the dry run's and what-if's by
their callers (`dry_run(max_passes=..., horizon_s=...)`, `--ready-after`);
their default is the field here.

Tests put another object in force with `monkeypatch.setattr(limits,
"LIMITS", ...)`, so every site reads `limits.LIMITS.<name>` when it runs
(never a copy taken at import); nothing in llmgw/ replaces it.
"""

from __future__ import annotations

import msgspec

KIB = 1024


class CoreLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Every limit of the core, each with why its default (see the module
    docstring for what *fold*, *decide* and *free* mean)."""

    # ---- a pass of decide (rules/passes.py)
    # *decide*. The most bytes of one pass's Decided message: half the NATS
    # server's default payload limit (1 MiB), leaving room for the message's
    # headers and for a server configured tighter than the default. A pass
    # whose next action does not fit ends there; the next pass goes on.
    # ~1,900 placements at 2,000 nodes (benchmarks/placement.py).
    pass_bytes: int = 512 * KIB
    # *decide*. What a Decided message weighs besides its actions (type,
    # times, basis, leader): reserved out of `pass_bytes` before any action.
    pass_envelope_bytes: int = 256
    # *decide*. Domains whose refusals one placement keeps
    # (PlaceReplica.rejections, shown by `ctl describe replica`): enough to
    # say why the racks nearest in the spread were passed over, and bounded
    # so that a pass of 16,000-node placements stays within `pass_bytes`.
    rejections_kept: int = 8
    # *decide*. The engine ports of a node whose agent names no range
    # (NodeRegistered's port_first and port_last 0; ports.port_range);
    # the agent file's `engine_ports` defaults to it too. 10,000 ports,
    # above the well-known and registered services commonly run on a GPU
    # node, below Linux's ephemeral range (32768-60999).
    engine_port_first: int = 20000
    engine_port_last: int = 29999

    # ---- the gateways' load (rules/scaling.py, gateway/load.py)
    # *decide*. A gateway's load report counts this long after it was sent:
    # a gateway that died stops asking for replicas. Three times
    # `load_repeat_s`, so that one or two lost reports forget nothing.
    load_fresh_s: float = 30.0
    # A gateway repeats a load that is not zero at least this often (it
    # sends a little sooner, gateway/load.py); the core relies on it through
    # `load_fresh_s`, hence here.
    load_repeat_s: float = 10.0

    # ---- the state (folding/state.py, fold.py)
    # *fold*. Quarantined events and voided decisions the state keeps
    # verbatim (State.quarantined, State.voided); the counters go on
    # counting and the log keeps every event. What `replay --quarantined`
    # and the console list at once; a bounded state for a snapshot.
    kept_verbatim: int = 100
    # *free*. Subjects whose speaker the fold remembers having checked
    # (fold._checked), cleared when full: a lookup instead of a check per
    # event. A fleet has a few subjects per node: 2**17 is 16,000 nodes'
    # worth many times over, and about 23 MB when full (node names of ten
    # characters).
    subjects_kept: int = 1 << 17

    # ---- liveness (folding/liveness.py)
    # *free*. More than this share of the ready nodes silent at once (and
    # more than one) is trouble of the bus, not of the nodes: none is
    # declared lost. Half: a rack or a PDU lost is far less than half a
    # fleet; a partition of the bus from the control plane is all of it.
    mass_silence: float = 0.5

    # ---- what-if and dry runs (simulation/): nothing recorded, all *free*
    # Waiting reasons kept per model in a run's figures: the longest.
    top_reasons: int = 3
    # A dry run stops after this many passes (a rule that decided something
    # new in every pass for ever would otherwise not end)...
    dry_run_passes: int = 500
    # ... or this far in simulated time: an hour covers every default
    # deadline of Policy (the longest, start_timeout_s, is 30 minutes).
    dry_run_horizon_s: float = 3600.0
    # How long an idle simulated engine takes to exit when stopped (its
    # drain, at most this: the simulated agent waits min(grace, 0.05 s)).
    sim_stop_s: float = 0.05
    # A shard placed with no start time known for its profile: ready after this.
    sim_ready_after_s: float = 1.0
    # A pass the what-if takes at a rule's deadline (whatif.next_wake) that
    # the log took this much later still counts as the recorded one: the
    # recorded control plane decides on its own tick (1 s), not at the deadline.
    what_if_follow_slack_s: float = 2.0
    # Passes in a row at one moment (a pass bounded by `pass_bytes` goes on
    # in the next): 20 passes is ~38,000 placements at once.
    what_if_passes_at_once: int = 20
    # Going its own way, the what-if decides after the facts of a burst, as
    # a control plane does: once no other recorded fact follows within this long.
    what_if_tick_s: float = 0.1


FIELDS: tuple[str, ...] = CoreLimits.__struct_fields__
# The limits in force: fixed (see the module docstring).
LIMITS = CoreLimits()
