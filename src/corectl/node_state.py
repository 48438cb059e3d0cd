"""A Slurm node's state as corectl reads it: one fixed sinfo format and its one parse.

corectl asks sinfo for ``SINFO_FORMAT`` (``%N|%t|%E``: the node, its compact state, its reason) on every
Slurm release it runs (22.05 on Debian 12, 24.11 on Debian 13 print it alike): the compact state is a base
(``idle``, ``alloc``, ``mix``, ``drain`` for drained, ``drng`` for draining, ``down``, ...) followed by
flag characters (``*`` not responding, ``~`` powered off, ``#`` powering up, ...), and sinfo prints
``none`` for no reason. A drained node that is down shows as ``drain`` (Slurm's compact state tests the drain
flag before the base state), one in a maintenance reservation as ``maint`` (tested before the drain flag: read as
not drained). ``scontrol show node``'s long form (``State=IDLE+DRAIN+NOT_RESPONDING``) is read by
``unavailable`` only.

This file is also shipped to the nodes (role slurm installs roles/slurm/files/corectl_node_state.py, a
link to it, for the metrics reader): the standard library only, Python 3.11.
"""

from __future__ import annotations

from typing import NamedTuple

SINFO_FORMAT = "%N|%t|%E"
SINFO_ARGV = ("sinfo", "--noheader", "--Node", f"--format={SINFO_FORMAT}")
# sinfo %t appends these to a state: not responding, powered off, powering up, powering down, and so on
FLAGS = "*~#!%$@^-"
DRAINED = ("drain", "drng", "drained", "draining")
BAD = ("drain", "drng", "down", "fail")  # fail and failg: failing
QUIET = "idle"
NO_REASON = "none"
# scontrol's long-form flags of a node whose free GPUs no job can have
UNAVAILABLE = frozenset({"drain", "down", "fail", "not_responding", "powered_down", "reboot_requested"})


class NodeState(NamedTuple):
    """One node's compact state as sinfo shows it (``idle``, ``drng``, ``down*``) and its reason ("" for none)."""

    state: str
    reason: str = ""

    @classmethod
    def parse(cls, line: str) -> tuple[str, NodeState] | None:
        """One line of ``SINFO_FORMAT``: (node, its state); None for a line not in that shape."""
        parts = line.split("|", 2)
        if len(parts) != 3 or not parts[0] or not parts[1]:
            return None
        node, state, reason = parts
        return node, cls(state.strip(), "" if reason.strip() == NO_REASON else reason.strip())

    @property
    def base(self) -> str:
        """The state without its flag characters: ``down*`` is ``down``."""
        return self.state.rstrip(FLAGS)

    @property
    def flags(self) -> str:
        return self.state[len(self.base) :]

    @property
    def drained(self) -> bool:
        """Drained or draining: no new job starts there."""
        return self.base in DRAINED

    @property
    def bad(self) -> bool:
        """Drained, draining, down or failing."""
        return self.base.startswith(BAD)

    @property
    def quiet(self) -> bool:
        """Idle, responding, powered and with no reason (``idle*`` and ``idle~`` are not quiet)."""
        return self.state == QUIET and not self.reason


def parse_sinfo(lines: list[str]) -> dict[str, NodeState]:
    """sinfo's lines of ``SINFO_FORMAT``: node -> its state (lines in another shape are left out)."""
    return dict(found for line in lines if (found := NodeState.parse(line)) is not None)


def scontrol_fields(line: str) -> dict[str, str]:
    """One line of ``scontrol show node|reservation|partition --oneliner``: its Key=Value pairs (a value may hold
    spaces: ``Reason=...``)."""
    found: dict[str, str] = {}
    key = None
    for word in line.split():
        name, sep, value = word.partition("=")
        if sep and name and name.replace("_", "").isalnum() and name[0].isupper():
            key = name
            found[key] = value
        elif key is not None:
            found[key] += " " + word
    return found


# corectl-spares' reservation of a partition's hot spares is named this and the partition
SPARES_RESERVATION = "corectl_spares_"


def spare_reservations(lines: list[str]) -> dict[str, str]:
    """``scontrol show reservation --oneliner``'s lines: each hot-spare reservation -> its nodes (a Slurm host list,
    "" for none)."""
    found = {}
    for line in lines:
        resv = scontrol_fields(line)
        name, held = resv.get("ReservationName", ""), resv.get("Nodes", "")
        if name.startswith(SPARES_RESERVATION):
            found[name] = "" if held == "(null)" else held
    return found


def unavailable(scontrol_state: str) -> bool:
    """Whether ``scontrol show node``'s ``State=`` (``IDLE+DRAIN``, ``DOWN+NOT_RESPONDING``) keeps jobs off
    the node's free resources."""
    return bool(set(scontrol_state.lower().split("+")) & UNAVAILABLE)
