"""Changes to a site's cluster.yml made by corectl itself (add-node, remove-node).

Edits keep the operator's comments and layout (ruamel round trip). A change is validated like any
cluster.yml before it replaces the file: an edit that would make the file invalid never lands.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from corectl import hostlist
from corectl.errors import CorectlError, ValidationFailed
from corectl.files import write_if_changed
from corectl.site import Site
from corectl.site.loader import load_cluster
from corectl.site.model import Cluster


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 120
    return yaml


def _load(site: Site) -> Any:
    return _yaml().load(site.cluster_file.read_text(encoding="utf-8"))


def _dump(data: Any) -> str:
    buffer = io.StringIO()
    _yaml().dump(data, buffer)
    return buffer.getvalue()


def _commit(site: Site, text: str, write: bool = True) -> Cluster:
    """Validate ``text`` as the site's cluster.yml, then write it (unless not ``write``); return the new cluster."""
    with tempfile.TemporaryDirectory(prefix="corectl-edit-") as tmp:
        (Path(tmp) / "cluster.yml").write_text(text, encoding="utf-8")
        try:
            cluster = load_cluster(Path(tmp))
        except ValidationFailed as exc:
            problems = [line.replace(str(Path(tmp) / "cluster.yml"), str(site.cluster_file)) for line in exc.lines]
            heading = "the change would make cluster.yml invalid; nothing was changed:"
            raise ValidationFailed([heading, *problems]) from None
    if write:
        write_if_changed(site.cluster_file, text)
    return cluster


def _partition_nodes(partition: Any, change: str, node: str) -> None:
    names = hostlist.expand(str(partition["nodes"]))
    names = [*names, node] if change == "add" else [n for n in names if n != node]
    if not names:
        raise CorectlError(f"partition {partition['name']} would have no nodes left without {node}", exit_code=2)
    partition["nodes"] = hostlist.compress(sorted(set(names)))


def add_node(site: Site, entry: dict[str, Any], partitions: list[str]) -> Cluster:
    """Append a node entry and add it to ``partitions``."""
    data = _load(site)
    data["nodes"].append(entry)
    known = {str(p["name"]): p for p in data["slurm"]["partitions"]}
    for name in partitions:
        if name not in known:
            raise CorectlError(f"--partition {name}: no such partition (have: {', '.join(known)})", exit_code=2)
        _partition_nodes(known[name], "add", entry["name"])
    return _commit(site, _dump(data))


def remove_node(site: Site, name: str, write: bool = True) -> Cluster:
    """Remove a node declared by its own entry, and drop it from every partition (``write=False``: only
    check that this is possible and return the cluster it would give)."""
    data = _load(site)
    matches = [i for i, entry in enumerate(data["nodes"]) if str(entry["name"]) == name]
    if not matches:
        ranged = [str(e["name"]) for e in data["nodes"] if name in hostlist.expand(str(e["name"]))]
        where = f" (it is part of {ranged[0]}: split that entry first)" if ranged else ""
        raise CorectlError(f"{name} has no entry of its own in {site.cluster_file}{where}", exit_code=2)
    del data["nodes"][matches[0]]
    for partition in data["slurm"]["partitions"]:
        if name in hostlist.expand(str(partition["nodes"])):
            _partition_nodes(partition, "remove", name)
        _drop_spare(partition, name)
    return _commit(site, _dump(data), write)


def _drop_spare(partition: Any, node: str) -> None:
    """A removed node is no longer one of the partition's named spares (the pool goes with its last one)."""
    spares = partition.get("spares")
    if not isinstance(spares, dict) or spares.get("nodes") is None:
        return
    names = [n for n in hostlist.expand(str(spares["nodes"])) if n != node]
    if not names:
        del partition["spares"]
    else:
        spares["nodes"] = hostlist.compress(names)
