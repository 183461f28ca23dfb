"""What the CLI prints for people, made safe for a terminal.

Why (issue 35, finding 9): a node's labels are the node's own words, and
terminal escape codes in them reached the operator's terminal raw, in
`ctl get nodes` and `describe node`: a node could recolour, hide or rewrite
what the operator reads (ESC [ 2 J clears the screen; an OSC sequence sets
the window title, or on some terminals writes the clipboard). Everything the
CLI prints that came from the log, the read models or a node (names, labels,
reasons, engine log lines, errors quoting them) goes through `printable`
before it reaches a table, a page or a message.

Control characters become visible escapes: C0 (U+0000-001F), DEL (U+007F)
and C1 (U+0080-009F, where U+009B is a one-byte CSI) as \\xNN, newline, tab
and carriage return as \\n, \\t, \\r (a newline in a cell would forge a row);
and the bidirectional overrides and isolates (U+202A-202E, U+2066-2069,
which reorder what is shown: "Trojan Source") as \\uNNNN. JSON and YAML for
tools are left exact: both escape control characters themselves.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
_ESCAPES: dict[int, str] = {
    **{c: _NAMED.get(chr(c), f"\\x{c:02x}") for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))},
    **{c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))},
}
_KEEP_NEWLINES = {c: e for c, e in _ESCAPES.items() if c != 0x0A}


def printable(text: str) -> str:
    """`text` with every control character shown as an escape (see above)."""
    return text.translate(_ESCAPES)


def printable_lines(text: str) -> str:
    """The same, keeping the newlines: for a message or page the CLI composed
    itself, line by line, where a newline is its own."""
    return text.translate(_KEEP_NEWLINES)


def printable_data(data):
    """Every string in `data` (dicts, lists, tuples; keys too) made printable:
    what a table or page for people is drawn from."""
    if isinstance(data, str):
        return data.translate(_ESCAPES)
    if isinstance(data, dict):
        return {printable_data(k): printable_data(v) for k, v in data.items()}
    if isinstance(data, list):
        return [printable_data(v) for v in data]
    if isinstance(data, tuple):
        return tuple(printable_data(v) for v in data)
    return data
