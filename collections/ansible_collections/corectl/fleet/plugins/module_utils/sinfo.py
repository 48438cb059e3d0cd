# corectl: the nodes' states as the modules of corectl.fleet read them on the controller (one sinfo call).
from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.corectl.fleet.plugins.module_utils.node_state import SINFO_ARGV, NodeState, parse_sinfo


def read_states(module: AnsibleModule, nodes: str) -> dict[str, NodeState]:
    """sinfo's states and reasons of ``nodes`` (a Slurm host list); a failed sinfo fails the module."""
    rc, out, err = module.run_command([*SINFO_ARGV, f"--nodes={nodes}"])
    if rc != 0:
        module.fail_json(msg=f"sinfo failed: {err.strip() or out.strip()}", rc=rc)
    return parse_sinfo(out.splitlines())
