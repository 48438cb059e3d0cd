"""corectl heal's rules: which drained nodes it may touch, what to try next, and when to give up.

Only nodes the health checks drained (Slurm reason ``corectl-health: <check>: ...``) are healed;
a drain by an operator, an upgrade or Slurm itself is never touched. Each failing check has a
ladder of steps in group_vars (``corectl_heal_ladders``), tried in order with the checks run
after each; the first step after which the checks pass ends it, and the node is resumed. A node
that exhausts its ladder, or fails the same check again within ``corectl_heal_window_hours`` of
being healed of it, is drained with ``corectl: needs hardware service (<check>)``, which nothing
resumes by itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from corectl.drain_reason import DrainReason, Source
from corectl.errors import CorectlError
from corectl.health.failures import Action, stamp
from corectl.site import groupvars

# Steps a ladder may use: playbooks/heal.yml carries out all but power-cycle (the BMC, corectl power).
STEPS = ("restart-fabricmanager", "restart-persistenced", "gpu-reset", "reboot", "power-cycle")
LADDERS_VAR = "corectl_heal_ladders"
WINDOW_VAR = "corectl_heal_window_hours"
DEFAULT_WINDOW_HOURS = 24
HEALED = "heal: resumed"  # the action recorded when the checks pass after a step
# Steps that erase what the node could tell: heal keeps its evidence first (playbooks/heal.yml's evidence step).
ERASING = ("gpu-reset", "reboot", "power-cycle")
OK = "ok"


def drained_check(reason: str) -> str | None:
    """The check named by a health-check drain reason; None for any other reason."""
    found = DrainReason.parse(reason)
    return (found.check or None) if found is not None and found.source == Source.HEALTH else None


def ladders(values: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """``corectl_heal_ladders`` from group_vars, checked: a mapping of check -> list of known steps."""
    raw = values.get(LADDERS_VAR) or {}
    if not isinstance(raw, dict):
        raise CorectlError(f"group_vars: {LADDERS_VAR} must map check names to lists of steps", exit_code=2)
    out: dict[str, tuple[str, ...]] = {}
    for check, steps in raw.items():
        if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
            raise CorectlError(f"group_vars: {LADDERS_VAR}.{check} must be a list of steps", exit_code=2)
        unknown = [s for s in steps if s not in STEPS]
        if unknown:
            raise CorectlError(
                f"group_vars: {LADDERS_VAR}.{check}: unknown step {unknown[0]!r} (known: {', '.join(STEPS)})",
                exit_code=2,
            )
        out[str(check)] = tuple(steps)
    return out


def window_hours(values: Mapping[str, Any]) -> int:
    """Hours after a heal in which a new failure means hardware service (0: never)."""
    return groupvars.whole_number(dict(values), WINDOW_VAR, DEFAULT_WINDOW_HOURS, minimum=0)


def first_failed(report: Mapping[str, Any]) -> str | None:
    """The first failing check of a health report (the checker lists the most specific first)."""
    return next((c["name"] for c in report.get("checks", []) if c.get("status") == "fail"), None)


def healed_recently(last_healed: Action | None, now: datetime, hours: int) -> bool:
    return hours > 0 and last_healed is not None and last_healed.at >= stamp(now - timedelta(hours=hours))


@dataclass
class Case:
    """One node on its ladder: the check that drained it and the steps still to try."""

    node: str
    check: str
    steps: list[str]
    tried: list[str] = field(default_factory=list)

    def next_step(self) -> str | None:
        return self.steps[0] if self.steps else None

    def advance(self) -> str:
        step = self.steps.pop(0)
        self.tried.append(step)
        return step
