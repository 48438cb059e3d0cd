"""bench/noop_plays.py: each play's task results, tasks and time from a run's events, and the table of two runs."""

from __future__ import annotations

import sys
from typing import Any

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import noop_plays


def event(kind: str, second: int, **data: Any) -> dict[str, Any]:
    return {"event": kind, "created": f"2026-12-03T10:00:{second:02d}+00:00", "event_data": data}


def run(extra_play: bool) -> list[dict[str, Any]]:
    events = [
        event("playbook_on_play_start", 0, name="Base OS settings"),
        event("playbook_on_task_start", 0, task="Set the time zone"),
        event("runner_on_ok", 1, host="dgx01", task="Set the time zone", res={"changed": False}),
        event("runner_on_ok", 1, host="head01", task="Set the time zone", res={"changed": True}),
        event("playbook_on_task_start", 2, task="Install base packages"),
        event("runner_on_skipped", 3, host="dgx01", task="Install base packages"),
        event("runner_on_ok", 3, host="head01", task="Install base packages", res={}),
    ]
    if extra_play:
        events += [
            event("playbook_on_play_start", 4, name="Logs"),
            event("playbook_on_task_start", 4, task="Forward"),
            event("runner_on_ok", 6, host="dgx01", task="Forward", res={}),
        ]
    return [*events, event("playbook_on_stats", 10)]


def test_a_plays_results_hosts_tasks_and_seconds_are_read_from_its_events():
    found = noop_plays.plays(run(extra_play=True))
    base, logs = found["Base OS settings"], found["Logs"]
    assert (base.checked, base.results["skipped"], base.tasks, base.hosts, base.seconds) == (
        3, 1, 2, {"dgx01", "head01"}, 4.0
    )  # fmt: skip
    assert (logs.checked, logs.tasks, logs.seconds) == (1, 1, 6.0)


def test_the_table_puts_runs_side_by_side_with_the_change_against_the_first():
    lines = noop_plays.table({"old": noop_plays.plays(run(False)), "new": noop_plays.plays(run(True))})
    rows = {line.split(" | ")[0].strip(): line for line in lines[2:]}
    assert rows["Logs"].split(" | ")[1].strip() == "-" and rows["Logs"].endswith("+1")
    assert rows["Base OS settings"].endswith("+0")
    assert rows["total"].split(" | ")[1].split() == ["3", "1", "2", "10"]  # results, skipped, tasks, seconds
    assert rows["total"].split(" | ")[2].split() == ["4", "1", "3", "10"] and rows["total"].endswith("+1")
