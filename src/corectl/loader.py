"""Load and validate a site's cluster.yml into a Cluster (nothing touches a node before this)."""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from corectl import checks
from corectl.errors import ValidationFailed
from corectl.model import Cluster, ClusterConfig
from corectl.yamlsrc import PathKey, Source, load


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated/Optional/list/dict wrappers down to the model class, if any."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if arg is not type(None):
                return _unwrap(arg)
    if origin in (list, tuple):
        return _unwrap(typing.get_args(annotation)[0])
    if origin is dict:
        return _unwrap(typing.get_args(annotation)[1])
    return annotation


def _model_at(path: PathKey) -> type[BaseModel] | None:
    """The model class that governs the mapping at ``path`` (for 'did you mean' hints)."""
    current: Any = ClusterConfig
    dict_pending = False
    for part in path:
        if isinstance(part, int):
            continue
        if dict_pending:
            dict_pending = False
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        dict_pending = typing.get_origin(_strip_annotated(field.annotation)) is dict
        current = _unwrap(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _strip_annotated(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _message(error: Any, loc: PathKey) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        hint = ""
        if model is not None:
            close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
            allowed = f" (allowed: {', '.join(model.model_fields)})"
            hint = f" (did you mean '{close[0]}'?)" if close else allowed
        return f"unknown key{hint}"
    if kind == "missing":
        return "required key is missing"
    message = str(error["msg"])
    value = error.get("input")
    if isinstance(value, str | int | float | bool) and kind != "missing":
        message += f" (got {value!r})"
    return message[0].lower() + message[1:]


def _pydantic_problems(source: Source, exc: ValidationError) -> list[str]:
    found: list[tuple[int, str]] = []
    for error in exc.errors():
        loc: PathKey = tuple(part for part in error["loc"] if isinstance(part, str | int))
        found.append((source.line(loc), source.error(loc, _message(error, loc))))
    return [text for _, text in sorted(found, key=lambda item: item[0])]


def cluster_file(inventory: Path) -> Path:
    return inventory / "cluster.yml"


def load_cluster(inventory: Path, display_root: Path | None = None) -> Cluster:
    """Read ``<inventory>/cluster.yml``; raise ValidationFailed listing every problem."""
    path = cluster_file(inventory)
    display = path
    if display_root is not None:
        try:
            display = path.resolve().relative_to(display_root.resolve())
        except ValueError:
            display = path
    source = load(path, display)
    if not isinstance(source.data, dict):
        raise ValidationFailed([source.error((), "cluster.yml must be a mapping of sections")])
    try:
        config = ClusterConfig.model_validate(source.data)
    except ValidationError as exc:
        raise ValidationFailed(_pydantic_problems(source, exc)) from None
    problems: list[checks.Problem] = []
    nodes = checks.expand_nodes(config, problems)
    problems += checks.check(config, nodes)
    if problems:
        ordered = sorted(problems, key=lambda p: source.line(p.path))
        raise ValidationFailed([source.error(p.path, p.message) for p in ordered])
    return Cluster(config=config, nodes=tuple(sorted(nodes, key=lambda n: n.name)))
