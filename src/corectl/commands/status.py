"""status: every compute node's Slurm state, reason and running jobs (read on the controller)."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from corectl import hostlist
from corectl.commands.failures import rule
from corectl.commands.health import verdict_failed
from corectl.errors import CorectlError
from corectl.failures import Offenders
from corectl.runner import RunRequest, run_playbook
from corectl.site import Site
from corectl.words import counted

QUIET_STATE = "idle"  # sinfo %t: "idle*" (not responding) and "idle~" (powered off) are not quiet
BAD_STATES = ("drain", "drng", "down", "fail")


@dataclass
class SlurmStatus:
    states: dict[str, tuple[str, str]] = field(default_factory=dict)  # node -> (state, reason)
    jobs: dict[str, list[str]] = field(default_factory=dict)  # job id -> nodes

    def busy_nodes(self) -> set[str]:
        return {node for nodes in self.jobs.values() for node in nodes}

    def jobs_on(self, node: str) -> list[str]:
        return sorted(job for job, nodes in self.jobs.items() if node in nodes)


def parse_status(data: dict) -> SlurmStatus:
    states = {row[0]: (row[1], row[2] if len(row) > 2 else "") for row in data.get("nodes", []) if row}
    # a job's nodes: Slurm's host list ("dgx[01-04]"), or already a list of names
    jobs: dict[str, list[str]] = {}
    for job, nodes in data.get("jobs", []):
        jobs[str(job)] = hostlist.expand(nodes) if isinstance(nodes, str) else list(nodes)
    return SlurmStatus(states=states, jobs=jobs)


def read_slurm_status(site: Site, console: Console | None = None) -> SlurmStatus:
    with tempfile.TemporaryDirectory(prefix="corectl-status-") as tmp:
        out = Path(tmp) / "status.json"
        request = RunRequest(
            site=site,
            playbook="slurm-status.yml",
            command="status",
            extravars={"corectl_status_out": str(out)},
            secrets=False,
        )
        result = run_playbook(request)
        if not result.ok or not out.is_file():
            why = "; ".join(result.failure_lines()) or result.status
            raise CorectlError(f"could not read the Slurm state from the controller ({why}); see {result.artifact_dir}")
        return parse_status(json.loads(out.read_text()))


def _reason(reason: str) -> str:
    return "" if reason == "none" else reason


def is_quiet(status: SlurmStatus, node: str, health: dict[str, str], busy: set[str]) -> bool:
    """Idle, no reason, no job, and its last health check passed (or it was never checked)."""
    state, reason = status.states[node]
    return state == QUIET_STATE and not _reason(reason) and node not in busy and not verdict_failed(health.get(node))


def status_summary(status: SlurmStatus, health: dict[str, str]) -> Text:
    """``1,000 nodes: 995 idle, 3 drain, 2 down; health failed on 3``."""
    counts = Counter(state for state, _ in status.states.values())
    by_count = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    text = Text(f"{counted(len(status.states), 'node')}: " + ", ".join(f"{n:,} {state}" for state, n in by_count))
    failing = sum(1 for node in status.states if verdict_failed(health.get(node)))
    if failing:
        text.append(f"; health failed on {failing:,}", style="red")
    return text


def quiet_line(names: list[str]) -> Text:
    """The quiet nodes as one Slurm host list; it wraps to a line of its own rather than being cut."""
    return Text.assemble(("idle and healthy", "green"), f" ({len(names):,}): ", hostlist.compress(names))


def exceptions_table(status: SlurmStatus, names: list[str], health: dict[str, str]) -> Table:
    """One row per node that needs a look: node and state never cut, the rest wraps."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("node", no_wrap=True)
    table.add_column("state", no_wrap=True)
    for column in ("reason", "jobs", "health"):
        table.add_column(column, overflow="fold")
    for node in names:
        state, reason = status.states[node]
        verdict = health.get(node)
        bad = state.startswith(BAD_STATES) or verdict_failed(verdict)
        table.add_row(
            node, state, _reason(reason), ", ".join(status.jobs_on(node)), verdict or "-", style="red" if bad else None
        )
    return table


def offenders_line(offenders: Offenders, nodes: Iterable[str]) -> Text | None:
    """``repeat offenders (>=3 failing health runs in 7 days): dgx07 (4), dgx12 (3)``, of ``nodes``."""
    known = set(nodes)
    named = [f"{node} ({count})" for node, count in offenders.counts.items() if node in known]
    if not named:
        return None
    return Text(f"repeat offenders ({rule(offenders.failures, offenders.days)}): {', '.join(named)}", style="yellow")


def status_table(
    status: SlurmStatus, health: dict[str, str] | None = None, offenders: Offenders | None = None
) -> Group:
    """A summary by state, the quiet nodes as one host list, the other nodes one per row, and the
    repeat offenders (``offenders``: corectl.failures.repeat_offenders) among them in one line."""
    health = health or {}
    if not status.states:
        return Group(Text("status: Slurm reported no compute nodes"))
    busy = status.busy_nodes()
    quiet: list[str] = []
    others: list[str] = []
    for node in sorted(status.states):
        (quiet if is_quiet(status, node, health, busy) else others).append(node)
    parts: list[RenderableType] = [status_summary(status, health)]
    if quiet:
        parts.append(quiet_line(quiet))
    if others:
        parts.append(exceptions_table(status, others, health))
    repeat = offenders_line(offenders, status.states) if offenders else None
    if repeat:
        parts.append(repeat)
    return Group(*parts)
