# corectl: entries for corectl.fleet.files made from a list of role files.
"""``files_under``: one corectl.fleet.files entry per role file, all in one directory on the node.

A role's directory of files (Grafana's dashboards) goes into the same single module call as the
role's other files, in place of ansible.builtin.copy of a directory (a module run per file):

    files: "{{ query('ansible.builtin.fileglob', 'dashboards/*.json')
               | corectl.fleet.files_under(dir, owner='root', group='grafana', mode='0644') }}"
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import Any


def files_under(sources: Sequence[str], directory: str, **attributes: Any) -> list[dict[str, Any]]:
    """``{path: directory/<name>, src: source, **attributes}`` per source, in name order."""
    if not str(directory).startswith("/"):
        raise ValueError(f"files_under: {directory!r} is not an absolute path")
    unknown = set(attributes) - {"owner", "group", "mode", "notify", "validate"}
    if unknown:
        raise ValueError(f"files_under: unknown keys {', '.join(sorted(unknown))}")
    return [
        {"path": posixpath.join(str(directory), posixpath.basename(source)), "src": source, **attributes}
        for source in sorted(sources, key=posixpath.basename)
    ]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"files_under": files_under}
