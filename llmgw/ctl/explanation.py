"""explain-placement's page: why a model's next (or a further) replica
would or would not go on each node, as the CLI prints it and the console's
Explain view shows it."""

from __future__ import annotations

import msgspec

from ..core.folding.state import State


def explanation(state: State, name: str) -> tuple[list[str], dict]:
    """Why a model's next (or a further) replica would or would not go on each
    node, as lines for people and as data: what explain-placement prints, and
    the console's Explain view."""
    from ..core.scheduling.explain import explain
    from ..core.scheduling.fit import render_explanation

    model = state.models[name]
    running = [r for r in state.replicas.values() if r.model == name and r.state != "stopped"]
    ready = sum(r.state == "ready" for r in running)
    wants = model.desired if model.desired >= 0 else model.spec.min_replicas
    further = len(running) >= wants  # it has what it wants: this is about one more
    explained = explain(state, name)
    lines = render_explanation(explained)
    if further and lines:
        lines[0] = lines[0].replace("the next replica would", "a further replica would").replace(
            "no profile fits anywhere", "a further replica would fit nowhere"
        )
    about = (
        f"model {name} has {ready} of {len(running)} replicas ready and wants {wants}: "
        + ("it needs no other; below, where a further one (a scale-up) would go" if further
           else f"below, where the next of the {wants - len(running)} it lacks would go")
    )
    data = {"replicas": {"ready": ready, "running": len(running), "wants": wants},
            "about": "a further replica" if further else "the next replica", **msgspec.to_builtins(explained)}
    return [about, *lines], data
