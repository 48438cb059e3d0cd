"""Live progress of a playbook run and the per-host summary at its end (rich)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from corectl.runner import RunResult, failure_detail, reported_change


class LiveProgress:
    """An ansible-runner event sink: current play/task, host counts, elapsed time, failures."""

    def __init__(self, console: Console, title: str) -> None:
        self.console = console
        self.title = title
        self.play = ""
        self.task = ""
        self.tasks = 0
        self.hosts_ok: set[str] = set()
        self.hosts_changed: set[str] = set()
        self.hosts_failed: set[str] = set()
        self.hosts_seen: set[str] = set()
        self.started = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def _render(self) -> Group:
        elapsed = time.monotonic() - self.started
        line = Text.assemble(
            (f"{self.title} ", "bold"),
            (f"{elapsed:5.0f}s ", "cyan"),
            f"hosts {len(self.hosts_seen)} ",
            ("changed ", "yellow"),
            f"{len(self.hosts_changed)} ",
            ("failed ", "red"),
            f"{len(self.hosts_failed)}",
        )
        return Group(line, Text(f"  play: {self.play}", style="dim"), Text(f"  task {self.tasks}: {self.task}"))

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        host = data.get("host")
        if kind == "playbook_on_play_start":
            self.play = data.get("name") or data.get("play", "")
            if self._live is None:
                self.console.print(f"PLAY {self.play}")
        elif kind == "playbook_on_task_start":
            self.task = data.get("task", "")
            self.tasks += 1
        elif kind.startswith("runner_on_") and host:
            self.hosts_seen.add(host)
            if kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
                self.hosts_failed.add(host)
                detail = failure_detail(data, unreachable=kind == "runner_on_unreachable")
                self.console.print(Text.assemble(("FAILED", "red"), f" {host}: {data.get('task', '')}: {detail}"))
            elif kind == "runner_on_ok" and reported_change(event):
                self.hosts_changed.add(host)
        if self._live is not None:
            self._live.update(self._render())


def summary_table(result: RunResult) -> Group:
    """Every host the run reached with its counts (partial ones for a canceled run), then one line
    per failed or unreachable host with what Ansible said."""
    table = Table(title=f"{result.status} in {result.elapsed:.0f}s", title_justify="left")
    for column in ("host", "ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(column, justify="left" if column == "host" else "right")
    for host, stats in sorted(result.hosts.items()):
        style = "red" if stats.failed or stats.unreachable else ("yellow" if stats.changed else "")
        table.add_row(
            host,
            str(stats.ok),
            str(stats.changed),
            str(stats.failed),
            str(stats.unreachable),
            str(stats.skipped),
            style=style,
        )
    notes = []
    for host in result.failed_hosts:
        kind = "unreachable" if result.hosts[host].unreachable else "failed"
        notes.append(Text(f"{kind} {host}: {result.messages.get(host, '')}".rstrip(": "), style="red"))
    return Group(table, *notes)
