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


def runtime_imports(path: Path) -> set[str]:
    """The modules of the core a file imports when it runs: in functions too,
    not those under `if TYPE_CHECKING:` (read by type checkers only)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            node.body = []
    package = module_of(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    modules = {module_of(p) for p in core_files()}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
            for a in node.names:  # `from . import x` names a module; `from .x import y` the module x
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llmgw.core"):
            found.add(node.module)
    return {m for m in found if m in modules and not m.endswith("__init__")} - {module_of(path)}


def test_no_import_cycle_inside_the_core():
    # The fold imported its rules' handlers and they imported the fold back,
    # inside functions so that Python would let them (17 modules in one
    # circle): a reader could not tell which module stood on which. Where
    # a handler needs two rules, it lives in the fold (folding/labels.py).
    graph = {module_of(p): runtime_imports(p) for p in core_files() if p.name != "__init__.py"}
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            raise AssertionError("an import cycle in the core: " + " -> ".join(path[path.index(m):] + [m]))
        if m in done:
            return
        for d in sorted(graph.get(m, ())):
            visit(d, path + [m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])


def test_placement_keeps_no_memo_keyed_by_id():
    # Issue 33: placement's memos were 23 dicts keyed by id() of objects the
    # pass held, each safe only while something else kept that object alive.
    # They are keyed by names and shapes now, or kept on what they memoise
    # (facility_spread.Spread). A call of id() in the scheduling package is
    # such a memo come back.
    calls = [
        f"{path.name}:{node.lineno}"
        for path in sorted((CORE / "scheduling").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "id"
    ]
    assert not calls, f"id() in placement: {calls}"
