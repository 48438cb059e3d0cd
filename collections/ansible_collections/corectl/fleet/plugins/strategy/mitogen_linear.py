# corectl: Mitogen's linear strategy, with the collection scan done once per run.
"""Mitogen's ``mitogen_linear`` strategy (CORECTL_ACCELERATOR=mitogen), with one fix for speed.

Before it runs a module that lives in a collection (corectl.fleet.files, community.general.*,
ansible.posix.*), Mitogen 0.3.54 lists every installed collection
(``ansible.collections.list.list_collection_dirs``) so that the module's imports can be served
from them. That list is kept only in the worker process, and Ansible forks a new worker for every
task and host, so every such call scans again: it imports each collection's package, which parses
its meta/runtime.yml with PyYAML (community.general's alone is thousands of lines). Profiled on a
no-op provision of head + 3 DGX (docs/performance.md): a quarter of all worker time.

Here the list is made once, in the strategy's process before any worker is forked, so every
worker inherits both the list and the imported collection packages. The set of paths Mitogen
hands on is the same as before; only when it is computed changes. Jinja's filter and test plugins
and its lexer are loaded there too (plugin_utils/prefork.py), and a task whose `when` is false for a
host is answered skipped without a worker (plugin_utils/skipfork.py), as corectl.fleet.linear does.
"""

from __future__ import annotations

import functools
from typing import Any

import ansible.collections.list
from ansible.errors import AnsibleError
from ansible_collections.corectl.fleet.plugins.plugin_utils.prefork import load_before_fork
from ansible_collections.corectl.fleet.plugins.plugin_utils.skipfork import SkipBeforeFork

try:
    import ansible_mitogen.loaders
    import ansible_mitogen.planner
    import ansible_mitogen.strategy
except ImportError as error:  # corectl selects this strategy only when mitogen is installed
    raise AnsibleError(f"corectl.fleet.mitogen_linear needs mitogen beside Ansible: {error}") from error

DOCUMENTATION = r"""
name: mitogen_linear
short_description: Mitogen's linear strategy, with the collection list made once per run
description:
  - Ansible's linear strategy run through Mitogen (mitogen 0.3.54), as C(mitogen_linear); the list
    of installed collections that Mitogen reads for every collection module is computed once, before
    the workers are forked, instead of once per task and host.
author: corectl
"""


@functools.lru_cache(maxsize=1)
def _collection_dirs() -> tuple[str, ...]:
    return tuple(path.decode("utf-8") for path in ansible.collections.list.list_collection_dirs())


def _load_collections(invocation: Any) -> None:
    """What ansible_mitogen.planner._load_collections does, from the list made once."""
    invocation._extra_sys_paths.update(_collection_dirs())


if hasattr(ansible_mitogen.planner, "_load_collections"):
    ansible_mitogen.planner._load_collections = _load_collections

Base = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)


class StrategyModule(SkipBeforeFork, ansible_mitogen.strategy.StrategyMixin, Base):
    def run(self, iterator: Any, play_context: Any, result: int = 0) -> int:
        _collection_dirs()  # in this process, before the first worker is forked
        load_before_fork(self._loader)  # Jinja's plugins and lexer, likewise (plugin_utils/prefork.py)
        return super().run(iterator, play_context, result)
