"""runs: the site's past runs, read from what each run leaves in .runs/ (corectl.json, job_events/)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from corectl import hostlist
from corectl.ansible import changed_paths, failure_detail
from corectl.ansible.records import load_runs, read_json
from corectl.ansible.remote.stream import EVENTS, read_events
from corectl.errors import CorectlError
from corectl.progress import FAILURES, outcome
from corectl.site import Site

UNLISTED = ("ok", "skipped", "ignored")  # what `runs --show` counts for a host instead of listing


def _hosts(record: dict[str, Any], key: str) -> list[str]:
    return sorted(h for h, s in record.get("hosts", {}).items() if s.get(key))


def _options(record: dict[str, Any]) -> str:
    """The run's options as given on the command line: --limit, --tags, --check."""
    options = [f"--{key} {record[key]}" for key in ("limit", "tags") if record.get(key)]
    return " ".join([*options, *(["--check"] if record.get("check") else [])])


def _result(record: dict[str, Any]) -> str:
    """The run's status; a fanned-out run's with how many shards it had and how many broke off."""
    status, shards = str(record.get("status", "?")), record.get("shards") or []
    if not shards:
        return status
    broken = sum(1 for shard in shards if shard.get("status") not in ("successful", "failed"))
    return f"{status} ({len(shards)} shards" + (f", {broken} broke off)" if broken else ")")


def runs_table(site: Site, last: int) -> Table:
    table = Table(title=f"runs of {site.name} (newest last; artifacts in {Path(site.runs_dir)})", title_justify="left")
    for column in ("started", "command", "result", "s", "changed", "failed"):
        table.add_column(column)
    for record in load_runs(site)[-last:]:
        failed = sorted(set(_hosts(record, "failed")) | set(_hosts(record, "unreachable")))
        changed = _hosts(record, "changed")
        table.add_row(
            str(record.get("started", "?")).replace("T", " ")[:19],
            f"{record.get('command', '?')} {_options(record)}".strip(),
            _result(record),
            str(record.get("elapsed_s", "")),
            f"{len(changed)}: {', '.join(changed)}" if changed else "0",
            ", ".join(failed) or "-",
            style="red" if failed or record.get("status") != "successful" else "",
        )
    return table


# --------------------------------------------------------------------------- runs --show ID


def run_ids(site: Site) -> list[str]:
    """The kept runs, finished or not, oldest first (a run's id starts with its UTC start time)."""
    if not site.runs_dir.is_dir():
        return []
    runs = (p for p in site.runs_dir.iterdir() if (p / "corectl.json").is_file() or (p / "job_events").is_dir())
    return sorted(p.name for p in runs)


def _shared_prefix(a: str, b: str) -> int:
    """How many leading characters two ids share (run ids are timestamps: the nearest in time)."""
    return next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def resolve_run(site: Site, run_id: str) -> str:
    """A run's full id from ``run_id``: the id itself, a prefix of exactly one id, or `last`."""
    ids = run_ids(site)
    if not ids:
        raise CorectlError(f"no runs kept in {site.runs_dir}", exit_code=2)
    if run_id == "last":
        return ids[-1]
    if run_id in ids:
        return run_id
    matches = [i for i in ids if i.startswith(run_id)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
        raise CorectlError(f"run {run_id!r} is ambiguous: {', '.join(matches[-5:])}{more}", exit_code=2)
    near = sorted(ids, key=lambda i: (_shared_prefix(i, run_id), i))[-3:]
    raise CorectlError(f"no run {run_id!r} in {site.runs_dir}; nearest: {', '.join(reversed(near))}", exit_code=2)


def load_events(run_dir: Path) -> list[dict[str, Any]]:
    """A run's Ansible events in order; the *-partial.json files are incomplete copies of others.

    A fanned-out or node-local run (corectl.ansible.remote) keeps each shard's events under shards/<shard>/, in
    one EVENTS file per job (or, made by an earlier corectl, a job_events folder): those come shard by shard (a
    host is in one shard, so its events keep their order)."""
    shards = run_dir / "shards"
    sources = [run_dir / "job_events", *sorted([*shards.glob("*/**/job_events"), *shards.glob(f"*/**/{EVENTS}")])]
    events: list[dict[str, Any]] = []
    for source in sources:
        if source.name == EVENTS:
            found = read_events(source)
        else:
            paths = (p for p in source.glob("*.json") if not p.name.endswith("-partial.json"))
            found = [event for event in map(read_json, paths) if event is not None]
        events += sorted(found, key=lambda e: int(e.get("counter") or 0))
    return events


@dataclass
class HostReport:
    """What one host's task results were: changes and failures listed, the rest counted."""

    listed: list[tuple[str, str]] = field(default_factory=list)  # (changed|failed|unreachable, what)
    unlisted: Counter[str] = field(default_factory=Counter)


def host_reports(events: list[dict[str, Any]]) -> dict[str, HostReport]:
    reports: dict[str, HostReport] = {}
    for event in events:
        result, data = outcome(event), event.get("event_data") or {}
        if result is None or not data.get("host"):
            continue
        report = reports.setdefault(str(data["host"]), HostReport())
        task = f"{data.get('play', '')} / {data.get('task', '')}"
        if result == "changed":
            paths = changed_paths(data)
            report.listed.append((result, f"{task}: {', '.join(paths)}" if paths else task))
        elif result in FAILURES:
            report.listed.append((result, f"{task}: {failure_detail(data, unreachable=result == 'unreachable')}"))
        else:
            report.unlisted[result] += 1
    return reports


def _counted(counts: Counter[str]) -> str:
    return ", ".join(f"{counts[kind]} {kind}" for kind in UNLISTED if counts[kind]) or "no task results"


def _header(run_id: str, record: dict[str, Any] | None) -> Text:
    if record is None:
        return Text(f"run {run_id}: no corectl.json (still running, or killed)", style="bold")
    command = f"{record.get('command', '?')} {_options(record)}".strip()
    started = str(record.get("started", "?")).replace("T", " ")[:19]
    status = record.get("status", "?")
    return Text.assemble(
        (f"run {run_id}: ", "bold"),
        f"{command} ({record.get('playbook', '?')}), ",
        (str(status), "" if status == "successful" else "red"),
        f", {record.get('elapsed_s', '?')}s, started {started}",
    )


def _shard_lines(shards: list[dict[str, Any]]) -> list[Text]:
    """A fanned-out run's shards: where each ran, how it ended, and why it broke off."""
    lines = []
    for shard in shards:
        status = str(shard.get("status", "?"))
        hosts = hostlist.compress(list(shard.get("hosts") or []))
        text = f"  shard {shard.get('name', '?')} on runner {shard.get('runner', '?')}: {status}, {hosts}"
        error = f" ({shard['error']})" if shard.get("error") else ""
        lines.append(Text(text + error, style="" if status == "successful" else "red"))
    return lines


def _host_lines(host: str, report: HostReport) -> list[Text]:
    styles = {"changed": "yellow", "failed": "red", "unreachable": "red"}
    lines = [Text(host, style="bold")]
    lines += [Text(f"  {kind}: {what}", style=styles[kind]) for kind, what in report.listed]
    lines.append(Text(f"  not listed: {_counted(report.unlisted)}", style="dim"))
    return lines


def _package_lines(recorded: dict[str, Any]) -> list[Text]:
    """The packages a run changed (corectl upgrade os), per host: name, version before and after."""
    lines = []
    for host, handed in sorted(recorded.items()):
        for package in (handed or {}).get("packages") or []:
            before = package.get("before") or "(new)"
            lines.append(Text(f"  {host}: {package.get('name')} {before} -> {package.get('after')}"))
    return [Text("packages", style="bold"), *lines] if lines else []


def show_run(site: Site, run_id: str) -> Group:
    """What a kept run did, per host: the tasks that changed something or failed, the rest counted.

    ``run_id``: a run's id, a prefix of exactly one, or `last`; raises CorectlError otherwise.
    """
    ident = resolve_run(site, run_id)
    run_dir = site.runs_dir / ident
    reports = host_reports(load_events(run_dir))
    record = read_json(run_dir / "corectl.json")
    lines = [_header(ident, record), *_shard_lines((record or {}).get("shards") or [])]
    lines += _package_lines((record or {}).get("recorded") or {})
    if not reports:
        return Group(*lines, Text(f"no task ran on any host (Ansible's output: {run_dir / 'stdout'})"))
    quiet = sorted(host for host, report in reports.items() if not report.listed)
    quiet_counts = sum((reports[host].unlisted for host in quiet), Counter[str]())
    if len(quiet) == len(reports):
        return Group(*lines, Text(f"no changes on {len(quiet)} hosts ({_counted(quiet_counts)})"))
    for host in sorted(set(reports) - set(quiet)):
        lines += _host_lines(host, reports[host])
    if quiet:
        lines.append(Text(f"no changes on {hostlist.compress(quiet)}: {_counted(quiet_counts)}", style="dim"))
    return Group(*lines)
