"""A problem of cluster.yml (the path of the field at fault and what is wrong) and the messages the
checks share (an unknown name with the declared ones, a duplicate with its first place)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from corectl.site.yamlsrc import PathKey, dotted


@dataclass(frozen=True)
class Problem:
    path: PathKey
    message: str


def choices(names: Iterable[str]) -> str:
    listed = sorted(set(names))
    return ", ".join(listed) if listed else "none declared"


def unknown(path: PathKey, kind: str, name: str, declared: Iterable[str]) -> Problem:
    return Problem(path, f"unknown {kind} '{name}' (declared: {choices(declared)})")


def duplicates(items: Iterable[tuple[str | int, PathKey]], what: str) -> list[Problem]:
    """One problem per (place, first place) pair, so a clashing range reports once."""
    seen: dict[str | int, PathKey] = {}
    clashes: dict[tuple[PathKey, PathKey], list[str | int]] = {}
    for value, path in items:
        if value in seen:
            clashes.setdefault((path, seen[value]), []).append(value)
        else:
            seen[value] = path
    problems = []
    for (path, first), values in clashes.items():
        more = f" and {len(values) - 1} more" if len(values) > 1 else ""
        problems.append(Problem(path, f"duplicate {what} '{values[0]}'{more} (already used at {dotted(first)})"))
    return problems
