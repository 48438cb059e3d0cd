"""Live progress of a playbook run and the per-host summary at its end (rich)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from corectl.ansible.events import FAILURES, SHARD_KEY, RunResult, failure_detail, outcome, verbosity
from corectl.ansible.records import Expected
from corectl.words import counted


def warning_text(warning: object) -> str:
    """A module warning as a task result carries it: a string, or (ansible-core 2.19's result
    profiles) a mapping with the text under event.msg or msg."""
    if isinstance(warning, dict):
        event = warning.get("event")
        text = event.get("msg") if isinstance(event, dict) else warning.get("msg")
        return str(text if text is not None else warning)
    return str(warning)


REDRAW_S = 0.25  # the live display's refresh (Live's refresh_per_second=4): a result drawn sooner is not seen


def _seconds(value: float) -> str:
    return f"{value:.0f}s" if value < 120 else f"{value / 60:.0f}m"


def overall(tasks: int, expected: Expected | None) -> str:
    """Tasks started against the last successful run like this one, with the time that leaves
    at that run's pace; '' when there is no such run."""
    if expected is None:
        return ""
    total, elapsed = expected
    if tasks >= total:
        return f"task {tasks}/{total}"  # past the last run's count: no guess at the rest
    return f"task {tasks}/{total}, ~{_seconds(elapsed * (total - tasks) / total)} left"


@dataclass
class PlayTally:
    """One play's hosts as their task results come."""

    name: str
    started: float
    hosts: set[str] = field(default_factory=set)
    changed: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)

    def add(self, host: str, result: str) -> None:
        self.hosts.add(host)
        if result == "changed":
            self.changed.add(host)
        elif result in FAILURES:
            self.failed.add(host)

    def line(self, now: float) -> str:
        """e.g. "PLAY Slurm compute nodes: 3 hosts, 3 ok, 1 changed, 0 failed, 12s"."""
        ok = len(self.hosts - self.failed)
        counts = f"{counted(len(self.hosts), 'host')}, {ok} ok, {len(self.changed)} changed, {len(self.failed)} failed"
        return f"PLAY {self.name}: {counts}, {_seconds(now - self.started)}"


class LiveProgress:
    """An ansible-runner event sink: current play/task, host counts, elapsed time, failures.

    A play is reported when it ends, in one line, and only if it ran on a host: Ansible starts
    every play of the playbook, also those whose hosts pattern matches nothing in this run.
    ``expected`` (corectl.ansible.records.expected_from_history) adds tasks started against that total and an
    estimate of the time left. With Ansible asked to be verbose (`corectl -v`: ANSIBLE_VERBOSITY), Ansible's own
    output of each event is printed as it comes, above the live lines.
    """

    def __init__(
        self,
        console: Console,
        title: str,
        expected: Expected | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.title = title
        self.expected = expected
        self.clock = clock
        self.plays: dict[str, PlayTally] = {}  # the current play of each shard ("" for a run without)
        self.task = ""
        self.tasks = 0
        self.hosts_changed: set[str] = set()
        self.hosts_failed: set[str] = set()
        self.hosts_seen: set[str] = set()
        self.started = clock()
        self.verbose = verbosity() > 0
        self._live: Live | None = None
        self._drawn = float("-inf")  # when the live display was last drawn (the clock's time)

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for shard in list(self.plays):
            self._end_play(shard)  # a canceled run sends no playbook_on_stats
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def _render(self) -> Group:
        elapsed = self.clock() - self.started
        line = Text.assemble(
            (f"{self.title} ", "bold"),
            (f"{elapsed:5.0f}s ", "cyan"),
            f"hosts {len(self.hosts_seen)} ",
            ("changed ", "yellow"),
            f"{len(self.hosts_changed)} ",
            ("failed ", "red"),
            f"{len(self.hosts_failed)}",
            (f" {overall(self.tasks, self.expected)}".rstrip(), "cyan"),
        )
        play = "; ".join(f"{p.name} ({counted(len(p.hosts), 'host')} so far)" for p in self.plays.values())
        return Group(line, Text(f"  play: {play}", style="dim"), Text(f"  task {self.tasks}: {self.task}"))

    def _end_play(self, shard: str) -> None:
        """The play's line, if it ran on any host."""
        play = self.plays.pop(shard, None)
        if play is not None and play.hosts:
            note = "" if self._live is not None else overall(self.tasks, self.expected)
            line = play.line(self.clock()) + (f"; {note}" if note else "")
            self.console.print(line, highlight=False, soft_wrap=True, markup=False)

    def _host_event(self, event: dict[str, Any], host: str, shard: str) -> str | None:
        """Count a task result (its outcome, returned) and print its warnings or its failure."""
        self.hosts_seen.add(host)
        result = outcome(event)
        if result is None:
            return None
        if shard in self.plays:
            self.plays[shard].add(host, result)
        data = event.get("event_data") or {}
        for warning in (data.get("res") or {}).get("warnings") or () if result in ("ok", "changed") else ():
            # what a module kept back and why (an account that still has jobs)
            said = Text.assemble(("WARNING", "yellow"), f" {host}: {warning_text(warning)}")
            self.console.print(said, soft_wrap=True)  # one line in a log, as the play's
        if result == "changed":
            self.hosts_changed.add(host)
        elif result in FAILURES:
            self.hosts_failed.add(host)
            detail = failure_detail(data, unreachable=result == "unreachable")
            said = Text.assemble(("FAILED", "red"), f" {host}: {data.get('task', '')}: {detail}")
            self.console.print(said, soft_wrap=True)
        return result

    def __call__(self, event: dict[str, Any]) -> None:
        kind = str(event.get("event", ""))
        if self.verbose and (said := str(event.get("stdout") or "").replace("\r\n", "\n").strip("\n")):
            shard = event.get(SHARD_KEY)  # Ansible's colours as styles: kept on a terminal, dropped in a log
            self.console.print(Text.from_ansi(f"[{shard}] {said}" if shard else said), highlight=False, soft_wrap=True)
        data = event.get("event_data") or {}
        host = data.get("host")
        shard = str(event.get(SHARD_KEY, ""))
        if kind == "playbook_on_play_start":
            self._end_play(shard)
            name = data.get("name") or data.get("play", "")
            self.plays[shard] = PlayTally(f"[{shard}] {name}" if shard else name, self.clock())
        elif kind == "playbook_on_stats":
            self._end_play(shard)
        elif kind == "playbook_on_task_start":
            self.task = data.get("task", "")
            self.tasks += 1
        result = self._host_event(event, host, shard) if kind.startswith("runner_on_") and host else None
        if self._live is not None and self._redraw(kind, result in FAILURES):
            self._live.update(self._render())

    def _redraw(self, kind: str, failed: bool) -> bool:
        """Whether the live display is drawn again for this event: at each play and task and each failure, and for
        other task results at most every REDRAW_S (a fleet's thousands of results per task would each draw it;
        issue 49). A result drawn later is shown with the next event's drawing."""
        now = self.clock()
        if kind.startswith("playbook_on_") or failed or now - self._drawn >= REDRAW_S:
            self._drawn = now
            return True
        return False


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
    return Group(table, *(Text(line, style="red") for line in result.failure_lines()))
