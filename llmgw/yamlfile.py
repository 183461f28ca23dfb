"""YAML files that people write (the catalog, the agent file), read so that
every error names the file, the line and the field: a typo is found without
reading the code, and nothing is acted on from a file with an error."""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError


class YamlFileError(ValueError):
    """A file that cannot be read, parsed or validated; one line per problem."""


def load(path: str | Path, schema: type[BaseModel]) -> tuple[Any, yaml.Node | None]:
    """Parse and validate a file; returns (the validated model, the YAML
    tree, to place later problems with `problems`)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise YamlFileError(f"{path}: {e.strerror}") from None
    try:
        data: Any = yaml.safe_load(text)
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise YamlFileError(f"{path}{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    if data is not None and not isinstance(data, dict):
        raise YamlFileError(f"{path}:1: (top level): a mapping of fields is expected")
    try:
        return schema.model_validate(data or {}), root
    except ValidationError as e:
        found = [(tuple(err["loc"]), _message(schema, err)) for err in e.errors()]
        raise YamlFileError(problems(path, root, found)) from None


def _message(schema: type[BaseModel], err: dict) -> str:
    """pydantic's message; for a field no schema has, with the field it may have meant."""
    msg = err["msg"]
    if err["type"] == "extra_forbidden" and err["loc"]:
        known = _fields_at(schema, tuple(err["loc"][:-1]))
        close = difflib.get_close_matches(str(err["loc"][-1]), known, n=1, cutoff=0.6)
        if close:
            msg = f"{msg} (did you mean {close[0]}?)"
        elif known:
            msg = f"{msg} (the fields here: {', '.join(known)})"
    return msg


def _fields_at(schema: Any, loc: tuple) -> list[str]:
    """The field names of the model at a location of the document (through lists and dicts)."""
    for key in loc:
        schema = _model_in(schema)
        if schema is None:
            return []
        if isinstance(key, int) or key not in getattr(schema, "model_fields", {}):
            args = typing.get_args(schema)  # list[X] / dict[str, X] reached by the key
            schema = args[-1] if args else None
            continue
        schema = schema.model_fields[key].annotation
    schema = _model_in(schema)
    return list(schema.model_fields) if schema is not None and hasattr(schema, "model_fields") else []


def _model_in(t: Any) -> Any:
    """The pydantic model in a type (itself, or inside Optional, list, dict), else the type."""
    if isinstance(t, type) and issubclass(t, BaseModel):
        return t
    for arg in typing.get_args(t):
        found = _model_in(arg)
        if isinstance(found, type) and issubclass(found, BaseModel):
            return t if typing.get_origin(t) in (list, dict) else found
    return t


def problems(path: str | Path, root: yaml.Node | None, found: list[tuple[tuple, str]]) -> str:
    """Problems as lines `file:line: field.path: message`."""
    lines = []
    for loc, msg in found:
        field = ".".join(str(p) for p in loc) or "(top level)"
        lines.append(f"{path}:{line_of(root, loc)}: {field}: {msg}")
    return "\n".join(lines)


def line_of(root: yaml.Node | None, loc: tuple) -> int | None:
    """The line (1-based) of the YAML node at a pydantic error location."""
    node, line = root, (root.start_mark.line + 1 if root is not None else None)
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == key:
                    node, line = v, k.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line
