"""Whether one node fits one shard of a profile, and why not, as data.

Each rule that does not hold is a `Reason` (the rule, what was needed, what
the node has), which `render` says in words a person can act on:

    ready       the node is registered, not lost, not cordoned
    simulated   a profile of a real engine (any but "sim") goes on no simulated
                node unless it says `simulate: true` (runs_real_engine)
    pool        it carries the llmgw.io/pool label the profile asks for ("": any)
    fabric      for a multi-node profile, it carries an llmgw.io/fabric label
    gpu-model   it has GPUs of the model asked for (whole words, case aside)
    gpu-memory  enough of those have the memory asked for, each
    gpus        enough of those are free
    memory      its host memory not yet held covers a shard's (0 on the node: no limit)
    cpu         likewise its cores; a CPU-only profile needs a node that says them
    ports       a port of its range is free (ports.port_range), held neither by
                a shard or stray nor by another program (Node.taken)
    held, power, keep-within   the facility's (facility.py)

`NodeFit`, `ProfileFit` and `Explanation` are what explain.py returns for
every node of a model, and `summarize` the one-line waiting reason made of
exactly that; the fold checks a placement with these same functions
(folding/decisions.py), so the waiting reason, explain-placement, placement
and the fold cannot disagree. These are the questions; placement.py is the
search.
"""

from __future__ import annotations

import re
from functools import lru_cache

import msgspec

from . import facility
from ..contract.events import Gpu, ProfileSpec
from ..folding.nodeindex import FABRIC_LABEL, POOL_LABEL
from ..folding.state import Node, add_gb

# The rules, in the order their reasons are listed: what a person can fix
# fastest (a label, a node down) first.
READY = "ready"
SIMULATED = "simulated"
POOL = "pool"
FABRIC = "fabric"
GPU_MODEL = "gpu-model"
GPU_MEMORY = "gpu-memory"
GPUS = "gpus"
MEMORY = "memory"
CPU = "cpu"
PORTS = "ports"
RULES = (READY, SIMULATED, POOL, FABRIC, GPU_MODEL, GPU_MEMORY, GPUS, MEMORY, CPU, PORTS) + facility.RULES
_LABELS = {
    READY: "not ready",
    SIMULATED: "engine",
    POOL: "pool",
    FABRIC: "fabric",
    GPU_MODEL: "GPU model",
    GPU_MEMORY: "GPU memory",
    GPUS: "GPUs",
    MEMORY: "host memory",
    CPU: "CPU",
    PORTS: "ports",
}


# --------------------------------------------------------------------------- the reasons, as data


class Reason(msgspec.Struct, frozen=True, kw_only=True):
    """One rule a node breaks for a profile: what was needed and what it has."""

    rule: str
    need: str = ""
    have: str = ""


class NodeFit(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One node for one profile: the rules it breaks, none when it fits."""

    node: str
    reasons: tuple[Reason, ...] = ()
    # How many of the model's replicas it runs already: spread tries the
    # nodes that run fewer first.
    runs: int = 0

    @property
    def fits(self) -> bool:
        return not self.reasons


class ProfileFit(msgspec.Struct, kw_only=True):
    """One profile over the whole fleet."""

    profile: str
    needs: str  # what one replica of it needs, in words
    fits: bool
    nodes: tuple[NodeFit, ...] = ()
    # A multi-node profile: why no fabric has enough nodes that fit.
    fabrics: tuple[Reason, ...] = ()


class Explanation(msgspec.Struct, kw_only=True):
    """Where the next replica of a model would go, and why not elsewhere."""

    model: str
    profiles: tuple[ProfileFit, ...] = ()
    chosen: str = ""  # the first profile that fits; "" when none does
    where: tuple[str, ...] = ()  # the nodes its next replica would get, by rank
    problem: str = ""  # why there is nothing to explain (no such model)


def render(reason: Reason) -> str:
    """A reason in words, e.g. "GPUs: needs 4 free, has 2 free"."""
    if reason.rule in facility.RULES:
        return facility.render(reason.rule, reason.need, reason.have)
    label = _LABELS.get(reason.rule, reason.rule)
    if reason.rule == READY:
        return f"{label}: {reason.have}"
    return f"{label}: needs {reason.need}, has {reason.have}"


def render_explanation(e: Explanation) -> list[str]:
    """The explanation as lines for a terminal: each profile, then each node."""
    if e.problem:
        return [e.problem]
    if e.chosen:
        head = f"model {e.model}: the next replica would run profile {e.chosen} on {', '.join(e.where)}"
    else:
        head = f"model {e.model}: no profile fits anywhere"
    lines = [head]
    for pf in e.profiles:
        lines.append(f"profile {pf.profile} needs {pf.needs}: {'fits' if pf.fits else 'fits nowhere'}")
        for r in pf.fabrics:
            lines.append(f"  {render(r)}")
        for nf in pf.nodes:
            spread = f" (runs {nf.runs} of its replicas: tried after nodes that run fewer)" if nf.runs else ""
            said = "fits" if nf.fits else "; ".join(render(r) for r in nf.reasons)
            lines.append(f"  {nf.node}: {said}{spread}")
    return lines


def needs(p: ProfileSpec) -> str:
    """What one replica of a profile needs, in words."""
    where = "a node" if p.nodes == 1 else f"{p.nodes} nodes of one fabric, each"
    gpu = [w for w in (p.gpu_model, f"{p.gpu_memory_gb:g} GB" if p.gpu_memory_gb else "") if w]
    out = f"{where} with {p.gpus} free GPU(s)" + (f" ({', '.join(gpu)})" if gpu and p.gpus else "")
    if p.memory_gb:
        out += f", {p.memory_gb:g} GB host memory"
    if p.cpu_cores:
        out += f", {p.cpu_cores} CPU cores"
    if p.pool:
        out += f", in pool {p.pool}"
    if p.keep_within and p.nodes > 1:
        out += f", all within one {p.keep_within}"
    return out


class RuleCount(msgspec.Struct, frozen=True, kw_only=True):
    """How many nodes break one rule for a profile (a node that breaks it
    in two domains counts twice), and the first of them in name order,
    with its reason."""

    rule: str
    count: int
    first: str
    reason: Reason


class Refusals(msgspec.Struct, frozen=True, kw_only=True):
    """A profile that fits nowhere, as data: its counts per rule, in RULES
    order, and why no fabric (or keep_within domain) has enough nodes. The
    waiting reason is rendered from it (`render_refusals`), whether it was
    counted node by node (`refusals_of`, from `explain`) or by the index's
    classes (refusals.py, what decide asks)."""

    profile: str
    needs: str
    rules: tuple[RuleCount, ...] = ()
    fabrics: tuple[Reason, ...] = ()


def render_refusals(r: Refusals) -> str:
    """A profile that fits nowhere, in a line: what it needs and how many nodes
    refuse it for each rule, with the first such node as an example."""
    parts = [f"{c.count}x {render(c.reason)} (first: {c.first})" for c in r.rules]
    parts += [render(x) for x in r.fabrics]
    return f"profile {r.profile} needs {r.needs}" + (f"; {', '.join(parts)}" if parts else "")


def refusals_of(pf: ProfileFit) -> Refusals:
    """`Refusals` counted from every node's reasons (explain's answer)."""
    count: dict[str, int] = {}
    first: dict[str, tuple[str, Reason]] = {}
    for nf in pf.nodes:
        for r in nf.reasons:
            count[r.rule] = count.get(r.rule, 0) + 1
            first.setdefault(r.rule, (nf.node, r))
    rules = tuple(
        RuleCount(rule=rule, count=count[rule], first=first[rule][0], reason=first[rule][1])
        for rule in RULES
        if rule in count
    )
    return Refusals(profile=pf.profile, needs=pf.needs, rules=rules, fabrics=pf.fabrics)


def summarize(pf: ProfileFit) -> str:
    """`render_refusals` of every node's reasons."""
    return render_refusals(refusals_of(pf))


# --------------------------------------------------------------------------- the rules


@lru_cache(maxsize=4096)
def gpu_model_matches(asked: str, model: str) -> bool:
    """Whether a GPU reported as `model` is one `asked` for: the words asked
    for appear, in order and next to each other, among the words of the
    name, case aside ("H100" is "NVIDIA H100 80GB HBM3" but not "GH100")."""
    want = _words(asked)
    have = _words(model)
    n = len(want)
    return any(have[i : i + n] == want for i in range(len(have) - n + 1)) if n else True


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[^0-9a-z]+", name.lower()) if w]


# The engine a simulated node runs: any profile may run there as it.
SIM_ENGINE = "sim"


def runs_real_engine(p: ProfileSpec) -> bool:
    """Whether a profile needs its engine to really run: not the simulated
    one, and not said to be simulated where a node is (`simulate: true`).
    Such a profile goes on no simulated node: the tour's mixed fleet once
    restarted a llama.cpp embedding model onto a simulated node, and its
    /v1/embeddings answered one vector of length 2 for two inputs, 200."""
    return p.engine != SIM_ENGINE and not p.simulate


def label_reasons(p: ProfileSpec, pool: str, fabric: str, simulated: bool = False) -> tuple[Reason, ...]:
    """The rules on what a node is, not what it has free: simulated or not,
    its pool, and a fabric for a multi-node profile."""
    out: tuple[Reason, ...] = ()
    if simulated and runs_real_engine(p):
        out += (Reason(rule=SIMULATED, need=f"a node that runs {p.engine}",
                       have="a simulated one (a profile runs there only with simulate: true)"),)
    if p.pool and pool != p.pool:
        out += (Reason(rule=POOL, need=p.pool, have=pool or f"no {POOL_LABEL} label"),)
    if p.nodes > 1 and not fabric:
        out += (Reason(rule=FABRIC, need=f"a {FABRIC_LABEL} label ({p.nodes} nodes per replica)", have="none"),)
    return out


def gpu_reasons(
    p: ProfileSpec, models: str, of_model: int, best_memory: float, suit: int, free: int
) -> tuple[Reason, ...]:
    """The rules on a node's GPUs, from a few counts: `of_model` GPUs of the
    model asked for, the largest memory among them, `suit` of them with
    enough memory, `free` of those free. `models` names what it has."""
    need = p.gpus
    if need == 0:
        return ()  # a profile that needs no GPU does not care what they are
    if p.gpu_model and not of_model:
        return (Reason(rule=GPU_MODEL, need=p.gpu_model, have=models),)
    if suit < need:
        if suit < of_model:  # memory rules some of them out
            have = f"{suit} with it" if suit else f"{best_memory:g} GB at most"
            return (Reason(rule=GPU_MEMORY, need=f"{need} with {p.gpu_memory_gb:g} GB each", have=have),)
        return (Reason(rule=GPUS, need=f"{need}", have=f"{of_model} in all"),)
    if free < need:
        return (Reason(rule=GPUS, need=f"{need} free", have=f"{free} free"),)
    return ()


def _kind_reasons(p: ProfileSpec, kind: tuple[str, float, int], free: int) -> tuple[Reason, ...]:
    """`gpu_reasons` for a node whose GPUs are all alike: (model, memory, count)."""
    model, memory, total = kind
    of_model = total if not p.gpu_model or gpu_model_matches(p.gpu_model, model) else 0
    suit = of_model if memory >= p.gpu_memory_gb else 0
    return gpu_reasons(p, _models_said(model, total), of_model, memory, suit, free if suit else 0)


def _models_said(models: str, count: int) -> str:
    if not count:
        return "no GPU"
    return models or "GPUs whose model the agent did not say"


def _mixed_reasons(p: ProfileSpec, gpus: list[Gpu], free: list[int]) -> tuple[Reason, ...]:
    """`gpu_reasons` for a node with GPUs of different kinds."""
    if p.gpus == 0:
        return ()
    of_model = [g for g in gpus if not p.gpu_model or gpu_model_matches(p.gpu_model, g.model)]
    suit = {g.index for g in of_model if g.memory_gb >= p.gpu_memory_gb}
    models = _models_said("/".join(sorted({g.model for g in gpus if g.model})), len(gpus))
    best = max((g.memory_gb for g in of_model), default=0.0)
    return gpu_reasons(p, models, len(of_model), best, len(suit), sum(1 for i in free if i in suit))


def memory_short(p: ProfileSpec, node: Node, used: float) -> bool:
    """The fold's test too (see decisions._place): the same sum, rounded the same way."""
    return bool(p.memory_gb and node.memory_gb and add_gb(used, p.memory_gb) > node.memory_gb)


def ready_reason(node: Node) -> Reason:
    """A node that is not ready (or is cordoned: admission.py), in words."""
    return Reason(rule=READY, need="a ready node", have=node.cordon or node.state + (f": {node.reason}" if node.reason else ""))


def memory_reason(p: ProfileSpec, node: Node, used: float) -> Reason:
    return Reason(rule=MEMORY, need=f"{p.memory_gb:g} GB", have=f"{add_gb(node.memory_gb, -used):g} GB free of {node.memory_gb:g}")


def cpu_reason(p: ProfileSpec, node: Node, used: int) -> Reason:
    have = f"{node.cpu_cores - used} free of {node.cpu_cores}" if node.cpu_cores else "none reported"
    return Reason(rule=CPU, need=f"{p.cpu_cores} cores", have=have)


def ports_reason(node: Node, first: int, last: int) -> Reason:
    have = f"none ({len(node.taken)} held by other programs)" if node.taken else "none"
    return Reason(rule=PORTS, need=f"a free one in {first}-{last}", have=have)


def held_reason(domain: str, why: str) -> Reason:
    return Reason(rule=facility.HELD, need=domain, have=why)


def power_reason(domain: str, after: float, cap: float) -> Reason:
    """A capped domain a shard would take past its cap, in words."""
    return Reason(rule=facility.POWER, need=domain, have=f"would draw {facility.watts(after)} of {facility.watts(cap)}")


def cpu_short(p: ProfileSpec, node: Node, used: int) -> bool:
    """Too few free cores. A node that reports none has no limit said, except
    for a CPU-only profile (no GPU, cores asked): it runs on cores, so it
    needs a node that says it has them."""
    if not p.cpu_cores:
        return False
    if not node.cpu_cores:
        return p.gpus == 0
    return used + p.cpu_cores > node.cpu_cores
