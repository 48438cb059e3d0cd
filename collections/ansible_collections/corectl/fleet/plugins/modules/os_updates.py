#!/usr/bin/python
# corectl: the package updates a node is offered, installed on request, and whether it must reboot (corectl upgrade os).
from __future__ import annotations

DOCUMENTATION = r"""
module: os_updates
short_description: Install a node's pending package updates, except what corectl pins, and say whether it must reboot
description:
  - >-
    Reads what C(apt-get --with-new-pkgs upgrade) would install (held packages are never in it), leaves out the
    names matching O(exclude) and, with O(security_only), every update that is not from a security archive, and
    installs exactly those versions when O(apply) is true (not in check mode).
  - >-
    A node must reboot when O(reboot_file) exists (what Debian's and Ubuntu's kernel and library packages write,
    through their hooks). Debian writes it only where unattended-upgrades is installed, so the module writes it
    too when it installs a kernel package.
  - >-
    The kernel the node would boot next is the newest C(/boot/vmlinuz-*); when it is not the running one, the
    module says whether its module tree holds O(kernel_module) (a DKMS build or a precompiled module package).
options:
  exclude:
    description: Package names (shell patterns) never updated here.
    type: list
    elements: str
    default: []
  only:
    description: >-
      Package names (shell patterns) updated here, every other name left out ([] leaves none out): the installed
      packages of these names are brought to their candidate versions together (what C(apt-get install) of them
      would do, which an upgrade may keep back).
    type: list
    elements: str
    default: []
  restart_services:
    description: >-
      Whether the packages' maintainer scripts may start and restart their services (false: a policy-rc.d that
      refuses every start is in place for the install, and the caller restarts the services in its own order).
    type: bool
    default: true
  security_only:
    description: Only updates from a security archive (an apt origin or suite with C(-security)).
    type: bool
    default: false
  apply:
    description: Install the updates (false, or check mode, only reports them).
    type: bool
    default: false
  kernel_module:
    description: The module every kernel the node may boot must have ("" checks nothing).
    type: str
    default: nvidia
  reboot_file:
    description: The file that says a reboot is needed (its C(.pkgs) sibling names the packages that asked).
    type: path
    default: /run/reboot-required
author: corectl
"""

EXAMPLES = r"""
- name: Install the node's updates, the pinned packages left alone
  corectl.fleet.os_updates:
    exclude: ["slurm*", "libslurm*"]
    apply: true
  register: os_updates
"""

RETURN = r"""
updates:
  description: The updates chosen (installed when applied), each with its name, version before ("" if new) and after.
  type: list
  returned: always
left_out:
  description: Updates offered but left out (excluded names, or not security updates with security_only).
  type: list
  returned: always
reboot_required:
  description: Whether the node must reboot for what is installed to take effect.
  type: bool
  returned: always
reboot_packages:
  description: The packages that asked for the reboot (the reboot file's .pkgs sibling).
  type: list
  returned: always
running_kernel:
  description: The running kernel's release.
  type: str
  returned: always
next_kernel:
  description: The kernel the node would boot next, when it is not the running one; "" otherwise.
  type: str
  returned: always
next_kernel_has_module:
  description: Whether next_kernel's module tree holds kernel_module (true when next_kernel is "").
  type: bool
  returned: always
"""

import contextlib
import functools
import os
from collections.abc import Iterator

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.corectl.fleet.plugins.module_utils.apt_plan import (
    KERNEL_PATTERNS,
    has_module,
    kernels_from_boot,
    matches,
    outside,
    parse_simulation,
    select,
)

APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
SIMULATE = ["apt-get", "-s", "-q", "-o", "Debug::NoLocking=true"]


def run(module: AnsibleModule, argv: list[str]) -> str:
    rc, out, err = module.run_command(argv, environ_update=APT_ENV)
    if rc != 0:
        module.fail_json(msg=f"{' '.join(argv[:4])} ... failed (rc {rc}): {(err or out).strip()[-400:]}")
    return out


def version_order(module: AnsibleModule, first: str, second: str) -> int:
    rc, _out, _err = module.run_command(["dpkg", "--compare-versions", first, "lt", second])
    return -1 if rc == 0 else (0 if first == second else 1)


def installed_matching(module: AnsibleModule, patterns: list[str]) -> list[str]:
    """The names of the installed packages that match ``patterns``."""
    listing = run(module, ["dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n"])
    found = (line.split() for line in listing.splitlines())
    return sorted(f[0] for f in found if len(f) >= 2 and f[1] == "ii" and matches(f[0], patterns))


def next_kernel(module: AnsibleModule, running: str) -> str:
    try:
        installed = kernels_from_boot(os.listdir("/boot"))
    except OSError:
        return ""
    if not installed:
        return ""
    newest = sorted(installed, key=functools.cmp_to_key(lambda a, b: version_order(module, a, b)))[-1]
    return "" if newest == running else newest


def module_tree(kernel: str) -> list[str]:
    files = []
    for folder, _dirs, names in os.walk(os.path.join("/lib/modules", kernel)):
        files.extend(os.path.join(folder, name) for name in names)
    return files


def reboot_state(path: str) -> tuple[bool, list[str]]:
    if not os.path.exists(path):
        return False, []
    try:
        with open(path + ".pkgs", encoding="utf-8") as handle:
            names = sorted({line.strip() for line in handle if line.strip()})
    except OSError:
        names = []
    return True, names


def note_reboot(path: str, names: list[str]) -> None:
    """What Debian's hooks write where unattended-upgrades is installed: the marker, and who asked."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("*** System restart required ***\n")
    with open(path + ".pkgs", "a", encoding="utf-8") as handle:
        handle.writelines(name + "\n" for name in names)


POLICY_RC_D = "/usr/sbin/policy-rc.d"


@contextlib.contextmanager
def services_held(hold: bool) -> Iterator[None]:
    """With ``hold``, Debian's policy-rc.d answers 101 (action forbidden) to every maintainer script's start or
    restart for the block; a policy-rc.d already there is put back afterwards."""
    if not hold:
        yield
        return
    saved = POLICY_RC_D + ".corectl-saved"
    if os.path.exists(POLICY_RC_D):
        os.replace(POLICY_RC_D, saved)
    try:
        with open(POLICY_RC_D, "w", encoding="utf-8") as script:
            script.write("#!/bin/sh\n# corectl: services are restarted by the upgrade itself, in order\nexit 101\n")
        os.chmod(POLICY_RC_D, 0o755)
        yield
    finally:
        os.remove(POLICY_RC_D)
        if os.path.exists(saved):
            os.replace(saved, POLICY_RC_D)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "exclude": {"type": "list", "elements": "str", "default": []},
            "only": {"type": "list", "elements": "str", "default": []},
            "restart_services": {"type": "bool", "default": True},
            "security_only": {"type": "bool", "default": False},
            "apply": {"type": "bool", "default": False},
            "kernel_module": {"type": "str", "default": "nvidia"},
            "reboot_file": {"type": "path", "default": "/run/reboot-required"},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["only"]:
        # what apt would install to bring every installed package of these names to its candidate (an upgrade
        # keeps back a package whose siblings' exact dependencies it cannot move together; an install does not)
        names = installed_matching(module, params["only"])
        offered = parse_simulation(run(module, [*SIMULATE, "install", *names])) if names else []
    else:
        offered = parse_simulation(run(module, [*SIMULATE, "--with-new-pkgs", "upgrade"]))
    chosen, left = select(offered, params["exclude"], params["security_only"], params["only"])
    changed = False
    if chosen and params["apply"] and not module.check_mode:
        wanted = [f"{update.name}={update.after}" for update in chosen]
        planned = parse_simulation(run(module, [*SIMULATE, "install", *wanted]))
        dragged = outside(planned, params["exclude"], params["only"])
        if dragged:
            module.fail_json(
                msg=f"these updates would also upgrade {', '.join(dragged)}, which this upgrade leaves alone"
            )
        options = ["-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]
        with services_held(not params["restart_services"]):
            run(module, ["apt-get", "-y", "-q", *options, "install", *wanted])
        changed = True
        kernels = [update.name for update in chosen if matches(update.name, KERNEL_PATTERNS)]
        if kernels:
            note_reboot(params["reboot_file"], kernels)
    reboot_required, reboot_packages = reboot_state(params["reboot_file"])
    running = os.uname().release
    upcoming = next_kernel(module, running)
    with_module = (
        not upcoming or not params["kernel_module"] or has_module(module_tree(upcoming), params["kernel_module"])
    )
    module.exit_json(
        changed=changed,
        updates=[update.as_dict() for update in chosen],
        left_out=[update.as_dict() for update in left],
        reboot_required=reboot_required,
        reboot_packages=reboot_packages,
        running_kernel=running,
        next_kernel=upcoming,
        next_kernel_has_module=with_module,
    )


if __name__ == "__main__":
    main()
