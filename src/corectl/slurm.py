"""Slurm as corectl reads and sets it on the controller: every compute node's state and reason
and the running jobs (playbooks/slurm-status.yml), node names checked against the site, and drain
or resume (playbooks/node-state.yml)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from rich.console import Console

from corectl import ansible, hostlist
from corectl.ansible import RunRequest, RunResult
from corectl.drain_reason import Source
from corectl.errors import CorectlError
from corectl.node_state import SINFO_FORMAT, NodeState, parse_sinfo
from corectl.progress import LiveProgress, summary_table
from corectl.site.context import Context


class NodeEvent(NamedTuple):
    """A drain or down of one node as Slurm's accounting recorded it (sacctmgr show event)."""

    node: str
    start: int  # epoch seconds
    end: int | None  # None: still so
    state: str  # DRAIN, DOWN*, ...
    user: str  # who set it, as Slurm writes it: root(0), slurm(64030)
    reason: str


class SparePool(NamedTuple):
    """A partition's hot spares now (corectl-spares on the controller): those held, and which spare covers which
    failed node."""

    partition: str
    size: int
    held: list[str]
    covers: dict[str, str]  # spare in the partition -> the node it took the place of


class SpareEvent(NamedTuple):
    """A change corectl-spares made: held, swap (``node`` entered for ``covered``), spare (``node``, repaired, held
    again), back (``covered`` took its place back, ``node`` held again), short (no spare for ``node``), released."""

    at: int  # epoch seconds
    partition: str
    event: str
    node: str
    covered: str
    message: str


@dataclass
class SlurmStatus:
    states: dict[str, NodeState] = field(default_factory=dict)  # node -> its state and reason
    jobs: dict[str, list[str]] = field(default_factory=dict)  # job id -> nodes
    events: list[NodeEvent] = field(default_factory=list)  # drains and downs, oldest first
    spares: list[SparePool] = field(default_factory=list)
    spare_events: list[SpareEvent] = field(default_factory=list)  # oldest first

    def busy_nodes(self) -> set[str]:
        return {node for nodes in self.jobs.values() for node in nodes}

    def jobs_on(self, node: str) -> list[str]:
        return sorted(job for job, nodes in self.jobs.items() if node in nodes)


def parse_events(lines: list[str]) -> list[NodeEvent]:
    """``sacctmgr -n -P show event format=NodeName,TimeStart,TimeEnd,State,User,Reason`` with epoch
    times (SLURM_TIME_FORMAT=%s): the node events, oldest first; the cluster's own and lines that
    are not in that shape are left out."""
    events = []
    for line in lines:
        fields = line.split("|", 5)
        if len(fields) != 6 or not fields[0] or not fields[1].isdigit():
            continue
        node, start, end, state, user, reason = fields
        events.append(NodeEvent(node, int(start), int(end) if end.isdigit() else None, state, user, reason))
    return sorted(events, key=lambda e: (e.start, e.node))


def parse_status(data: dict) -> SlurmStatus:
    states = parse_sinfo([str(line) for line in data.get("nodes", [])])  # sinfo's lines of SINFO_FORMAT
    # a job's nodes: Slurm's host list ("dgx[01-04]"), or already a list of names
    jobs: dict[str, list[str]] = {}
    for job, nodes in data.get("jobs", []):
        jobs[str(job)] = hostlist.expand(nodes) if isinstance(nodes, str) else list(nodes)
    spares = data.get("spares") or {}
    pools = [
        SparePool(str(p["partition"]), int(p["size"]), [str(n) for n in p["spares"]], dict(p["covers"]))
        for p in spares.get("pools", [])
    ]
    history = [
        SpareEvent(int(e["at"]), str(e["partition"]), str(e["event"]), str(e["node"]), str(e["for"]), str(e["message"]))
        for e in spares.get("events", [])
    ]
    events = parse_events(list(data.get("events", [])))
    return SlurmStatus(states=states, jobs=jobs, events=events, spares=pools, spare_events=history)


def read_slurm_status(ctx: Context, event_days: int = 30) -> SlurmStatus:
    """Slurm's view, read on the controller now, with the drain and down events of the last ``event_days``."""
    ctx.rendered()
    with tempfile.TemporaryDirectory(prefix="corectl-status-") as tmp:
        out = Path(tmp) / "status.json"
        extravars = {"corectl_status_out": str(out), "corectl_sinfo_format": SINFO_FORMAT}
        request = RunRequest.of(
            ctx,
            playbook="slurm-status.yml",
            command="status",
            extravars=extravars | {"corectl_status_event_days": event_days},
            secrets=False,
            fan_out=False,  # one host's work, on the controller
        )
        result = ansible.run(request, cluster=ctx.cluster)
        if not result.ok or not out.is_file():
            why = "; ".join(result.failure_lines()) or result.status
            kept = f"; see {result.artifact_dir}" if request.record else ""
            raise CorectlError(f"could not read the Slurm state from the controller ({why}){kept}")
        return parse_status(json.loads(out.read_text()))


def compute_names(ctx: Context, expr: str, what: str = "NODE") -> list[str]:
    """The compute nodes a host list names; a malformed list or another node: a one-line error."""
    try:
        names = hostlist.expand(expr)
    except hostlist.HostlistError as exc:
        raise CorectlError(f"{what}: {exc}", exit_code=2) from None
    computes = {n.name for n in ctx.cluster.nodes if "compute" in n.roles}
    unknown = [name for name in names if name not in computes]
    if unknown:
        raise CorectlError(f"not compute nodes of site {ctx.site.name}: {', '.join(unknown)}", exit_code=2)
    return names


def set_state(ctx: Context, console: Console, nodes: str, state: str, reason: str | None = None) -> RunResult:
    ctx.rendered()
    names = compute_names(ctx, nodes)
    if state == "drain" and not (reason and reason.strip()):
        raise CorectlError("a drain needs --reason (Slurm shows it to users and operators)", exit_code=2)
    with tempfile.TemporaryDirectory(prefix="corectl-cleared-") as tmp:
        cleared = Path(tmp) if state == "resume" else None
        result = state_run(ctx, console, names, state, reason, cleared=cleared)
        for line in cleared_lines(cleared) if cleared else []:
            console.print(line, markup=False, highlight=False)
    console.print(summary_table(result))
    return result


def cleared_lines(directory: Path) -> list[str]:
    """What corectl resume ended on each node (the health check's kept failures): one line each."""
    lines = []
    for path in sorted(directory.glob("*.json")):
        try:
            records = json.loads(path.read_text())["cleared"]
        except (OSError, ValueError, KeyError, TypeError):
            lines.append(f"{path.stem}: could not read what was cleared")
            continue
        for record in records:
            lines.append(f"{path.stem}: cleared {record.get('check', '?')}: {record.get('message', '')}")
    return lines


def state_run(
    ctx: Context,
    console: Console,
    names: list[str],
    state: str,
    reason: str | None = None,
    only_source: Source | None = None,
    cleared: Path | None = None,
) -> RunResult:
    """Drain (with ``reason``) or resume ``names`` on the controller (corectl.fleet.slurm_node_state);
    ``only_source``: resume only nodes drained by corectl's program of that source (corectl.drain_reason);
    ``cleared``: first end the failures the health check keeps on each node (an operator's resume), writing
    what was ended there as <node>.json."""
    controller = ctx.rendered().with_role("slurm_controller")[0].name
    extravars = {"corectl_state_nodes": hostlist.compress(names), "corectl_state": state}
    hosts = [controller]
    if cleared is not None:
        extravars |= {"corectl_state_clear": ",".join(names), "corectl_state_cleared_out": str(cleared)}
        hosts += [name for name in names if name != controller]
    if reason:
        extravars["corectl_state_reason"] = reason.strip()
    if only_source:
        extravars["corectl_state_only_source"] = str(only_source)
    request = RunRequest.of(
        ctx,
        playbook="node-state.yml",
        command=f"{state} {hostlist.compress(names)}",
        limit=",".join(hosts),
        extravars=extravars,
        secrets=False,
        fan_out=False,  # the controller's work (and one command on each node being resumed)
    )
    with LiveProgress(console, f"{state} {ctx.site.name}") as progress:
        return ansible.run(request, progress, cluster=ctx.cluster)
