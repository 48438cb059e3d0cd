"""status: every compute node's Slurm state, reason and running jobs (read on the controller)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from corectl import hostlist
from corectl.errors import CorectlError
from corectl.runner import RunRequest, run_playbook
from corectl.site import Site


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
            raise CorectlError(
                f"could not read the Slurm state from the controller ({result.status}); see {result.artifact_dir}"
            )
        return parse_status(json.loads(out.read_text()))


def status_table(status: SlurmStatus, health: dict[str, str] | None = None) -> Table:
    table = Table(title="nodes")
    for column in ("node", "slurm state", "reason", "jobs", "last health check"):
        table.add_column(column)
    for node in sorted(status.states):
        state, reason = status.states[node]
        style = "red" if state.startswith(("drain", "drng", "down", "fail")) else None
        table.add_row(
            node,
            state,
            "" if reason == "none" else reason,
            ",".join(status.jobs_on(node)),
            (health or {}).get(node, "-"),
            style=style,
        )
    return table
