"""Load and validate a site's cluster.yml into a Cluster (nothing touches a node before this).

Hostile input. Values from cluster.yml reach Ansible's inventory, which Ansible templates as
trusted Jinja, and from there root-owned files on every node (/etc/environment, chrony.conf,
fstab, authorized_keys) and command lines on the control host (ssh ``-o ProxyJump=``). So a
cluster.yml must never be able to run code or add a line to a generated file:

- every string value and every mapping key, anywhere in the document, is refused when it holds a
  Jinja marker (``{{ }}``, ``{% %}``, ``{# #}``: ``{{ lookup('pipe', 'id') }}`` would run on the
  control host), a newline or any other control character (an extra line in /etc/environment,
  chrony.conf or fstab), or more than 4096 characters (``_string_problems``, below);
- fields that become a name, an address or a token have strict types (model.py): rack and leaf
  labels, NTP servers and ssh hosts (host name or IP), Ceph monitors (host:port), mount options
  (no space or comma), ssh users (POSIX names), ProxyJump hops (``[user@]host[:port]``), key
  paths, OpenSSH public keys (known type, base64 blob of that type, no ``from=`` options), time
  zone names, group references, absolute paths (portable characters only); ports are 1-65535
  and numbers have upper bounds;
- resource bombs end in a one-line error at once: yamlsrc.load refuses big files, alias bombs,
  deep nesting, too many values, several documents, non-UTF-8 and explicit tags (see its
  docstring for the limits); host lists stop at hostlist.MAX_NODES (100,000) nodes per cluster.

Every problem is one ``file:line: dotted.path: message`` line (control characters escaped),
sorted by line, all reported together (at most MAX_PROBLEMS of them), exit code 2.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from corectl.errors import ValidationFailed
from corectl.site import checks
from corectl.site.model import Cluster, ClusterConfig
from corectl.site.yamlsrc import MAX_SCALAR, PathKey, Source, load

MAX_STRING = MAX_SCALAR  # characters in any one value or key (free text included); names: 63
MAX_PROBLEMS = 100  # lines reported; the rest are counted in one more line
_JINJA = ("{{", "}}", "{%", "%}", "{#", "#}")
# C0 controls (newline, carriage return and tab included), DEL, C1 controls, Unicode line breaks
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


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
    if kind == "value_error" and error.get("ctx", {}).get("error") is not None:
        return str(error["ctx"]["error"])  # our validators' own words, without "Value error, "
    value = error.get("input")
    if isinstance(value, str | int | float | bool) and kind != "missing":
        shown = repr(value)
        message += f" (got {shown if len(shown) <= 80 else shown[:76] + '...'})"
    return message[0].lower() + message[1:]


def _pydantic_problems(exc: ValidationError, flagged: set[PathKey]) -> list[tuple[PathKey, str]]:
    """(path, message) per error, leaving out paths at or below one the string rule flagged."""
    found: list[tuple[PathKey, str]] = []
    for error in exc.errors():
        loc: PathKey = tuple(part for part in error["loc"] if isinstance(part, str | int))
        if any(loc[:end] in flagged for end in range(len(loc) + 1)):
            continue
        if loc[-1:] == ("[key]",):  # a mapping key itself is wrong (environment, profiles)
            found.append((loc[:-1], "invalid key: " + _message(error, loc[:-1])))
            continue
        found.append((loc, _message(error, loc)))
    return found


def _string_problem(text: str) -> str | None:
    """Why ``text`` may not appear anywhere in cluster.yml (None: it may)."""
    control = _CONTROL.search(text)
    if control is not None:
        return f"must not contain a newline or control character (found {control.group()!r})"
    markers = [(text.find(marker), marker) for marker in _JINJA if marker in text]
    if markers:
        return f"must not contain Jinja template markers ('{min(markers)[1]}')"
    if len(text) > MAX_STRING:
        return f"is longer than {MAX_STRING} characters ({len(text):,})"
    return None


def _string_problems(value: Any, path: PathKey = ()) -> list[tuple[PathKey, str]]:
    """The generic rule, over every string value and mapping key of the loaded document
    (yamlsrc.load has bounded its size and depth)."""
    found: list[tuple[PathKey, str]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            problem = _string_problem(key) if isinstance(key, str) else None
            if problem is not None:
                found.append(((*path, key), f"key {problem}"))
            else:
                found += _string_problems(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _string_problems(item, (*path, index))
    elif isinstance(value, str):
        problem = _string_problem(value)
        if problem is not None:
            found.append((path, problem))
    return found


def _fail(source: Source, problems: list[tuple[PathKey, str]]) -> ValidationFailed:
    ordered = sorted(problems, key=lambda item: source.line(item[0]))
    lines = [source.error(path, message) for path, message in ordered[:MAX_PROBLEMS]]
    if len(ordered) > MAX_PROBLEMS:
        rest = len(ordered) - MAX_PROBLEMS
        lines.append(source.error((), f"{rest:,} more problems not shown (fix these first)"))
    return ValidationFailed(lines)


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
    found = _string_problems(source.data)
    try:
        config = ClusterConfig.model_validate(source.data)
    except ValidationError as exc:
        raise _fail(source, found + _pydantic_problems(exc, {p for p, _ in found})) from None
    if found:
        raise _fail(source, found)
    problems: list[checks.Problem] = []
    nodes = checks.expand_nodes(config, problems)
    if not problems:  # with nodes missing, the cross-section checks would only report follow-on errors
        problems += checks.check(config, nodes)
    if problems:
        raise _fail(source, [(p.path, p.message) for p in problems])
    return Cluster(config=config, nodes=tuple(sorted(nodes, key=lambda n: n.name)))
