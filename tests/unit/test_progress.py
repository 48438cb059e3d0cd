"""Live progress: a line per play that ran on a host, and tasks started against a past run's total."""

from __future__ import annotations

import io
import re
from typing import Any

from rich.console import Console

from corectl.ansible.events import Tally
from corectl.progress import LiveProgress, outcome, overall


def play(name: str, pattern: str = "all") -> dict[str, Any]:
    return {"event": "playbook_on_play_start", "event_data": {"name": name, "play": name, "play_pattern": pattern}}


def no_hosts(name: str) -> dict[str, Any]:
    return {"event": "playbook_on_no_hosts_matched", "event_data": {"play": name}}


def task(play_name: str, name: str) -> dict[str, Any]:
    return {"event": "playbook_on_task_start", "event_data": {"play": play_name, "task": name, "name": name}}


def result(kind: str, host: str, task_name: str, **res: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"host": host, "task": task_name, "res": res}
    if res.pop("ignore_errors", False):
        data["ignore_errors"] = True
    return {"event": f"runner_on_{kind}", "event_data": data}


def started(host: str, task_name: str) -> dict[str, Any]:
    return {"event": "runner_on_start", "event_data": {"host": host, "task": task_name}}


STATS = {"event": "playbook_on_stats", "event_data": {"ok": {"dgx01": 3}, "failures": {"dgx02": 1}}}

# site.yml on three nodes: the login play matches no host (Ansible still starts it)
RUN = [
    {"event": "playbook_on_start", "event_data": {}},
    play("Base OS settings on every node"),
    task("Base OS settings on every node", "Set the time zone"),
    *(started(h, "Set the time zone") for h in ("dgx01", "dgx02", "head01")),
    result("ok", "dgx01", "Set the time zone", changed=True),
    result("ok", "dgx02", "Set the time zone", changed=False),
    result("ok", "head01", "Set the time zone", changed=False),
    task("Base OS settings on every node", "Install base packages"),
    *(result("skipped", h, "Install base packages") for h in ("dgx01", "dgx02", "head01")),
    play("Slurm login nodes", "login:!slurm_controller:!compute"),
    no_hosts("Slurm login nodes"),
    play("Slurm compute nodes", "compute"),
    task("Slurm compute nodes", "Probe the GPUs"),
    result("failed", "dgx01", "Probe the GPUs", ignore_errors=True, msg="no GPU yet"),
    result("ok", "dgx02", "Probe the GPUs", changed=False),
    task("Slurm compute nodes", "Start slurmd"),
    result("ok", "dgx01", "Start slurmd", changed=True),
    result("failed", "dgx02", "Start slurmd", msg="slurmd.service failed\nsee journalctl"),
    STATS,
]


class Clock:
    """Five seconds pass between any two readings."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 5
        return self.now


def replay(events: list[dict[str, Any]], expected: tuple[int, float] | None = None) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=80)
    assert not console.is_terminal  # a CI log: lines, no live display
    with LiveProgress(console, "provision core", expected, clock=Clock()) as progress:
        for event in events:
            progress(event)
    return out.getvalue().splitlines()


def test_only_plays_that_ran_on_a_host_are_printed_with_their_counts():
    lines = replay(RUN)
    assert not any("login" in line for line in lines)
    assert lines == [
        "PLAY Base OS settings on every node: 3 hosts, 3 ok, 1 changed, 0 failed, 5s",
        "FAILED dgx02: Start slurmd: slurmd.service failed",
        "PLAY Slurm compute nodes: 2 hosts, 1 ok, 1 changed, 1 failed, 5s",
    ]


def test_a_play_ends_at_the_next_play_and_a_canceled_run_still_reports_the_last():
    # no playbook_on_stats: the run was canceled in the middle of its second play
    lines = replay([play("First"), result("ok", "dgx01", "t"), play("Second"), result("unreachable", "dgx02", "t")])
    assert lines[0] == "PLAY First: 1 host, 1 ok, 0 changed, 0 failed, 5s"
    assert lines[-1] == "PLAY Second: 1 host, 0 ok, 0 changed, 1 failed, 5s"


def test_a_play_that_only_started_tasks_is_not_counted_as_run():
    assert replay([play("Gather"), started("dgx01", "Gathering Facts"), play("Next"), STATS]) == []


def test_tasks_started_against_the_last_runs_total_and_time_left():
    lines = replay(RUN, expected=(8, 80.0))
    # four tasks of eight started when the last play ended: half of the last run's 80 s is left
    assert lines[-1].endswith("5s; task 4/8, ~40s left")
    assert lines[0].endswith("; task 2/8, ~60s left")
    assert replay(RUN)[-1].endswith("failed, 5s")  # no past run: no guess


def test_overall():
    assert overall(3, None) == ""
    assert overall(0, (200, 600.0)) == "task 0/200, ~10m left"
    assert overall(250, (200, 600.0)) == "task 250/200"  # more than last time: no estimate


def test_outcome_of_each_result():
    assert [outcome(e) for e in RUN if outcome(e)] == [
        "changed", "ok", "ok", "skipped", "skipped", "skipped", "ignored", "ok", "changed", "failed",
    ]  # fmt: skip
    assert outcome(started("dgx01", "t")) is None
    assert outcome({"event": "runner_item_on_ok", "event_data": {"host": "dgx01", "res": {"changed": True}}}) is None


def test_the_tally_counts_the_tasks_started():
    tally = Tally()
    for event in RUN:
        tally(event)
    assert tally.tasks == 4


def test_on_a_terminal_the_play_lines_are_printed_above_the_live_display():
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True, color_system=None)
    with LiveProgress(console, "provision core", (8, 80.0), clock=Clock()) as progress:
        for event in RUN:
            progress(event)
    # the live display shows the tasks against the total; the printed line does not repeat it
    assert re.search(r"PLAY Slurm compute nodes: 2 hosts, 1 ok, 1 changed, 1 failed, \d+s\n", out.getvalue())
    assert "task 4/8, ~40s left" in out.getvalue()


def test_what_a_module_warns_of_is_printed_with_its_host():
    kept = "account vision: kept, it has running or pending jobs"
    lines = replay(
        [
            play("Slurm controller"),
            result("ok", "head01", "Converge QOS, accounts and users' associations", changed=False, warnings=[kept]),
            result("ok", "head02", "Converge", changed=True, warnings=[{"event": {"msg": "as 2.19 may carry it"}}]),
            result("failed", "head01", "Other", msg="boom", warnings=["not printed: the failure says it"]),
            STATS,
        ]
    )
    assert lines[:2] == [f"WARNING head01: {kept}", "WARNING head02: as 2.19 may carry it"]
    assert not any("not printed" in line for line in lines)


def test_a_failed_command_is_shown_with_its_exit_status_and_the_last_thing_it_said():
    said = "slurm_reconfigure error: connect failure"
    failed = result("failed", "head02", "Reconfigure slurm", msg="non-zero return code", rc=1, stderr=f"\n{said}\n")
    quiet = result("failed", "head03", "Reconfigure slurm", msg="non-zero return code", rc=1, stderr="")
    lines = replay([play("Slurm controller"), failed, quiet])
    assert lines[:2] == [
        f"FAILED head02: Reconfigure slurm: non-zero return code 1: {said}",
        "FAILED head03: Reconfigure slurm: non-zero return code",
    ]


def test_on_a_terminal_the_live_display_is_drawn_at_each_task_and_for_results_at_most_four_times_a_second():
    class Still:  # a clock that does not move: a fleet's results all come at once
        def __call__(self) -> float:
            return 100.0

    console = Console(file=io.StringIO(), width=120, force_terminal=True, color_system=None)
    results = [result("ok", f"dgx{i:02d}", "Set the time zone", changed=False) for i in range(50)]
    failed = result("failed", "dgx77", "Set the time zone", msg="no such zone")
    events = [play("Base OS settings"), task("Base OS settings", "Set the time zone"), *results, failed]
    with LiveProgress(console, "provision core", clock=Still()) as progress:
        drawn: list[str] = []
        assert progress._live is not None
        progress._live.update = lambda shown, **_: drawn.append(shown.renderables[0].plain.split("s ", 1)[1])  # type: ignore
        for event in [*events, task("Base OS settings", "Next")]:
            progress(event)
    assert drawn == [  # not once per result: the play, its task, the failure, the next task
        "hosts 0 changed 0 failed 0",
        "hosts 0 changed 0 failed 0",
        "hosts 51 changed 0 failed 1",
        "hosts 51 changed 0 failed 1",
    ]
