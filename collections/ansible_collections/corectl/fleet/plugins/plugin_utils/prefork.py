# corectl: what Ansible's workers load again for every task, loaded once before they are forked.
"""Load in the strategy's process what every forked worker would otherwise load on its own.

Ansible forks one worker per task and host, and a worker starts from the strategy process's memory.
ansible-core 2.19 loads Jinja's filter and test plugins (every plugin file on the configured paths)
and builds Jinja's lexer the first time a process renders a template, and the strategy process
itself renders none before the first fork: so every worker did it again. Profiled on a no-op
provision of head + 2 DGX (docs/performance.md), that was about a sixth of the control host's CPU.
Done here once per play, every worker inherits them.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.loader import filter_loader, test_loader
from ansible.template import Templar, trust_as_template


def load_before_fork(loader: Any) -> None:
    """Filter and test plugins and the default lexer, in this process (``loader``: the play's DataLoader)."""
    filter_loader.get_with_context("bool")  # the first lookup loads every non-collection filter plugin
    test_loader.get_with_context("defined")  # ... and every test plugin
    Templar(loader=loader).template(trust_as_template("{{ 1 | bool is defined }}"))  # the lexer, cached per settings
