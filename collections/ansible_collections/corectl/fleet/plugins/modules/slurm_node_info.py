#!/usr/bin/python
# corectl: read Slurm nodes' states and reasons on the controller (corectl health --burn-in).
from __future__ import annotations

DOCUMENTATION = r"""
module: slurm_node_info
short_description: Read Slurm nodes' states and reasons
description:
  - >-
    Reads the nodes' states and reasons with C(sinfo) in corectl.node_state's one format and says, for each,
    whether it is drained (no new job starts there: drained or draining, down or not).
  - Changes nothing; runs alike in check mode.
options:
  nodes:
    description: The nodes, as a Slurm host list (C(dgx[01-04])).
    type: str
    required: true
author: corectl
"""

EXAMPLES = r"""
- name: Read the node's Slurm state and reason
  corectl.fleet.slurm_node_info:
    nodes: dgx01
  register: node_info
"""

RETURN = r"""
nodes:
  description: >-
    Each node sinfo knows: its compact state (sinfo's C(%t), flags kept: C(down*)), its reason ("" for none)
    and whether it is drained.
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.corectl.fleet.plugins.module_utils.sinfo import read_states


def main() -> None:
    module = AnsibleModule(argument_spec={"nodes": {"type": "str", "required": True}}, supports_check_mode=True)
    states = read_states(module, module.params["nodes"])
    shown = {
        node: {"state": now.state, "reason": now.reason, "drained": now.drained} for node, now in sorted(states.items())
    }
    module.exit_json(changed=False, nodes=shown)


if __name__ == "__main__":
    main()
