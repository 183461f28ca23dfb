"""YAML files that people write (the catalog, the agent file), read so that
every error names the file, the line and the field: a typo is found without
reading the code, and nothing is acted on from a file with an error."""

from __future__ import annotations

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
        raise YamlFileError(problems(path, root, [(tuple(err["loc"]), err["msg"]) for err in e.errors()])) from None


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
