"""One run lifecycle (issue 46, corectl.ansible.lifecycle): a run from this host, a run fanned out over runner hosts
and a node-local run of the same no-op end in the same record and the same per-host counts.

Each run goes through corectl.ansible.run as a command's would, on its own copy of a site of head01 + dgx01 + dgx02
(prod's cluster.yml, plus `control:` or `node_local:`). What differs from the real thing is how a job reaches its
host: SSH to a runner or node is replaced by `sh -c` of the same remote command on this machine (a real
`ansible-runner worker`, after the real stamp and Python checks), and every host is this machine (a local
connection, forced by extra vars). Nothing of Ansible or ansible-runner is mocked.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, probe_project
from corectl import ansible, store
from corectl.ansible.events import Returned, RunRequest, RunResult
from corectl.ansible.remote import runnerhost
from corectl.site import Site
from corectl.site.inventory import render_site

PROBE = """\
- name: Every node
  hosts: all
  gather_facts: false
  tasks:
    - name: Look at the node
      ansible.builtin.command: echo "{{ inventory_hostname }} looked at"
      register: probe_look
      changed_when: false
    - name: Hand what was seen back to corectl
      ansible.builtin.set_stats:
        data:
          corectl_probe: "{{ {inventory_hostname: probe_look} }}"
        per_host: false
    - name: Only on the GPU nodes
      ansible.builtin.debug:
        msg: a GPU node
      when: inventory_hostname is match('dgx')
"""
LIMIT = "head01,dgx01,dgx02"
# every host is this machine, whatever the inventory says of it
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
# what a record says of the run itself; not when or how long, the parts it had or its task count (tasks started,
# summed over its parts: the next like run's progress total)
SAME = ("command", "playbook", "limit", "tags", "check", "status", "rc", "hosts", "messages")


def _section(kind: str, tmp: Path) -> str:
    if kind == "fanned":
        return (
            f"control:\n  runners:\n    - {{name: r1, host: 127.0.0.1}}\n    - {{name: r2, host: 127.0.0.2}}\n"
            f"  runner_dir: {tmp / 'runner'}\n  worker_dir: {tmp / 'jobs'}\n"
        )
    if kind == "node-local":  # one node at a time, in this process
        return f"node_local:\n  mode: on\n  parallel: 1\n  install_dir: {tmp / 'runner'}\n  job_dir: {tmp / 'jobs'}\n"
    if kind == "node-local-processes":  # each node followed by a process of its own (their jobs: one at a time, _here)
        return (
            f"node_local:\n  mode: on\n  parallel: 2\n  processes: 2\n"
            f"  install_dir: {tmp / 'runner'}\n  job_dir: {tmp / 'jobs'}\n"
        )
    return ""


def _site(tmp_path: Path, kind: str) -> Site:
    """The probe project with prod's cluster.yml as its site (its key made here), rendered."""
    site = probe_project(tmp_path / kind, PROBE.replace("Every node", f"Every node ({kind})", 0))
    (site.root / "playbooks" / "probe.yml").rename(site.root / "playbooks" / "site.yml")
    text = (ROOT / "inventories" / "prod" / "cluster.yml").read_text().replace("~/.ssh/corectl_ed25519", "node_key")
    (site.directory / "cluster.yml").write_text(text + _section(kind, tmp_path / kind))
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(site.directory / "node_key")], check=True)
    (tmp_path / kind / "runner").mkdir()
    (tmp_path / kind / "runner" / "stamp").write_text(runnerhost.stamp() + "\n")
    (tmp_path / kind / "jobs").mkdir()
    return site


def _here(site: Site, host: Any, _key: Any, command: str, _jump: str | None = None) -> list[str]:
    """A runner's or node's remote command, on this machine instead of through SSH. A node-local job has the same
    directory on every node: here, where every node is this machine, one job at a time runs (flock), whichever
    corectl process started it. Which process started each host's job is noted in STARTED_BY."""
    with (site.directory / STARTED_BY).open("a") as noted:
        noted.write(f"{host.name} {os.getpid()}\n")
    return ["flock", str(site.directory / "one-job-at-a-time"), "sh", "-c", command]


STARTED_BY = "started-by"


def _run(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> tuple[RunResult, dict[str, Any], Site]:
    site = _site(tmp_path, kind)
    cluster, _ = render_site(site, check_only=False)
    monkeypatch.setattr(runnerhost, "ssh_argv", _here)
    events: list[dict[str, Any]] = []
    returned = Returned("corectl_probe", events.append)
    request = RunRequest(site=site, limit=LIMIT, extravars=dict(LOCAL), secrets=False)
    result = ansible.run(request, returned, cluster=cluster)
    # what each host handed back (set_stats), merged over the run's parts, whichever way it ran
    assert {host: res["stdout"] for host, res in returned.by_host.items()} == {
        host: f"{host} looked at" for host in LIMIT.split(",")
    }
    assert result.ok, (result.status, result.failure_lines(), [s.error for s in result.shards])
    record = json.loads((result.artifact_dir / "corectl.json").read_text())
    assert [row["id"] for row in store.runs(site)] == [result.artifact_dir.name]  # in the index, once
    assert {e.get("event_data", {}).get("host") for e in events} >= set(LIMIT.split(","))  # the display saw them
    return result, record, site


@pytest.fixture(scope="module")
def from_here(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunResult, dict[str, Any]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        result, record, _ = _run(tmp_path_factory.mktemp("lifecycle"), "here", monkeypatch)
    assert "shards" not in record and result.shards == []
    return result, record


@pytest.mark.parametrize(("kind", "parts"), [("fanned", 2), ("node-local", 3), ("node-local-processes", 3)])
def test_every_way_of_running_ends_in_the_same_record(
    from_here: tuple[RunResult, dict[str, Any]], kind: str, parts: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    here, here_record = from_here
    result, record, site = _run(tmp_path, kind, monkeypatch)
    assert {k: record[k] for k in SAME} == {k: here_record[k] for k in SAME}
    assert result.hosts == here.hosts and sorted(result.hosts) == sorted(LIMIT.split(","))
    assert here.hosts["head01"].skipped == 1 and here.hosts["dgx01"].ok == 3  # counts of the probe, not zeros
    # the record names each part and where it ran; each part's artifacts are in the run's folder
    assert len(record["shards"]) == parts and all(s["status"] == "successful" for s in record["shards"])
    assert sorted(h for s in record["shards"] for h in s["hosts"]) == sorted(LIMIT.split(","))
    assert (result.artifact_dir / "shards").is_dir() and result.artifact_dir.parent == site.runs_dir
    # the node-local jobs were started by this process, or each by a process of its own
    started_by = dict(line.split() for line in (site.directory / STARTED_BY).read_text().splitlines())
    nodes = {started_by.get(n) for n in ("dgx01", "dgx02")}
    if kind == "node-local":
        assert nodes == {str(os.getpid())}
    elif kind == "node-local-processes":
        assert len(nodes) == 2 and str(os.getpid()) not in nodes, started_by
    # no job is left behind on the "runners" or "nodes"
    assert list((tmp_path / kind / "jobs").iterdir()) == [], shlex.join(map(str, (tmp_path / kind).iterdir()))
