#!/usr/bin/python
# corectl: drain or resume Slurm nodes on the controller (corectl drain, resume, heal, add-node, remove-node).
from __future__ import annotations

DOCUMENTATION = r"""
module: slurm_node_state
short_description: Drain or resume Slurm nodes, reading their states before and after
description:
  - >-
    Reads the nodes' states and reasons with C(sinfo) (corectl.node_state's one format), drains the
    nodes not already drained with this reason, or resumes the drained and down nodes (with
    O(only_source), only those whose reason corectl's program of that source wrote: corectl.drain_reason),
    with one C(scontrol update); then reads the states again.
  - >-
    A node that Slurm's own health program resumed between the read and the resume is not a failure:
    Slurm answers C(Invalid node state specified) for a node no longer drained, which is the state asked for.
  - Check mode reports what would change and changes nothing.
options:
  nodes:
    description: The nodes, as a Slurm host list (C(dgx[01-04])).
    type: str
    required: true
  state:
    description: Drain (no new job starts; running jobs finish) or resume.
    type: str
    required: true
    choices: [drain, resume]
  reason:
    description: The drain's reason (required to drain).
    type: str
  only_source:
    description: Resume only nodes drained by corectl's program of this source (C(health)); others keep their drain.
    type: str
    choices: [health, service, validation, burn-in, epilog]
  keep_drained:
    description: To drain, leave a node already drained (for any reason) as it is, its reason kept.
    type: bool
    default: false
author: corectl
"""

EXAMPLES = r"""
- name: Resume the nodes the health checks drained
  corectl.fleet.slurm_node_state:
    nodes: dgx[01-04]
    state: resume
    only_source: health
"""

RETURN = r"""
before:
  description: Each node's compact state and reason before (sinfo's C(%t), C(%E); no reason is "").
  type: dict
  returned: always
after:
  description: The same, after.
  type: dict
  returned: always
updated:
  description: The nodes drained or resumed by this run.
  type: list
  elements: str
  returned: always
drained:
  description: The nodes drained or draining after the run.
  type: list
  elements: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.corectl.fleet.plugins.module_utils.drain_reason import source_of
from ansible_collections.corectl.fleet.plugins.module_utils.node_state import NodeState
from ansible_collections.corectl.fleet.plugins.module_utils.sinfo import read_states

SCONTROL = "scontrol"
NO_LONGER_DRAINED = "Invalid node state specified"


def to_update(
    before: dict[str, NodeState], state: str, reason: str, only_source: str | None, keep_drained: bool = False
) -> list[str]:
    """The nodes the update changes: to drain, those not already drained with this reason (with
    ``keep_drained``, not drained at all); to resume, the drained and down ones (of ``only_source``'s drains
    only, when given)."""
    if state == "drain":
        return sorted(
            node for node, now in before.items() if not (now.drained and (keep_drained or now.reason == reason))
        )
    return sorted(
        node
        for node, now in before.items()
        if (now.drained or now.base == "down") and (only_source is None or source_of(now.reason) == only_source)
    )


def shown(states: dict[str, NodeState]) -> dict[str, dict[str, str]]:
    return {node: {"state": now.state, "reason": now.reason} for node, now in sorted(states.items())}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "nodes": {"type": "str", "required": True},
            "state": {"type": "str", "required": True, "choices": ["drain", "resume"]},
            "reason": {"type": "str"},
            "only_source": {"type": "str", "choices": ["health", "service", "validation", "burn-in", "epilog"]},
            "keep_drained": {"type": "bool", "default": False},
        },
        required_if=[("state", "drain", ["reason"])],
        supports_check_mode=True,
    )
    nodes, state = module.params["nodes"], module.params["state"]
    reason = (module.params["reason"] or "").strip()
    before = read_states(module, nodes)
    # sinfo knows none of the nodes: the drain is Slurm's to refuse, by name
    asked = (before, state, reason, module.params["only_source"], module.params["keep_drained"])
    updated = to_update(*asked) if before or state == "resume" else [nodes]
    if updated and not module.check_mode:
        # a drain names every node asked (Slurm answers for a name it does not know); a resume only those to resume
        named = nodes if state == "drain" and not module.params["keep_drained"] else ",".join(updated)
        argv = [SCONTROL, "update", f"nodename={named}", f"state={state}"]
        argv += [f"reason={reason}"] if state == "drain" else []
        rc, out, err = module.run_command(argv)
        if rc != 0 and not (state == "resume" and NO_LONGER_DRAINED in err):
            module.fail_json(msg=f"scontrol update failed: {err.strip() or out.strip()}", rc=rc, updated=updated)
    after = before if module.check_mode else read_states(module, nodes)
    module.exit_json(
        changed=bool(updated),
        before=shown(before),
        after=shown(after),
        updated=updated,
        drained=sorted(node for node, now in after.items() if now.drained),
    )


if __name__ == "__main__":
    main()
