"""The core's limits in one object (core/contract/limits.py, issue 33):
every site reads `limits.LIMITS` when it runs, so that putting another
object in force changes what that site does; no limit is left behind as a
module constant; and each field is read somewhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import msgspec
import pytest

from llmgw.core.contract import events as ev
from llmgw.core.contract import limits
from llmgw.core.folding import fold, liveness
from llmgw.core.folding.state import Load
from llmgw.core.rules import scaling
from llmgw.core.rules.decide import decide
from llmgw.core.simulation.whatif import dry_run

from .scenario import Fleet, model

LLMGW = Path(__file__).resolve().parent.parent / "llmgw"
CORE = LLMGW / "core"


@pytest.fixture
def use(monkeypatch):
    """Put the default limits with these fields changed in force, for one test."""

    def put(**changed) -> limits.CoreLimits:
        new = msgspec.structs.replace(limits.LIMITS, **changed)
        monkeypatch.setattr(limits, "LIMITS", new)
        return new

    return put


def test_the_limits_are_one_frozen_object_with_named_defaults():
    assert limits.LIMITS == limits.CoreLimits()
    with pytest.raises(AttributeError):
        limits.LIMITS.pass_bytes = 1  # type: ignore[misc]
    assert limits.LIMITS.pass_bytes == 512 * 1024 and limits.LIMITS.rejections_kept == 8
    assert (limits.LIMITS.engine_port_first, limits.LIMITS.engine_port_last) == (20000, 29999)


# --------------------------------------------------------------------------- each site reads the object


def test_rejections_kept_per_placement(use):
    def rejections() -> list[str]:
        f = Fleet()
        for rack in ("r1", "r2", "r3"):
            f.register(f"n-{rack}", labels={"llmgw.io/rack": rack})
        for rack in ("r1", "r2"):
            f.publish(ev.DomainHeld(at=f.tick(), domain=f"rack/{rack}", reason="maintenance"))
        f.apply(model("m"))
        f.decide()
        (rep,) = f.state.replicas.values()
        assert rep.shards[0].node == "n-r3"
        return rep.rejections

    assert len(rejections()) == 2
    use(rejections_kept=1)
    assert len(rejections()) == 1


def test_the_pass_budget(use):
    def first_pass() -> list[ev.Action]:
        f = Fleet()
        f.register("a")
        f.apply(model("m", min_replicas=4))
        return decide(f.state, f.tick())

    everything = first_pass()
    assert len(everything) == 4
    one = len(msgspec.json.encode(everything[0])) + 1
    use(pass_bytes=limits.LIMITS.pass_envelope_bytes + one)
    assert len(first_pass()) == 1  # the rest waits for the next pass


def test_the_default_engine_ports(use):
    def first_port() -> int:
        f = Fleet()
        f.register("a")  # its agent names no range
        f.apply(model("m"))
        (place,) = f.decide()
        return place.shards[0].port

    assert first_port() == 20000
    use(engine_port_first=31000, engine_port_last=31001)
    assert first_port() == 31000


def test_what_the_state_keeps_verbatim(use):
    use(kept_verbatim=2)
    f = Fleet()
    for i in range(3):  # an operator's event on an agent's subject: quarantined
        f.publish(ev.ModelRemoved(at=f.tick(), name=f"m{i}"), subject="llmgw.agent.x.model.removed")
    assert f.state.quarantine_count == 3 and len(f.state.quarantined) == 2


def test_the_subjects_the_fold_remembers(use):
    use(subjects_kept=2)
    f = Fleet()
    for name in ("subjects-1", "subjects-2", "subjects-3"):  # (names no other test's fold remembers)
        f.register(name)
        assert len(fold._agent_subjects) <= 2


def test_how_long_a_gateways_load_counts(use):
    f = Fleet()
    f.apply(model("m"))
    m = f.state.models["m"]
    m.load["gw"] = Load(in_flight=3, at=f.now - 40.0)
    assert scaling.current_load(m, f.now) == 0  # 40 s old: past 30 s
    use(load_fresh_s=60.0)
    assert scaling.current_load(m, f.now) == 3


def test_mass_silence(use):
    f = Fleet()
    for name in ("a", "b", "c", "d"):
        f.register(name)
    lost = [("a", "no heartbeat"), ("b", "no heartbeat")]
    assert liveness.mass_silence(f.state, lost) == ""  # two of four: not more than half
    use(mass_silence=0.25)
    assert "taken as trouble of the bus" in liveness.mass_silence(f.state, lost)


def test_a_dry_runs_passes(use):
    f = Fleet()
    f.register("a")
    applied = ev.ModelApplied(at=f.tick(), model=model("m", min_replicas=2))
    assert dry_run(f.state, [applied], applied.at).passes > 1
    use(dry_run_passes=1)
    report = dry_run(f.state, [applied], applied.at)
    assert report.passes == 1 and not report.settled


# --------------------------------------------------------------------------- one place


# Module constants of the core that are numbers and not limits: the event
# contract's bounds and version (its own modules), the fold's version.
NOT_LIMITS = {
    "contract/bounds.py": "*",
    "contract/limits.py": "*",
    "contract/events/base.py": {"SCHEMA_VERSION"},
    "folding/fold.py": {"FOLD_VERSION"},
}


def _is_number(node: ast.expr) -> bool:
    """A number written out: 3, 0.5, 1 << 17, 512 * 1024, -1."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_number(node.left) and _is_number(node.right)
    return False


def test_no_limit_is_left_as_a_module_constant_of_the_core():
    found = []
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(CORE).as_posix()
        allowed = NOT_LIMITS.get(rel, set())
        if allowed == "*":
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            value = getattr(node, "value", None)
            for t in targets:
                if isinstance(t, ast.Name) and value is not None and _is_number(value) and t.id not in allowed:
                    found.append(f"core/{rel}:{node.lineno} {t.id}")
    assert not found, "a limit of the core belongs in core/contract/limits.py (CoreLimits):\n" + "\n".join(found)


def test_every_limit_is_read_somewhere():
    source = "\n".join(p.read_text() for p in sorted(LLMGW.rglob("*.py")) if p.name != "limits.py")
    unread = [name for name in limits.FIELDS if not re.search(rf"\bLIMITS\.{name}\b", source)]
    assert not unread, f"limits nobody reads: {unread}"


def test_an_operator_sets_mass_silence_where_replay_does_not_need_it(capsys):
    # Whether nodes were lost is recorded (NodeLost): the share is the control
    # plane's setting (`llmgw control --mass-silence`), its default the limit's.
    from llmgw.cli import main as cli_main

    p = cli_main.parser()
    assert p.parse_args(["control"]).mass_silence == limits.LIMITS.mass_silence
    assert p.parse_args(["control", "--mass-silence", "0.8"]).mass_silence == 0.8
    for bad in ("0", "1.5", "half"):
        with pytest.raises(SystemExit) as exit_:
            p.parse_args(["control", "--mass-silence", bad])
        assert exit_.value.code == 2 and "--mass-silence: a share is" in capsys.readouterr().err
