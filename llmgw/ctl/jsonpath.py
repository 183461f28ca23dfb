"""kubectl's JSONPath, for `-o jsonpath=…`, `-o custom-columns=…` and `--sort-by`.

The paths themselves are evaluated by jsonpath-ng (a maintained JSONPath
library; its `ext` dialect for filters such as `[?(@.state=="ready")]`);
this module only does what kubectl adds around them, so that a hand that
knows `kubectl get pods -o jsonpath='{range .items[*]}{.metadata.name}{"\\n"}{end}'`
writes the same here:

- a path may start with `.` (`.items[*].name`), `$` or `@`, or with a bare
  field (`name`: what `--sort-by` and custom columns accept, "relaxed" as
  kubectl says), inside `{…}` or not;
- a field name with dots or slashes is written as kubectl writes it,
  dots escaped (`.labels.llmgw\\.io/rack`), or quoted (`.labels['llmgw.io/rack']`);
- a template is text with actions in braces: `{PATH}`, `{"literal"}` (JSON
  escapes: `{"\\n"}`, `{"\\t"}`), and `{range PATH}…{end}`, whose body is
  evaluated against each match in turn;
- what a path finds is printed as kubectl prints it: strings as they are,
  anything else as JSON, several matches separated by a space, nothing when
  nothing matches (kubectl's get allows missing keys).

What jsonpath-ng does not take (kubectl's `length()`, regular-expression
filters) is refused with the parser's words, as bad input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
_INDEX = re.compile(r"^-?\d+$")


class JsonPathError(ValueError):
    """A path or template that cannot be read: bad input (exit 2)."""


def _closing(text: str, i: int, what: str) -> int:
    """The index of what closes the bracket at text[i] (`[` or `{`), skipping
    quoted parts and nested brackets of its kind; JsonPathError when none does."""
    opening, closing = text[i], {"[": "]", "{": "}"}[text[i]]
    depth, quote = 0, ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise JsonPathError(f"unclosed {opening} in {what} {text!r}")


def _segment(name: str) -> str:
    """A field name as jsonpath-ng reads it: as it is when plain, else quoted."""
    if name == "*" or _PLAIN.match(name):
        return name
    return json.dumps(name)


def to_jsonpath_ng(expr: str) -> str:
    """A kubectl path (`.a.b[0]`, `{.a}`, `a.b`, `.labels.x\\.y/z`, `$..name`) as jsonpath-ng's `$.a.b[0]`."""
    text = expr.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if text[:1] in ("$", "@"):
        text = text[1:]
    if text in ("", "."):  # the whole: kubectl's {.} and {$}
        return "$"
    if text[0] not in ".[":
        text = "." + text  # relaxed, as kubectl's --sort-by and custom columns take it: `name` is `.name`
    out = ["$"]
    i = 0
    while i < len(text):
        c = text[i]
        if c == "[":
            j = _closing(text, i, "the path")
            out.append(text[i : j + 1])
            i = j + 1
            continue
        if c != ".":
            raise JsonPathError(f"unexpected {c!r} at {i} in {expr!r}")
        if text[i + 1 : i + 2] == ".":  # recursive descent
            out.append("..")
            i += 2
        else:
            out.append(".")
            i += 1
        name = []
        while i < len(text) and text[i] not in ".[":
            if text[i] == "\\" and i + 1 < len(text):
                i += 1  # kubectl's escaped dot (or any escaped character): part of the name
            name.append(text[i])
            i += 1
        if not name:
            if out[-1] == "..":
                continue  # `..[*]`
            raise JsonPathError(f"an empty field name at {i} in {expr!r}")
        out.append(_segment("".join(name)))
    return "".join(out)


class Path:
    """One path, parsed once; `find(data)` gives every value it matches."""

    def __init__(self, expr: str) -> None:
        from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
        from jsonpath_ng.ext import parse

        self.expr = expr
        self.translated = to_jsonpath_ng(expr)
        try:
            self._parsed = parse(self.translated)
        except (JsonPathParserError, JsonPathLexerError, Exception) as e:  # jsonpath-ng raises plain Exceptions too
            raise JsonPathError(f"cannot read the path {expr!r}: {e}") from None

    def find(self, data) -> list:
        try:
            return [m.value for m in self._parsed.find(data)]
        except Exception as e:  # a filter comparing what cannot be compared, say
            raise JsonPathError(f"the path {self.expr!r}: {e}") from None


def show(value) -> str:
    """One value as kubectl's JSONPath prints it: a string as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


# --------------------------------------------------------------------------- templates


@dataclass
class _Text:
    text: str


@dataclass
class _Find:
    path: Path


@dataclass
class _Range:
    path: Path
    body: list = field(default_factory=list)


def _actions(template: str) -> list[tuple[str, str]]:
    """The template cut into ("text", …) and ("action", …) parts."""
    parts: list[tuple[str, str]] = []
    i = 0
    while i < len(template):
        start = template.find("{", i)
        if start < 0:
            parts.append(("text", template[i:]))
            break
        if start > i:
            parts.append(("text", template[i:start]))
        j = _closing(template, start, "the template")
        parts.append(("action", template[start + 1 : j].strip()))
        i = j + 1
    return parts


class Template:
    """A kubectl JSONPath template (`-o jsonpath=…`), parsed once."""

    def __init__(self, template: str) -> None:
        self.source = template
        if "{" not in template:
            template = "{" + template + "}"  # a bare path, as a tool might pass it: the path, not the words
        root: list = []
        stack = [root]
        for kind, text in _actions(template):
            if kind == "text":
                stack[-1].append(_Text(text))
            elif text == "end":
                if len(stack) == 1:
                    raise JsonPathError(f"{{end}} with no {{range}} in the template {self.source!r}")
                stack.pop()
            elif text.startswith("range ") or text == "range":
                node = _Range(Path(text[len("range"):].strip() or "."))
                stack[-1].append(node)
                stack.append(node.body)
            elif text[:1] in "'\"":
                try:
                    # JSON's escapes; a real tab or newline the shell passed is taken as it is.
                    quoted = text if text[0] == '"' else '"' + text[1:-1].replace('"', '\\"') + '"'
                    literal = json.loads(quoted, strict=False)
                except json.JSONDecodeError as e:
                    raise JsonPathError(f"cannot read the literal {{{text}}}: {e}") from None
                stack[-1].append(_Text(str(literal)))
            else:
                stack[-1].append(_Find(Path(text)))
        if len(stack) != 1:
            raise JsonPathError(f"{{range}} with no {{end}} in the template {self.source!r}")
        self._body = root

    def render(self, data, each: Callable[[str], str] | None = None) -> str:
        """The template's text for `data`; `each` (if given) rewrites every value
        found (the CLI makes them printable on a terminal), never the template's own words."""
        out: list[str] = []
        self._run(self._body, data, out, each or (lambda text: text))
        return "".join(out)

    def _run(self, body: list, data, out: list[str], each: Callable[[str], str]) -> None:
        for node in body:
            if isinstance(node, _Text):
                out.append(node.text)
            elif isinstance(node, _Find):
                out.append(" ".join(each(show(v)) for v in node.path.find(data)))
            else:
                found = node.path.find(data)
                # `{range .items[*]}` walks the matches; `{range .items}`, one list found whole, its items.
                if len(found) == 1 and isinstance(found[0], list):
                    found = found[0]
                for item in found:
                    self._run(node.body, item, out, each)
