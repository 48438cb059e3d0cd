"""The plain values of Ansible's group `all` as a site's runs see them, read without Ansible.

Layers as the runner passes them (docs/architecture.md, "Variable layers"): the project's shared
``group_vars/`` first, then ``inventories/<site>/group_vars/``; a later file wins key by key. In
each, group `all` is what Ansible's host_group_vars plugin reads: ``all`` with no extension,
``all.yml``, ``all.yaml``, ``all.json``, or every such file under ``all/`` in name order. Values
are taken as written: a Jinja template stays a string, a vaulted value is None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from corectl.errors import CorectlError
from corectl.site import Site

GROUP = "all"
SUFFIXES = ("", ".yml", ".yaml", ".json")


class _Loader(yaml.SafeLoader):
    """Safe YAML that accepts Ansible's own tags (``!vault``: unknown here, ``!unsafe``: a string)."""


_Loader.add_constructor("!vault", lambda _loader, _node: None)
_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


def group_files(group_vars: Path) -> list[Path]:
    """The files of group `all` in one group_vars/ directory, in the order Ansible reads them."""
    files = [group_vars / f"{GROUP}{suffix}" for suffix in SUFFIXES]
    found = [path for path in files if path.is_file()]
    folder = group_vars / GROUP
    if folder.is_dir():
        inside = (p for p in folder.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        found += sorted(p for p in inside if not any(part.startswith(".") for part in p.relative_to(folder).parts))
    return found


def read_vars(path: Path) -> dict[str, Any]:
    """One vars file's mapping (a file of another shape, such as a whole-file vault, gives nothing)."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CorectlError(f"{path}: cannot read ({first})") from None
    return data if isinstance(data, dict) else {}


def all_vars(site: Site) -> dict[str, Any]:
    """Group `all`'s variables: shared group_vars/, then the site's, later files winning."""
    merged: dict[str, Any] = {}
    for group_vars in (site.root / "group_vars", site.directory / "group_vars"):
        for path in group_files(group_vars):
            merged.update(read_vars(path))
    return merged


def whole_number(values: dict[str, Any], name: str, default: int, minimum: int = 1) -> int:
    """``values[name]`` as an int >= ``minimum`` (``default`` when unset); one-line error otherwise."""
    value = values.get(name, default)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CorectlError(f"group_vars: {name} must be a whole number >= {minimum}, not {value!r}", exit_code=2)
    return value
