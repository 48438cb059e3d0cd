"""provision: validate, render, run the site playbook with live progress, summarise."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from corectl import ansible, secrets
from corectl.ansible import EventSink, RunRequest, RunResult, changed_paths, reported_change
from corectl.ansible.records import expected_from_history
from corectl.progress import LiveProgress, summary_table
from corectl.site.context import Context
from corectl.words import counted

SHARD_LINES = 12  # more shards than this: only those that did not succeed get a line


def provision(
    ctx: Context,
    console: Console,
    *,
    limit: str | None = None,
    tags: str | None = None,
    check: bool = False,
    diff: bool = False,
    playbook: str = "site.yml",
    command: str = "provision",
    on_event: EventSink | None = None,
    local: bool = False,
) -> RunResult:
    site, cluster = ctx.site, ctx.rendered()
    secrets.check(site)  # a missing or placeholder secret stops the run before any node is touched
    request = RunRequest.of(
        ctx,
        playbook=playbook,
        command=command,
        limit=limit,
        tags=tags,
        check=check,
        diff=diff,
        fan_out=not local,
    )
    declined = ansible.node_local_declined(request, cluster)
    if declined:
        console.print(f"node_local auto: this run goes from the control host ({declined})", highlight=False)
    expected = expected_from_history(site, command, playbook, tags=tags, check=check)
    with LiveProgress(console, f"{command} {site.name}", expected) as progress:

        def sink(event: dict[str, Any]) -> None:
            progress(event)
            if on_event is not None:
                on_event(event)

        result = ansible.run(request, sink, cluster=cluster)
    console.print(summary_table(result))
    totals = (
        f"changed={result.changed} failed={len(result.failed_hosts)} hosts={len(result.hosts)} "
        f"artifacts={result.artifact_dir}"
    )
    console.print(totals, highlight=False, soft_wrap=True)
    if result.cpu:
        own, spent = result.cpu["corectl"], result.cpu["corectl"] + result.cpu["children"]
        console.print(f"control host CPU: {spent:.1f} s (corectl itself {own:.1f} s)", highlight=False)
    shown = result.shards
    if len(shown) > SHARD_LINES:  # a node-local run has a shard per node: name those that did not succeed
        shown = [shard for shard in result.shards if shard.status != "successful"]
        console.print(f"{len(result.shards) - len(shown)} of {len(result.shards)} shards successful", highlight=False)
    for shard in shown:
        hosts = counted(len(shard.hosts), "host")
        groups = shard.groups if len(shard.groups) <= 4 else [*shard.groups[:3], f"{len(shard.groups) - 3} more"]
        held = f" ({', '.join(groups)})" if len(shard.groups) > 1 else ""
        line = f"shard {shard.name}{held} on runner {shard.runner}: {shard.status}, {hosts}, {shard.elapsed:.0f}s"
        console.print(line + (f" ({shard.error})" if shard.error else ""), highlight=False, soft_wrap=True)
    return result


def changes_from(events: list[dict[str, Any]]) -> dict[str, list[str]]:
    """host -> the tasks that reported (or, in check mode, would report) a change, in run order."""
    changes: dict[str, list[str]] = {}
    for event in events:
        if event.get("event") not in ("runner_on_ok", "runner_item_on_ok"):
            continue
        data = event.get("event_data", {})
        if not reported_change(event):
            continue
        role = data.get("role", "")
        paths = changed_paths(data)  # a files task: name each path it changed instead
        names = [f"{role}: {path}" for path in paths] if paths else [f"{role}: {data.get('task', '')}"]
        tasks = changes.setdefault(str(data.get("host")), [])
        tasks.extend(name.lstrip(": ") for name in names if name.lstrip(": ") not in tasks)
    return changes


def plan_table(changes: dict[str, list[str]]) -> Table:
    table = Table(title="what a provision would change")
    table.add_column("host")
    table.add_column("tasks that would change")
    for host in sorted(changes):
        table.add_row(host, "\n".join(changes[host]))
    return table


def plan(ctx: Context, console: Console, *, limit: str | None = None, tags: str | None = None) -> RunResult:
    """provision --check --diff, then a per-host list of the tasks that would change something."""
    events: list[dict[str, Any]] = []
    result = provision(
        ctx, console, limit=limit, tags=tags, check=True, diff=True, command="plan", on_event=events.append
    )
    changes = changes_from(events)
    console.print(plan_table(changes) if changes else "nothing would change")
    return result
