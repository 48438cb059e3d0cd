"""Node jobs followed from several processes (issue 49 item 1, corectl.ansible.remote.followers): what crosses from a
group's process to the run's (corectl.ansible.events.slim) tallies and shows as the whole events would, and the
groups' processes hand back their events and results, die alone and stop when told."""

from __future__ import annotations

import io
import json
import os
import threading
from typing import Any

import pytest
from rich.console import Console

from corectl.ansible.events import RECORD_KEY, EventSink, Returned, Tally, crosses, slim
from corectl.ansible.remote import followers
from corectl.commands.provision import changes_from
from corectl.progress import LiveProgress

FACTS = {"ansible_facts": {"ansible_mounts": [{"mount": f"/m{i}", "size": i} for i in range(200)]}}


def result(kind: str, host: str, task: str, data: dict[str, Any] | None = None, **res: Any) -> dict[str, Any]:
    event_data: dict[str, Any] = {"host": host, "task": task, "play": "Slurm compute nodes", "res": res}
    event_data.update(data or {})
    return {"event": f"runner_on_{kind}", "event_data": event_data, "uuid": f"{host}-{task}", "counter": 1}


EVENTS = [
    {"event": "playbook_on_play_start", "event_data": {"name": "Slurm compute nodes", "play": "Slurm compute nodes"}},
    {"event": "playbook_on_task_start", "event_data": {"task": "Gather", "name": "Gather"}},
    {"event": "runner_on_start", "event_data": {"host": "dgx01", "task": "Gather"}, "stdout": ""},
    {"event": "verbose", "event_data": {}, "stdout": "Using /p/ansible.cfg as config file"},
    {"event": "warning", "event_data": {}, "stdout": "[WARNING]: a deprecated option"},
    result("ok", "dgx01", "Gather", changed=False, **FACTS),
    result("ok", "dgx02", "Gather", changed=True, **FACTS),
    result("ok", "dgx01", "Write the files", {"role": "slurm"}, changed=True, changed_paths=["/etc/slurm/gres.conf"]),
    {**result("ok", "dgx02", "Write the files", {"role": "slurm"}, changed=False), "event": "runner_item_on_ok"},
    # a no_log result: censored down to a notice, its change said only by Ansible's own line
    {**result("ok", "dgx01", "Write the munge key", censored="hidden"), "stdout": "changed: [dgx01]"},
    result("ok", "dgx02", "Read the units", changed=False, warnings=["an account still has jobs"], stdout="x" * 5000),
    result("failed", "dgx01", "Probe the GPUs", {"ignore_errors": True}, msg="no GPU yet"),
    result("failed", "dgx02", "Start slurmd", msg="non-zero return code", rc=3, stderr="a\nslurmd: fatal\n"),
    result("unreachable", "dgx03", "Gather", msg="ssh: connect to host dgx03 port 22: Connection refused"),
    result("skipped", "dgx01", "Only on the head"),
    {
        "event": "playbook_on_stats",
        "event_data": {
            "ok": {"dgx01": 3, "dgx02": 2},
            "changed": {"dgx01": 1, "dgx02": 1},
            "failures": {"dgx02": 1},
            "dark": {"dgx03": 1},
            "artifact_data": {RECORD_KEY: {"dgx01": {"packages": [{"name": "slurmd"}]}}, "corectl_probe": {"dgx01": 1}},
        },
    },
]


def seen(events: list[dict[str, Any]]) -> tuple[Any, ...]:
    """What a run's tally, a Returned and the live display make of ``events``."""
    tally, out = Tally(), io.StringIO()
    returned = Returned("corectl_probe", tally)
    with LiveProgress(Console(file=out, width=200), "provision", clock=lambda: 0.0) as progress:
        for event in events:
            returned(event)
            progress(event)
    counts = {host: vars(stats) for host, stats in tally.hosts.items()}
    finals = {host: vars(stats) for host, stats in tally.finals.items()}
    shown = out.getvalue()
    planned = changes_from(events)  # corectl plan's list (a check run's events)
    handed = (tally.recorded, returned.by_host, returned.unreachable)
    return counts, finals, tally.messages, tally.tasks, *handed, shown, planned


@pytest.mark.parametrize("verbose", ["0", "2"])
def test_slim_events_tally_return_and_show_as_the_whole_events(verbose: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ANSIBLE_VERBOSITY", verbose)
    slimmed = [slim(event) for event in EVENTS if crosses(event, int(verbose))]
    assert seen(slimmed) == seen(EVENTS)
    assert len(slimmed) == (len(EVENTS) if verbose != "0" else len(EVENTS) - 3)  # (-v: Ansible's every line shown)
    counts, _finals, messages, *_, planned = seen(EVENTS)
    assert planned["dgx01"] == ["slurm: /etc/slurm/gres.conf", "Write the munge key"]
    assert counts["dgx01"] == {**counts["dgx01"], "changed": 2, "ignored": 1, "skipped": 1}  # not zeros
    assert messages["dgx02"] == "Start slurmd: non-zero return code 3: slurmd: fatal"
    # what crosses is small: a result's module output stays in the job's events file
    assert "ansible_mounts" not in json.dumps(slimmed) and len(json.dumps(slimmed)) * 8 < len(json.dumps(EVENTS))


def test_items_are_dealt_round_robin_into_groups_none_empty():
    assert followers.split([1, 2, 3, 4, 5], 2) == [[1, 3, 5], [2, 4]]
    assert followers.split([1, 2], 4) == [[1], [2]]
    assert followers.split([1, 2, 3], 1) == [[1, 2, 3]]


def test_each_group_runs_in_its_own_process_its_events_delivered_here_and_its_results_in_order():
    def work(group: list[int], send: EventSink) -> list[tuple[int, int]]:
        for item in group:
            send({"event": "runner_on_ok", "item": item, "pid": os.getpid()})
        return [(item, os.getpid()) for item in group]

    delivered: list[dict[str, Any]] = []
    ended = followers.run_groups([[1, 3], [2]], work, delivered.extend, lambda: False, lambda: None)
    assert [[item for item, _ in results] for results in ended if not isinstance(results, str)] == [[1, 3], [2]]
    pids = {pid for results in ended if not isinstance(results, str) for _, pid in results}
    assert len(pids) == 2 and os.getpid() not in pids  # one process per group, neither this one
    assert sorted(e["item"] for e in delivered) == [1, 2, 3]
    assert {e["pid"] for e in delivered} == pids


def test_a_group_whose_process_dies_fails_alone_with_why():
    def work(group: list[int], send: EventSink) -> list[int]:
        if 2 in group:
            os._exit(7)  # (as a kill would: no result, no clean-up)
        return group

    ended = followers.run_groups([[1], [2]], work, lambda _events: None, lambda: False, lambda: None)
    assert ended == [[1], "its process ended without a result (exit 7)"]


def test_cancel_here_stops_every_groups_work_there():
    stopped = threading.Event()  # (each process has its own copy: set there by "stop")
    asked = threading.Event()

    def work(group: list[int], send: EventSink) -> list[str]:
        send({"event": "runner_on_start", "item": group[0]})
        return ["stopped" if stopped.wait(60) else "not stopped"]

    def deliver(events: list[dict[str, Any]]) -> None:
        if len(events) and events[0]["item"] == 2:
            asked.set()

    ended = followers.run_groups([[1], [2]], work, deliver, asked.is_set, stopped.set)
    assert ended == [["stopped"], ["stopped"]]


def test_a_groups_events_go_back_in_one_batch_and_none_is_lost_when_its_work_ends(monkeypatch):
    monkeypatch.setattr(followers, "FLUSH_S", 60.0)  # (the fork takes it along: the first event waits for others)

    def work(group: list[int], send: EventSink) -> list[int]:
        for item in range(3):
            send({"event": "runner_on_ok", "item": item})
        return group

    batches: list[list[dict[str, Any]]] = []
    ended = followers.run_groups([[1]], work, batches.append, lambda: False, lambda: None)
    assert ended == [[1]]
    assert [[e["item"] for e in batch] for batch in batches] == [[0, 1, 2]]  # sent once, as the work ended
