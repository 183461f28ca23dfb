"""The pure core imports nothing from the shell: no I/O, no clock, no
randomness, no asyncio. A reader finds every rule there, and replay can
trust that the same log gives the same state."""

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "llmgw" / "core"

# Standard modules the core may use: none of them does I/O, reads a clock or draws random numbers.
# (weakref: placement's node index lives beside a state and goes with it, see core/folding/nodeindex.py.)
ALLOWED = {"__future__", "typing", "collections", "dataclasses", "hashlib", "re", "enum", "itertools", "functools", "bisect", "heapq", "math", "operator", "weakref"}
ALLOWED_THIRD_PARTY = {"msgspec"}


def module_of(path: Path) -> str:
    """llmgw.core.<subpackage>.<module> of a file of the core."""
    parts = path.relative_to(CORE.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The absolute names a file imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    package = module_of(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                names.add(".".join(base + ([node.module] if node.module else [])))
            else:
                names.add(node.module or "")
    return names


def core_files() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


def test_core_imports_only_pure_modules():
    offenders = {}
    assert len(core_files()) > 30  # every file of the core, in its subpackages
    for path in core_files():
        bad = {
            n
            for n in imports_of(path)
            if n.split(".")[0] not in ALLOWED | ALLOWED_THIRD_PARTY and not n.startswith("llmgw.core")
        }
        if bad:
            offenders[str(path.relative_to(CORE))] = sorted(bad)
    assert not offenders, f"the core imports from outside itself: {offenders}"


def test_core_does_no_io():
    # The import rule keeps out clocks, randomness and the network; these
    # builtins are the remaining ways to reach the outside world.
    io_builtins = {"open", "print", "input", "exec", "eval", "breakpoint"}
    for path in core_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in io_builtins, f"{path.name}:{node.lineno} calls {node.func.id}()"
