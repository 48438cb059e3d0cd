# corectl: Ansible's linear strategy, with what every worker loads loaded once before the forks.
"""Ansible's own ``linear`` strategy (corectl's default, set in ansible.cfg), which loads Jinja's
filter and test plugins and its lexer once in the strategy's process before the first worker is
forked (plugin_utils/prefork.py), instead of once in every worker, and which answers a task whose `when`
is false for a host itself, as the worker would, without forking one (plugin_utils/skipfork.py). Tasks,
hosts, results and their order are linear's, unchanged."""

from __future__ import annotations

from typing import Any

from ansible.plugins.strategy.linear import StrategyModule as Linear
from ansible_collections.corectl.fleet.plugins.plugin_utils.prefork import load_before_fork
from ansible_collections.corectl.fleet.plugins.plugin_utils.skipfork import SkipBeforeFork

DOCUMENTATION = r"""
name: linear
short_description: Ansible's linear strategy, with Jinja's plugins loaded once before the workers fork
description:
  - ansible.builtin.linear, unchanged, but Jinja's filter and test plugins and its lexer are loaded in
    the strategy's process before the first worker is forked, so no worker loads them again; a task
    whose condition is false for a host is answered skipped there, as the worker would, without a fork.
author: corectl
"""


class StrategyModule(SkipBeforeFork, Linear):
    def run(self, iterator: Any, play_context: Any) -> int:
        load_before_fork(self._loader)
        return super().run(iterator, play_context)
