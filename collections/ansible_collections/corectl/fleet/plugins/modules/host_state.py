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
  - Reads the host names (the kernel's and /etc/hostname) and the time zone /etc/localtime links to, as
    C(hostnamectl) and C(timedatectl) report them: the role base sets each only where it differs.
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
host_names:
  description: >-
    The running host name (the kernel's) and the one the node boots with (/etc/hostname; "" without it):
    the role base sets neither where both are already its name.
  type: list
  elements: str
  returned: always
timezone:
  description: >-
    The time zone /etc/localtime points at (its path under zoneinfo/, C(Europe/Berlin)), "" when it is not a link
    into zoneinfo: the role base sets it only where it differs.
  type: str
  returned: always
running_units:
  description: >-
    The services and timers that are enabled and running (or starting), by their full names
    (C(munge.service), C(corectl-backup.timer)), sorted.
  type: list
  elements: str
  returned: always
"""

import os
import socket

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


def host_names() -> list[str]:
    """The kernel's host name and /etc/hostname's, as hostnamectl reports them as transient and static."""
    try:
        with open("/etc/hostname", encoding="utf-8") as handle:
            static = handle.read().strip()
    except OSError:
        static = ""
    return [socket.gethostname(), static]


def timezone(localtime: str = "/etc/localtime") -> str:
    """The zone name /etc/localtime links to (what timedatectl reports), or "" (not a link into zoneinfo)."""
    try:
        target = os.readlink(localtime)
    except OSError:
        return ""
    return target.split("zoneinfo/", 1)[1] if "zoneinfo/" in target else ""


def main() -> None:
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    module.exit_json(
        changed=False,
        packages=installed(read(module, DPKG_ARGV)),
        host_names=host_names(),
        timezone=timezone(),
        running_units=enabled_and_running(read(module, SHOW_ALL_ARGV)),
    )


if __name__ == "__main__":
    main()
