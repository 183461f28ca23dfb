"""`get`'s -o and --sort-by, as kubectl takes them.

`-o` is one of table, wide, name, json, yaml (views.py draws them), or
`jsonpath=TEMPLATE` or `custom-columns=HEADER:PATH,…` (this module). Every
path reads the rows as `-o json` shows them (times in Unix seconds and, as
`*_iso`, in ISO 8601), and a listing as kubectl's: `{"kind": "List",
"items": [...]}`, so `-o jsonpath='{.items[*].id}'` lists replicas' ids as
`kubectl get pods -o jsonpath='{.items[*].metadata.name}'` lists pods'.
`get KIND NAME` gives the object itself (`{.state}`), as kubectl does.

What comes from the log and reaches a terminal is made printable (escape
codes shown, never obeyed: printable.py); a pipe gets it exact, as JSON's
readers would.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from . import views
from .jsonpath import JsonPathError, Path, Template, show
from .printable import printable

BUILTIN = ("table", "wide", "name", "json", "yaml")
NONE = "<none>"  # a custom column with nothing at its path, as kubectl shows it


@dataclass(frozen=True)
class Output:
    format: str  # one of BUILTIN, "jsonpath" or "custom-columns"
    template: Template | None = None
    columns: tuple[tuple[str, Path], ...] = ()

    def __str__(self) -> str:
        return self.format


def parse_output(text: str) -> Output:
    """An argparse type for -o: a builtin format, jsonpath=TEMPLATE or custom-columns=SPEC."""
    name, eq, rest = text.partition("=")
    try:
        if name in BUILTIN and not eq:
            return Output(name)
        if name == "jsonpath":
            if not rest:
                raise JsonPathError("jsonpath= needs a template, e.g. jsonpath='{.items[*].name}'")
            return Output("jsonpath", template=Template(rest))
        if name == "custom-columns":
            return Output("custom-columns", columns=_columns(rest))
    except JsonPathError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    raise argparse.ArgumentTypeError(
        f"{text!r} is not an output: give {', '.join(BUILTIN)}, jsonpath=TEMPLATE or custom-columns=NAME:PATH,..."
    )


parse_output.completions = (*BUILTIN, "jsonpath=", "custom-columns=")  # type: ignore[attr-defined]


def _columns(spec: str) -> tuple[tuple[str, Path], ...]:
    """custom-columns=NAME:.path,STATE:.state: each header and its path (split at the first colon)."""
    out = []
    for part in _split_columns(spec):
        header, colon, path = part.partition(":")
        if not colon or not header.strip() or not path.strip():
            raise JsonPathError(f"custom-columns: {part!r} is not HEADER:PATH (e.g. custom-columns=NAME:.name,STATE:.state)")
        out.append((header.strip(), Path(path.strip())))
    if not out:
        raise JsonPathError("custom-columns= needs columns, e.g. custom-columns=NAME:.name,STATE:.state")
    return tuple(out)


def _split_columns(spec: str) -> list[str]:
    """The columns of a spec, split at commas outside brackets (a path may hold `[0,1]`)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(spec):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(spec[start:i])
            start = i + 1
    parts.append(spec[start:])
    return [p for p in parts if p.strip()]


# --------------------------------------------------------------------------- --sort-by


def sort_rows(kind: str, rows: list[dict], by: str) -> list[dict]:
    """The rows ordered by the value at `by` (a field, `.path` or `{.path}`):
    numbers by value, then words; rows without it last. JsonPathError when no
    row has it (a typo), saying what the rows have."""
    path = Path(by)
    keyed = []
    found_any = False
    for row in rows:
        values = path.find(views.with_iso_times(row))
        found_any = found_any or bool(values)
        keyed.append((_order(values[0]) if values else (3, ""), row))
    if rows and not found_any:
        fields = ", ".join(sorted(views.with_iso_times(rows[0])))
        raise JsonPathError(f"--sort-by {by}: no {kind} have it (their fields: {fields})")
    keyed.sort(key=lambda kr: kr[0])  # stable: ties keep the listing's order
    return [row for _, row in keyed]


def _order(value) -> tuple:
    if isinstance(value, bool):
        return (0, int(value))
    if isinstance(value, (int, float)):
        return (0, value)
    if isinstance(value, str):
        return (1, value)
    return (2, show(value))


# --------------------------------------------------------------------------- rendering


def _on_terminal() -> bool:
    return sys.stdout.isatty()


def render(kind: str, rows: list[dict], out: Output, *, headers: bool = True, width: int | None = None,
           single: bool = False) -> str:
    """A listing (or, `single`, the object `get KIND NAME` named) in the output asked for."""
    if out.format in ("json", "yaml") and single:
        return views.for_tools(rows[0], out.format)
    if out.format in BUILTIN:
        return views.render(kind, rows, out.format, headers=headers, width=width)
    if out.format == "jsonpath":
        assert out.template is not None
        root = views.with_iso_times(rows[0]) if single else {"kind": "List", "items": views.with_iso_times(rows)}
        return out.template.render(root, printable if _on_terminal() else None)
    header = [h for h, _ in out.columns]
    lines = [cells(out, r) for r in rows]
    widths = views.widths_of(lines, header, None)
    return "\n".join(views.line_of(line, widths) for line in ([header] if headers else []) + lines)


def cells(out: Output, row: dict) -> list[str]:
    """A row's custom columns: every value at each path, comma-separated; <none> for none."""
    data = views.with_iso_times(row)
    return [printable(",".join(show(v) for v in path.find(data))) or NONE for _, path in out.columns]


class Watch:
    """`get --watch` in any output: the builtin ones as views.Watch draws them;
    a template, rendered for each object as it comes (the listing's first);
    custom columns, a table with an EVENT column, as the builtin tables."""

    def __init__(self, kind: str, out: Output, *, headers: bool = True, width: int | None = None) -> None:
        self.kind, self.out, self.headers = kind, out, headers
        self.builtin = views.Watch(kind, out.format, headers=headers, width=width) if out.format in BUILTIN else None
        self.widths: list[int] = []

    def first(self, rows: list[dict]) -> str:
        if self.builtin is not None:
            return self.builtin.first(rows)
        if self.out.format == "jsonpath":
            return "\n".join(self.change("ADDED", r) for r in rows)  # an object a line, as each change
        header = ["EVENT", *(h for h, _ in self.out.columns)]
        lines = [["", *cells(self.out, r)] for r in rows]
        self.widths = views.widths_of([*lines, ["MODIFIED", *header[1:]]], header, None)
        return "\n".join(views.line_of(line, self.widths) for line in ([header] if self.headers else []) + lines)

    def change(self, change: str, row: dict) -> str:
        if self.builtin is not None:
            return self.builtin.change(change, row)
        if self.out.format == "jsonpath":
            assert self.out.template is not None
            return self.out.template.render(views.with_iso_times(row), printable if _on_terminal() else None)
        return views.line_of([change, *cells(self.out, row)], self.widths)

