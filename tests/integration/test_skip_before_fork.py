"""corectl's strategies answer a task whose `when` is false for a host in the strategy's process, without
forking a worker (collections/.../plugin_utils/skipfork.py): the same play on two local hosts gives the same
result for every task and host as Ansible's own linear strategy (read through ansible.posix's json callback),
and forks fewer workers (Ansible's debug log names each worker it starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

BIN = Path(sys.executable).parent

# h1 and h2 local; each kind of task the strategy must answer as the worker would, or leave to a worker
PLAY = """
- name: Skip before the fork
  hosts: all
  gather_facts: false
  tasks:
    - name: A fact that differs per host
      ansible.builtin.set_fact:
        first: "{{ inventory_hostname == 'h1' }}"
    - name: Runs on h1, skipped on h2
      ansible.builtin.command: "true"
      changed_when: false
      when: first | bool
      register: ran
    - name: Skipped everywhere, registered, no_log
      ansible.builtin.command: "false"
      changed_when: false
      when: not (first | bool) and inventory_hostname == 'h1'
      no_log: true
      register: never
    - name: A variable the play context adds (ansible_host) is seen by the condition
      ansible.builtin.set_fact:
        saw_host: "{{ ansible_host }}"
      when: ansible_host is defined
    - name: A loop's condition is per item (left to a worker)
      ansible.builtin.debug:
        msg: "{{ item }}"
      loop: [1, 2]
      when: item == 2
    - name: A condition on an undefined variable fails as before (ignored here)
      ansible.builtin.debug:
        msg: unreachable
      when: no_such_variable
      ignore_errors: true
    - name: What was registered
      ansible.builtin.debug:
        msg: "{{ ran.skipped | default(false) }} {{ never.skipped }} {{ never.false_condition }} {{ saw_host }}"
"""


def play(tmp_path: Path, strategy: str, *, debug: bool = False, skip: str = "1") -> subprocess.CompletedProcess[str]:
    playbook, inventory = tmp_path / "play.yml", tmp_path / "hosts.yml"
    playbook.write_text(PLAY)
    inventory.write_text("all:\n  hosts: {h1: {}, h2: {}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env |= {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STRATEGY": strategy, "ANSIBLE_FORKS": "2"}
    env |= {"ANSIBLE_CORECTL_SKIP_BEFORE_FORK": skip, "ANSIBLE_HOME": str(tmp_path / "home")}
    env |= {"ANSIBLE_DEBUG": "1"} if debug else {"ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    python = f"ansible_python_interpreter={sys.executable}"
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), "-c", "local", "-e", python, str(playbook)]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)


def outcomes(proc: subprocess.CompletedProcess[str]) -> tuple[dict[tuple[str, str], dict], dict]:
    """Each task's result per host (without timings), and the play's statistics, from the json callback."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    drop = {"start", "end", "delta", "invocation"}
    results = {
        (task["task"]["name"], host): {k: v for k, v in result.items() if k not in drop}
        for task in report["plays"][0]["tasks"]
        for host, result in task["hosts"].items()
    }
    return results, report["stats"]


def workers(proc: subprocess.CompletedProcess[str]) -> int:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout.count("worker is ")


@pytest.mark.parametrize("strategy", ["corectl.fleet.linear", "corectl.fleet.mitogen_linear"])
def test_a_false_condition_is_answered_without_a_worker_and_every_result_is_ansibles(tmp_path: Path, strategy: str):
    if strategy.endswith("mitogen_linear"):
        pytest.importorskip("ansible_mitogen")
    stock_tasks, stock_stats = outcomes(play(tmp_path, "ansible.builtin.linear"))
    tasks, stats = outcomes(play(tmp_path, strategy))
    assert tasks == stock_tasks
    assert stats == stock_stats
    assert len(tasks) == 7 * 2
    assert tasks["Runs on h1, skipped on h2", "h2"]["skipped"] is True
    assert tasks["Runs on h1, skipped on h2", "h2"]["false_condition"] == "first | bool"
    assert "skipped" not in tasks["Runs on h1, skipped on h2", "h1"]
    assert tasks["Skipped everywhere, registered, no_log", "h1"]["censored"]  # no_log applies to the skip
    assert tasks["A variable the play context adds (ansible_host) is seen by the condition", "h2"]["ansible_facts"]
    assert tasks["A condition on an undefined variable fails as before (ignored here)", "h1"]["failed"] is True
    assert tasks["What was registered", "h2"]["msg"] == "True True not (first | bool) and inventory_hostname == 'h1' h2"
    # h2's skip of the second task and both hosts' skip of the third: three workers fewer than with it switched off
    forked = workers(play(tmp_path, strategy, debug=True))
    unswitched = workers(play(tmp_path, strategy, debug=True, skip="0"))
    assert unswitched - forked == 3, (unswitched, forked)
