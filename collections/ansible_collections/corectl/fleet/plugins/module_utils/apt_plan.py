# corectl: what an apt upgrade would do, read from apt-get's simulation, and the kernel a node would boot next.
# Pure functions (no Ansible): the module os_updates uses them, tests/unit/test_os_updates.py tests them.
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

# `apt-get -s` prints one line per package it would install or upgrade:
#   Inst libssl3 [3.0.15-1~deb12u1] (3.0.16-1~deb12u1 Debian-Security:12/stable-security [amd64])
#   Inst linux-image-6.1.0-30-amd64 (6.1.124-1 Debian-Security:12/stable-security [amd64])   (new)
#   Inst base-files [12.4+deb12u8] (12.4+deb12u9 Debian:12.9/stable [amd64]) []               (with a pending Conf)
INST = re.compile(r"^Inst (?P<name>\S+) (?:\[(?P<before>[^\]]+)\] )?\((?P<after>\S+) (?P<origins>[^\[)]*)")
# packages whose new version only takes effect at the next boot
KERNEL_PATTERNS = ("linux-image-*",)
MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")


@dataclass(frozen=True)
class Update:
    name: str
    before: str  # "" for a package new to the node (a new kernel pulled by its meta package)
    after: str
    origins: str  # apt's "Debian-Security:12/stable-security", comma separated when several

    @property
    def security(self) -> bool:
        return "-security" in self.origins.lower() or "security:" in self.origins.lower()

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "before": self.before, "after": self.after}


def parse_simulation(text: str) -> list[Update]:
    updates = []
    for line in text.splitlines():
        found = INST.match(line)
        if found:
            updates.append(
                Update(found["name"], found["before"] or "", found["after"], found["origins"].strip().rstrip(","))
            )
    return updates


def matches(name: str, patterns: list[str] | tuple[str, ...]) -> bool:
    bare = name.split(":", 1)[0]  # libfoo:amd64
    return any(fnmatch.fnmatchcase(bare, pattern) for pattern in patterns)


def select(
    updates: list[Update], exclude: list[str], security_only: bool, only: list[str] | None = None
) -> tuple[list[Update], list[Update]]:
    """(what to install, what is left out): excluded names (what corectl pins and upgrades its own way), with
    ``only`` every name it does not match, and with security_only everything from an origin that is not a
    security archive."""
    chosen, left = [], []
    for update in updates:
        if (
            matches(update.name, exclude)
            or (only and not matches(update.name, only))
            or (security_only and not update.security)
        ):
            left.append(update)
        else:
            chosen.append(update)
    return chosen, left


def outside(updates: list[Update], exclude: list[str], only: list[str] | None = None) -> list[str]:
    """The names an install would touch that this one must not (excluded, or not matched by ``only``)."""
    return sorted(u.name for u in updates if matches(u.name, exclude) or (only and not matches(u.name, only)))


def kernels_from_boot(names: list[str]) -> list[str]:
    """Kernel releases installed in /boot (its vmlinuz-<release> files)."""
    return sorted(name[len("vmlinuz-") :] for name in names if name.startswith("vmlinuz-") and len(name) > 8)


def has_module(files: list[str], module: str) -> bool:
    """Whether a kernel's module tree (its file names, any depth) holds ``module`` (nvidia.ko, .ko.xz, ...)."""
    wanted = {module + suffix for suffix in MODULE_SUFFIXES}
    return any(path.rsplit("/", 1)[-1] in wanted for path in files)
