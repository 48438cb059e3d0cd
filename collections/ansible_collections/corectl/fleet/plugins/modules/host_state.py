#!/usr/bin/python
# corectl: what a node has installed and runs, read once at the start of a site run.
from __future__ import annotations

DOCUMENTATION = r"""
module: host_state
short_description: Read a node's installed packages and the units it enables and runs, in one module run
description:
  - >-
    Runs C(dpkg-query) for the installed packages and one C(systemctl show) of every loaded service and timer.
    corectl's site play keeps both for the run: a role's install task runs only for a package missing here, and
    its start task only for a unit that is not both enabled and running (a converged node then runs none).
  - Changes nothing; runs alike in check mode.
options: {}
author: corectl
"""

EXAMPLES = r"""
- name: Read the installed packages and the running units
  corectl.fleet.host_state:
  register: corectl_host_state
"""

RETURN = r"""
packages:
  description: The names of the packages dpkg has installed, sorted.
  type: list
  elements: str
  returned: always
running_units:
  description: >-
    The services and timers that are enabled and running (or starting), by their full names
    (C(munge.service), C(corectl-backup.timer)), sorted.
  type: list
  elements: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.corectl.fleet.plugins.module_utils.systemd_units import SHOW_ALL_ARGV, enabled_and_running

DPKG_ARGV = ["dpkg-query", "-W", "-f=${db:Status-Status} ${Package}\n"]


def read(module: AnsibleModule, argv: list[str]) -> str:
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg=f"{argv[0]} failed: {err.strip() or out.strip()}", rc=rc)
    return out


def installed(listing: str) -> list[str]:
    """The package names of ``dpkg-query -W -f='${db:Status-Status} ${Package}\\n'`` that are installed."""
    names = (line.split(" ", 1) for line in listing.splitlines())
    return sorted({parts[1] for parts in names if len(parts) == 2 and parts[0] == "installed"})


def main() -> None:
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    module.exit_json(
        changed=False,
        packages=installed(read(module, DPKG_ARGV)),
        running_units=enabled_and_running(read(module, SHOW_ALL_ARGV)),
    )


if __name__ == "__main__":
    main()
