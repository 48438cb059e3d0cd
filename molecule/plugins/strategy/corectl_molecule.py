# corectl: the strategy of every molecule scenario (.config/molecule/config.yml).
"""corectl's Mitogen strategy (corectl.fleet.mitogen_linear) for the plays that reach the stand-in
nodes; Ansible's own linear strategy for the plays on the control host (``connection: local``:
molecule/plugins/create.yml and destroy.yml, one docker CLI task each). It was chosen for the docker
driver's own create and destroy, whose asynchronous tasks Mitogen never reported finished (Mitogen
does not use the async_dir those plays set); a play of one local command gains nothing from Mitogen."""

from __future__ import annotations

from typing import Any

from ansible.plugins.loader import strategy_loader

DOCUMENTATION = r"""
name: corectl_molecule
short_description: corectl's Mitogen strategy for molecule's node plays, linear for its driver plays
description:
  - The plays of a molecule scenario run under corectl.fleet.mitogen_linear, except plays with
    C(connection: local) (molecule's create and destroy), which run under ansible.builtin.linear.
author: corectl
"""

Mitogen = strategy_loader.get("corectl.fleet.mitogen_linear", class_only=True)
Linear = strategy_loader.get("ansible.builtin.linear", class_only=True)


class StrategyModule(Mitogen):  # type: ignore[misc,valid-type]
    def run(self, iterator: Any, play_context: Any, result: int = 0) -> int:
        if iterator._play.connection == "local":  # the play's keyword (play_context still says ssh here)
            return Linear.run(self, iterator, play_context)
        return super().run(iterator, play_context, result)
