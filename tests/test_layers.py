"""The layers of llmgw, checked by reading its imports (issue 33).

- The pure core (llmgw/core/) imports nothing of the shell: it is folded and
  tested without NATS, HTTP or a terminal.
- The console, replay, the gateway, the control plane and the operator's
  shared layer (llmgw/ctl/) import nothing from the command line
  (llmgw/cli/): what they share with it lives in llmgw/ctl/.
- No module of llmgw/ is past ~600 lines: one past it is split by job.

Every import counts, at the top of a module or inside a function (a lazy
import is still a dependency), relative ones resolved to their full name.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "llmgw"
SHELL = ("bus", "agent", "gateway", "cli", "console", "control", "projections", "ctl", "replay")
NOT_CLI = ("console", "replay", "gateway", "control", "ctl")
MAX_LINES = 600


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, full module name) of every import in the file: for `from X
    import a`, both X and X.a (a may be a module)."""
    tree = ast.parse(path.read_text(), str(path))
    here = ["llmgw", *path.relative_to(ROOT).with_suffix("").parts]
    package = here[:-1]  # what `.` names, in a package's __init__.py as in its modules
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return found


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_imports_are_resolved_as_python_does():
    """The checker itself: a relative import in a package's __init__ and in a
    module of it name the same package."""
    names = dict(_imports(ROOT / "gateway" / "server.py"))
    assert any(_within(n, "llmgw.gateway.edge") for n in names.values())
    assert any(_within(n, "llmgw.bus.msgids") for n in names.values())


def test_the_core_imports_nothing_of_the_shell():
    shell = tuple(f"llmgw.{p}" for p in SHELL)
    wrong = [
        f"{path.relative_to(ROOT.parent)}:{line} imports {name}"
        for path in _modules("core")
        for line, name in _imports(path)
        if any(_within(name, s) for s in shell)
    ]
    assert not wrong, "the core imports the shell:\n" + "\n".join(wrong)


def test_the_console_replay_gateway_control_and_ctl_import_nothing_from_the_cli():
    wrong = [
        f"{path.relative_to(ROOT.parent)}:{line} imports {name}"
        for package in NOT_CLI
        for path in _modules(package)
        for line, name in _imports(path)
        if _within(name, "llmgw.cli")
    ]
    assert not wrong, "what these share with the CLI belongs in llmgw/ctl/:\n" + "\n".join(wrong)


def test_no_module_is_past_600_lines():
    long = [
        f"{path.relative_to(ROOT.parent)}: {n} lines"
        for path in sorted(ROOT.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    ]
    assert not long, f"split by job past {MAX_LINES} lines:\n" + "\n".join(long)
