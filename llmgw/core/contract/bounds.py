"""The bounds of the event contract: every number a range, every string a
length (and a character set where it is a name), every list a length.

Why: the fold took whatever a credential could publish. One node
registration with `cpu_cores: 10**30` (issue 35, finding 4) was folded;
every control-plane pass then failed with OverflowError, no snapshot was
saved, and the projector crash-looped on "Python int too large to convert to
SQLite INTEGER", as did `llmgw projections rebuild`, for good, since the log
is kept forever. With these types in the contract (events/) `decode`
itself refuses such an event, and the fold quarantines it with the reason
(`fold.apply`), never folds it.

How wide: generous enough for the largest real fleet we design for (16,000
nodes, benchmarks/fleet.py) and hosts bigger than any sold today, yet every
value fits where it goes: an int in SQLite's INTEGER (and in a JSON reader's
double: 2**53), a float finite (JSON has no NaN; a number too big for a
double decodes as inf, which a bound refuses) and, where it is an amount,
not negative. The worst value each bound accepts is folded, decided on,
snapshotted and projected by tests/test_bounds_properties.py.

Narrowing is safe for the log only when no recorded event falls outside:
tests/test_recorded_logs.py replays every log in events/logs/ with them.
Free text (reasons, messages) is bounded in length only: refusing a control
character there would throw away a fact (a failed shard's reason quoting its
engine's coloured log would leave the replica "starting" for ever); the CLI
and the console escape what they print.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

# --------------------------------------------------------------------------- the numbers behind the bounds

# Stream sequences, generations (a shard's generation is the sequence of
# the decision that placed it), terms, bases: exact in a JSON reader's
# double and in SQLite's INTEGER. At a million events a second, 285 years.
MAX_SEQ = 2**53
# GPUs one node reports, and so the GPU indices (0..MAX-1) and the GPUs of
# one shard. Eight or sixteen a host today; 256 leaves room for a rack-scale
# "node" (72 GPUs in an NVL72) and what comes after.
MAX_GPUS_PER_NODE = 256
# Host memory of one node in GB: 64 TiB, beyond the largest single-image
# hosts (32 TiB); a GPU's own memory: 16 TiB (288 GB today).
MAX_HOST_MEMORY_GB = 65_536.0
MAX_GPU_MEMORY_GB = 16_384.0
# CPU cores of one node (the largest hosts have about 2,000 threads).
MAX_CPU_CORES = 16_384
# Watts: one GPU (about 1,200 W today), one node or one shard (256 GPUs of
# 10 kW with margin: 10 MW), one facility domain's cap (a site: 10 GW).
MAX_GPU_WATTS = 10_000.0
MAX_NODE_WATTS = 10_000_000.0
MAX_DOMAIN_WATTS = 10_000_000_000.0
# Nodes one replica spans (one shard per node).
MAX_SHARDS_PER_REPLICA = 1024
# Shards one node runs: each holds a port of its own, so at most one per
# port (tests/test_placement.py fills a node's whole range with 10,000).
MAX_SHARDS_PER_NODE = 65_536
# Replicas of one model, replicas named in one restart, actions of one pass:
# a million single-GPU replicas is 16,000 nodes of 64 GPUs each.
MAX_REPLICAS = 2**20
# Fleet-wide amounts (an owner's guarantee or limit in GPUs, cores, GB):
# 16,000 nodes of the maxima above, with room.
MAX_FLEET_AMOUNT = 2**40
# Counters (requests in flight, queued, rates per minute, tokens): 2**53.
MAX_COUNTER = 2**53
# Small counts (policy counts, tiers, a restart's pace, versions).
MAX_SMALL_COUNT = 2**31 - 1
# Times: Unix seconds up to the year 5138 (1e11), and durations up to ~31
# years (1e9 s); both finite. Negative times mean nothing here.
MAX_TIME = 1e11
MAX_DURATION = 1e9
# Relative numbers (a profile's routing weight, a model's target load).
MAX_RATIO = 1e9
# Ports: 0 is "none" (a CPU shard placed before ports were numbered, a
# registration's default range), then the TCP range.
MAX_PORT = 65_535

# Lists and maps.
MAX_LABELS = 256  # labels of one node (Kubernetes nodes carry a few dozen)
MAX_DOMAINS = 65_536  # facility domains with a power cap (racks, PDUs of 16,000 nodes)
MAX_PROFILES = 64
MAX_ROUTE_ROWS = 256  # (replica, reason) rows of one gateway's load report: the rest wait for the next
MAX_USAGE_ROWS = 1024  # (key, owner, model) rows of one gateway's usage report: the rest wait for the next
MAX_ALIASES = 64
MAX_ARGS = 256
MAX_VICTIMS = 4096
MAX_REJECTIONS = 1024

# Strings.
NAME_LEN = 64  # a node, gateway, owner part: a token of a NATS subject
MODEL_NAME_LEN = 128
ID_LEN = 256  # replica and shard ids: a model name, a number, a rank
LABEL_KEY_LEN = 317  # Kubernetes: a 253-character prefix, "/", a 63-character name
LABEL_VALUE_LEN = 256
PATH_LEN = 4096  # a path to weights, an argument (PATH_MAX)
TEXT_LEN = 16_384  # a reason, a message: room for a few lines of an engine's log
LONG_TEXT_LEN = 1 << 20  # a preemption's inventory of the nodes involved
OWNER_LEN = 1024  # a path of up to 16 names

# --------------------------------------------------------------------------- character sets (anchored: msgspec searches)
#
# A strict set only where the fold already refused anything else (a node's
# name at registration, a model's name, an owner's path, a credential's
# name): the log is forever, and a narrower set would refuse events it once
# folded (a model owned by "qwen2.5", a domain "rack/r 1"). Elsewhere a name
# refuses only control characters, which no name holds and which would
# reach an operator's terminal (issue 35, finding 9: escape codes in a
# node's labels).

# A token of a NATS subject (node, gateway): what NATS and the fold's
# NAME_RE (catalog.py) allow.
NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"
# Replica ids ("model-3") and shard ids ("model-3.0"): the model names'
# characters, and @ + for what engines are told ("model@model-3.0/8").
ID_PATTERN = r"^[A-Za-z0-9._:/@+-]*$"
OWNER_PATTERN = r"^([A-Za-z0-9_-]{1,64}(/[A-Za-z0-9_-]{1,64})*)?$"
# Printable ASCII without spaces: what an engine answers to.
VISIBLE_PATTERN = r"^[\x21-\x7e]*$"
# Anything but C0 control characters and DEL: a path, a label, most names.
NO_CONTROL_PATTERN = r"^[^\x00-\x1f\x7f]*$"
HEX_PATTERN = r"^[0-9a-fA-F]*$"
WORD_PATTERN = r"^[a-z_-]*$"
NKEY_PATTERN = r"^[A-Z0-9]*$"


def _int(lo: int, hi: int, why: str) -> type:
    return Annotated[int, msgspec.Meta(ge=lo, le=hi, description=why)]  # type: ignore[return-value]


def _float(lo: float, hi: float, why: str) -> type:
    return Annotated[float, msgspec.Meta(ge=lo, le=hi, description=why)]  # type: ignore[return-value]


def _str(max_length: int, pattern: str | None, why: str, min_length: int = 0) -> type:
    if pattern is None:
        return Annotated[str, msgspec.Meta(min_length=min_length, max_length=max_length, description=why)]  # type: ignore[return-value]
    return Annotated[str, msgspec.Meta(min_length=min_length, max_length=max_length, pattern=pattern, description=why)]  # type: ignore[return-value]


# --------------------------------------------------------------------------- numbers

Seq = _int(0, MAX_SEQ, "a stream sequence, generation or basis")
Term = _int(0, MAX_SEQ, "a leader's term")
Version = _int(0, MAX_SMALL_COUNT, "a schema version")
GpuCount = _int(0, MAX_GPUS_PER_NODE, "GPUs of one shard")
GpuIndex = _int(0, MAX_GPUS_PER_NODE - 1, "a GPU's index on its node")
CpuCores = _int(0, MAX_CPU_CORES, "CPU cores of one node or shard")
HostMemoryGb = _float(0.0, MAX_HOST_MEMORY_GB, "host memory of one node or shard, GB")
GpuMemoryGb = _float(0.0, MAX_GPU_MEMORY_GB, "memory of one GPU, GB")
GpuWatts = _float(0.0, MAX_GPU_WATTS, "one GPU's draw or limit, W")
NodeWatts = _float(0.0, MAX_NODE_WATTS, "one node's or shard's draw, W")
DomainWatts = _float(0.0, MAX_DOMAIN_WATTS, "a facility domain's power cap, W")
Port = _int(0, MAX_PORT, "a TCP port; 0: none")
ShardCount = _int(0, MAX_SHARDS_PER_REPLICA, "nodes (shards) of one replica")
Rank = _int(0, MAX_SHARDS_PER_REPLICA - 1, "a shard's rank in its replica")
ReplicaCount = _int(0, MAX_REPLICAS, "replicas of a model")
FleetAmount = _int(0, MAX_FLEET_AMOUNT, "GPUs or cores of the whole fleet")
FleetMemoryGb = _float(0.0, float(MAX_FLEET_AMOUNT), "host memory of the whole fleet, GB")
Counter = _int(0, MAX_COUNTER, "requests, tokens, a rate per minute")
SmallCount = _int(0, MAX_SMALL_COUNT, "a policy count, a tier, a restart's pace")
Time = _float(0.0, MAX_TIME, "Unix seconds")
Duration = _float(0.0, MAX_DURATION, "seconds")
Ratio = _float(0.0, MAX_RATIO, "a weight or a load")
EventRate = _float(0.0, 1e12, "events a second")
Price = _float(0.0, 1e9, "money per 1,000 tokens")

# --------------------------------------------------------------------------- strings

NodeName = _str(NAME_LEN, NAME_PATTERN, "a node: a token of a NATS subject", 1)
GatewayName = _str(NAME_LEN, NAME_PATTERN, "a gateway: a token of a NATS subject", 1)
ModelName = _str(MODEL_NAME_LEN, MODEL_NAME_PATTERN, "a model or alias", 1)
ProfileName = _str(MODEL_NAME_LEN, NO_CONTROL_PATTERN, "a profile of a model", 1)
ReplicaId = _str(ID_LEN, ID_PATTERN, "a replica's id")
ShardId = _str(ID_LEN, ID_PATTERN, "a shard's id")
Identity = _str(ID_LEN * 2, VISIBLE_PATTERN, "what an engine answers to")
OwnerPath = _str(OWNER_LEN, OWNER_PATTERN, "an owner: names joined by /")
# An owner a model or a key names: the fold never checked it (a model's
# owner need not be defined; one named "qwen2.5" was folded), so only what
# no name holds is refused.
OwnerName = _str(OWNER_LEN, NO_CONTROL_PATTERN, "an owner, as a model or key names it")
AliasName = _str(MODEL_NAME_LEN, NO_CONTROL_PATTERN, "another name of a model")
LabelKey = _str(LABEL_KEY_LEN, NO_CONTROL_PATTERN, "a label's name (or a short kind: rack)", 1)
LabelValue = _str(LABEL_VALUE_LEN, NO_CONTROL_PATTERN, "a label's value")
Domain = _str(LABEL_KEY_LEN + LABEL_VALUE_LEN, NO_CONTROL_PATTERN, "a facility domain: KIND/NAME")
DomainKind = _str(32, WORD_PATTERN, "a kind of facility domain")
# An engine's kind or the name of a template its agent file declares; a
# catalog may name anything (a whole command line, which an agent refuses to
# run: tests/test_allowlist_e2e.py), so a path's length.
Engine = _str(PATH_LEN, NO_CONTROL_PATTERN, "an engine's name")
EnginePath = _str(PATH_LEN, NO_CONTROL_PATTERN, "a path or an argument")
# An engine's argument may hold a newline (a chat template): a length only.
ArgText = _str(PATH_LEN, None, "an engine's argument")
GpuModel = _str(LABEL_VALUE_LEN, NO_CONTROL_PATTERN, "a GPU's model name")
Fingerprint = _str(64, HEX_PATTERN, "a profile's digest")
KeySha256 = _str(64, HEX_PATTERN, "an api key's SHA-256")
KeyName = _str(MODEL_NAME_LEN, NO_CONTROL_PATTERN, "an api key's name")
# A URL a gateway connects to: any node may name any address it likes, so
# a character set would add nothing but a search per ready status.
Endpoint = _str(PATH_LEN, None, "a URL")
AgentName = _str(LABEL_VALUE_LEN, NO_CONTROL_PATTERN, "which agent instance spoke")
# Said only by the control credential, in every decision: a length, no search.
Leader = _str(MODEL_NAME_LEN, None, "a control plane's id")
Role = _str(32, WORD_PATTERN, "a credential's role")
PublicKey = _str(128, NKEY_PATTERN, "an NKey")
Priority = _str(32, NO_CONTROL_PATTERN, "a model's priority class")
# How a gateway picks a model's replica (gateway/choose.py): prefix, least-load, round-robin.
Routing = _str(32, WORD_PATTERN, "a model's routing policy")
Word = _str(64, ID_PATTERN, "a short word")
WaitKind = _str(32, WORD_PATTERN, "why a model waits (core/rules/waits.py): no_room, over_limit, parked, ...")
CauseKind = _str(48, WORD_PATTERN, "why the control plane did something (core/contract/reasons.py): replaced, preempted, ...")
# A name said again, in the events most of a log is (a shard's status, a
# gateway's load, a decision's shards): bounded in length only. Its
# characters were checked where it was made (a registration, the catalog)
# or are checked by who may say it (the subject, which must name the same
# node or gateway: fold.apply), and what is not known is looked up and
# ignored. A pattern is a regular-expression search per string: with them
# here, decoding the recorded logs' mix cost 7.6x the yardstick
# (benchmarks/bounds.py), 5.5 us an event, over the fold's whole budget.
NodeRef = _str(NAME_LEN, None, "a node named again: checked by the subject or looked up", 1)
GatewayRef = _str(NAME_LEN, None, "a gateway named again: checked by the subject", 1)
ModelRef = _str(ID_LEN, None, "a model named again, or a client's typo: looked up")
ProfileRef = _str(MODEL_NAME_LEN, None, "a profile named again: looked up")
ReplicaRef = _str(ID_LEN, None, "a replica named again: looked up")
ShardRef = _str(ID_LEN, None, "a shard named again: looked up")
IdentityRef = _str(ID_LEN * 2, None, "what an engine answers to")
FingerprintRef = _str(64, None, "a profile's digest, compared")
Text = _str(TEXT_LEN, None, "free text: a reason, a message")
LongText = _str(LONG_TEXT_LEN, None, "long free text: an inventory")


# --------------------------------------------------------------------------- lists and maps


def many(item: object, most: int) -> type:
    """A list of at most `most` items."""
    return Annotated[list[item], msgspec.Meta(max_length=most)]  # type: ignore[valid-type,return-value]


def mapping(key: object, value: object, most: int) -> type:
    """A map of at most `most` entries."""
    return Annotated[dict[key, value], msgspec.Meta(max_length=most)]  # type: ignore[valid-type,return-value]


GpuIndices = many(GpuIndex, MAX_GPUS_PER_NODE)
Ports = many(Port, MAX_PORT + 1)
Labels = mapping(LabelKey, LabelValue, MAX_LABELS)
LabelKeys = many(LabelKey, MAX_LABELS)
Args = many(ArgText, MAX_ARGS)
Aliases = many(AliasName, MAX_ALIASES)
ReplicaIds = many(ReplicaId, MAX_REPLICAS)
ReplicaRefs = many(ReplicaRef, MAX_REPLICAS)
NodeRefs = many(NodeRef, MAX_SHARDS_PER_REPLICA)
Rejections = many(Text, MAX_REJECTIONS)
Budgets = mapping(Domain, DomainWatts, MAX_DOMAINS)
GpuDraws = mapping(GpuIndex, GpuWatts, MAX_GPUS_PER_NODE)


# --------------------------------------------------------------------------- the control plane's own words


def clip(text: str, most: int = TEXT_LEN) -> str:
    """`text` cut to fit a bound, saying so."""
    if len(text) <= most:
        return text
    more = f"... ({len(text) - most} more characters)"
    return text[: most - len(more)] + more


def fit_action(action) -> object:
    """An action of the control plane's, within the contract's bounds.

    The control plane's decisions are events like any other: one past a
    bound would be quarantined, and the next pass would decide it again, for
    ever. Its reasons are built from what the fleet holds (every node's
    refusal, every domain's), so at 16,000 nodes one could outgrow TEXT_LEN:
    cut here, in the pure core, so a replay decides the same. Actions past
    any other bound cannot be made from a state the bounds let in."""
    reason = getattr(action, "reason", "")
    if len(reason) > TEXT_LEN:
        action.reason = clip(reason)
    rejections = getattr(action, "rejections", None)
    if rejections and (len(rejections) > MAX_REJECTIONS or any(len(r) > TEXT_LEN for r in rejections)):
        action.rejections = [clip(r) for r in rejections[:MAX_REJECTIONS]]
    if getattr(action, "inventory", "") and len(action.inventory) > LONG_TEXT_LEN:
        action.inventory = clip(action.inventory, LONG_TEXT_LEN)
    cause = getattr(action, "cause", None)
    if cause is not None and len(cause.text) > TEXT_LEN:  # words quoted (a failure), not the rules' own
        cause.text = clip(cause.text)
    for victim in getattr(action, "victims", ()):
        if len(victim.why) > TEXT_LEN:
            victim.why = clip(victim.why)
    return action
