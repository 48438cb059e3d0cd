"""YAML loading that remembers where every key and item was written (for file:line errors)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from corectl.errors import ValidationFailed

PathKey = tuple[str | int, ...]


def dotted(path: PathKey) -> str:
    """``('nodes', 3, 'profile')`` -> ``nodes[3].profile``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


@dataclass
class Source:
    """A loaded YAML document: plain Python data plus the line of each path."""

    file: Path
    data: Any
    lines: dict[PathKey, int] = field(default_factory=dict)

    def line(self, path: PathKey) -> int:
        """The line of ``path``, or of its nearest written ancestor."""
        for end in range(len(path), -1, -1):
            found = self.lines.get(tuple(path[:end]))
            if found is not None:
                return found
        return 1

    def error(self, path: PathKey, message: str) -> str:
        return f"{self.file}:{self.line(path)}: {dotted(path)}: {message}"


def _plain(node: Any, path: PathKey, lines: dict[PathKey, int]) -> Any:
    """Copy ruamel's round-trip nodes into builtins, recording line numbers (1-based)."""
    if isinstance(node, dict):
        out: dict[Any, Any] = {}
        for key, value in node.items():
            child = (*path, str(key))
            position = node.lc.key(key) if hasattr(node, "lc") else None
            if position is not None:
                lines[child] = position[0] + 1
            out[str(key)] = _plain(value, child, lines)
        return out
    if isinstance(node, list):
        items = []
        for index, value in enumerate(node):
            child = (*path, index)
            position = node.lc.item(index) if hasattr(node, "lc") else None
            if position is not None:
                lines[child] = position[0] + 1
            items.append(_plain(value, child, lines))
        return items
    # ruamel's scalar subclasses (ScalarInt, ScalarFloat, quoted strings) become builtins
    for kind in (bool, int, float, str):
        if isinstance(node, kind):
            return kind(node)
    return node


def load(file: Path, display: Path | None = None) -> Source:
    """Parse ``file``; syntax errors and duplicate keys become one-line ValidationFailed errors."""
    shown = display or file
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValidationFailed([f"{shown}:1: (file): not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationFailed([f"{shown}:1: (file): cannot be read: {exc}"]) from None
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    try:
        data = yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        what = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        raise ValidationFailed([f"{shown}:{line}: (yaml): {what}"]) from None
    except YAMLError as exc:
        raise ValidationFailed([f"{shown}:1: (yaml): {' '.join(str(exc).split())}"]) from None
    lines: dict[PathKey, int] = {(): 1}
    return Source(file=shown, data=_plain(data, (), lines), lines=lines)
