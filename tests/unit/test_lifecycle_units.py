"""cluster.yml edits of add-node/remove-node, the upgrade rollout order, the Slurm status parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import returned
from corectl.commands.upgrade import batches, rollout_order
from corectl.errors import CorectlError, ValidationFailed
from corectl.node_state import NodeState
from corectl.site import edit, resolve_site
from corectl.site.loader import load_cluster
from corectl.slurm import parse_status


def test_add_node_declares_it_keeps_comments_and_joins_the_partition(prod_copy: Path):
    site = resolve_site(str(prod_copy))
    entry = {"address": "10.10.1.23", "profile": "dgx-h100", "roles": ["compute"], "rack": "r02", "leaf": "leaf2"}
    cluster = edit.add_node(site, {"name": "dgx13", **entry}, ["batch"])
    assert cluster.node("dgx13").address == "10.10.1.23"
    text = (prod_copy / "cluster.yml").read_text()
    assert text.startswith("# prod: an example production site")  # the operator's comments stay
    batch = next(p for p in load_cluster(prod_copy).config.slurm.partitions if p.name == "batch")
    assert batch.nodes == "dgx[01-13]"


def test_an_invalid_addition_changes_nothing(prod_copy: Path):
    site = resolve_site(str(prod_copy))
    before = (prod_copy / "cluster.yml").read_text()
    entry = {"name": "dgx13", "address": "10.10.1.11", "profile": "dgx-h100", "roles": ["compute"], "leaf": "leaf2"}
    with pytest.raises(ValidationFailed) as failed:
        edit.add_node(site, entry, [])
    assert "nothing was changed" in failed.value.lines[0]
    assert any(str(prod_copy / "cluster.yml") in line and "10.10.1.11" in line for line in failed.value.lines[1:])
    assert (prod_copy / "cluster.yml").read_text() == before
    with pytest.raises(CorectlError, match="no such partition"):
        edit.add_node(site, {**entry, "address": "10.10.1.30"}, ["gpu-big"])
    assert (prod_copy / "cluster.yml").read_text() == before


def test_remove_node_needs_its_own_entry_and_leaves_partitions_consistent(prod_copy: Path):
    site = resolve_site(str(prod_copy))
    with pytest.raises(CorectlError, match=r"part of dgx\[01-06\]"):
        edit.remove_node(site, "dgx03")
    entry = {"address": "10.10.1.23", "profile": "dgx-h100", "roles": ["compute"], "leaf": "leaf2"}
    edit.add_node(site, {"name": "dgx13", **entry}, ["batch", "interactive"])
    cluster = edit.remove_node(site, "dgx13")
    assert "dgx13" not in {n.name for n in cluster.nodes}
    partitions = {p.name: p.nodes for p in cluster.config.slurm.partitions}
    assert partitions == {"batch": "dgx[01-12]", "interactive": "dgx[11-12]"}


def test_rollout_puts_idle_nodes_first_and_cuts_batches():
    order = rollout_order(["dgx01", "dgx02", "dgx03", "dgx04"], busy={"dgx01", "dgx03"})
    assert order == ["dgx02", "dgx04", "dgx01", "dgx03"]
    assert batches(order, 3) == [["dgx02", "dgx04", "dgx01"], ["dgx03"]]


def test_status_parser():
    status = parse_status(
        {
            "nodes": ["dgx01|alloc|none", "dgx02|drain|corectl-health: ecc: GPU 1"],
            "jobs": [[7, ["dgx01"]]],
        }
    )
    assert status.busy_nodes() == {"dgx01"}
    assert status.jobs_on("dgx01") == ["7"]
    assert status.states["dgx02"] == NodeState("drain", "corectl-health: ecc: GPU 1")
    assert status.states["dgx01"] == NodeState("alloc", "")  # sinfo's "none"


def test_plan_lists_each_hosts_changing_tasks_once():
    from corectl.commands.provision import changes_from

    def ok(host: str, task: str, changed: bool, role: str = "base") -> dict:
        return {
            "event": "runner_on_ok",
            "event_data": {"host": host, "task": task, "role": role, "res": {"changed": changed}},
        }

    events = [
        ok("dgx01", "Write the sysctl file", True),
        ok("dgx01", "Install packages", False),
        {"event": "runner_item_on_ok", "event_data": {"host": "dgx01", "task": "Write the sysctl file", "role": "base",
                                                      "res": {"changed": True}}},
        ok("head01", "Write slurm.conf", True, role="slurm"),
        {"event": "runner_on_failed", "event_data": {"host": "dgx02", "task": "x", "res": {"changed": True}}},
    ]  # fmt: skip
    assert changes_from(events) == {"dgx01": ["base: Write the sysctl file"], "head01": ["slurm: Write slurm.conf"]}


def test_plan_names_the_changed_paths_of_a_files_task():
    """corectl.fleet.files writes a role's files in one task: the plan names each changed path."""
    from corectl.commands.provision import changes_from

    res = {
        "changed": True,
        "changed_paths": ["/etc/chrony/chrony.conf", "/etc/sysctl.d/90-corectl.conf"],
        "results": [{"path": "/etc/chrony/chrony.conf", "changed": True}],
    }
    events = [
        {"event": "runner_on_ok", "event_data": {"host": "dgx01", "task": "Write base's files", "role": "base",
                                                 "res": res}},
        {"event": "runner_on_ok", "event_data": {"host": "dgx02", "task": "Write base's files", "role": "base",
                                                 "res": {"changed": False, "changed_paths": []}}},
    ]  # fmt: skip
    assert changes_from(events) == {"dgx01": ["base: /etc/chrony/chrony.conf", "base: /etc/sysctl.d/90-corectl.conf"]}


def test_a_no_log_change_is_still_a_change():
    """Ansible censors a no_log result to a notice without "changed" (as in the munge key's task,
    recorded from a real run); its "changed: [host]" line is what says so."""
    from corectl.ansible.events import Tally
    from corectl.commands.provision import changes_from

    notice = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"
    censored = {"censored": notice}
    data = {"host": "dgx01", "task": "Install the cluster's munge key", "role": "munge", "res": censored}
    changed = {"event": "runner_on_ok", "stdout": "\x1b[0;33mchanged: [dgx01]\x1b[0m", "event_data": data}
    unchanged = {"event": "runner_on_ok", "stdout": "\x1b[0;32mok: [dgx02]\x1b[0m",
                 "event_data": {**data, "host": "dgx02"}}  # fmt: skip
    assert changes_from([changed, unchanged]) == {"dgx01": ["munge: Install the cluster's munge key"]}
    tally = Tally()
    tally(changed)
    tally(unchanged)
    assert (tally.hosts["dgx01"].changed, tally.hosts["dgx02"].changed) == (1, 0)


def test_bootstrap_known_hosts_handling(tmp_path: Path):
    import paramiko

    from corectl.bootstrap import fingerprint, known_key, record_key

    known = tmp_path / "known_hosts"
    known.write_text("[127.0.0.1]:22100 ssh-ed25519 AAAAold\nother ssh-rsa AAAAx\n")
    key = paramiko.Ed25519Key.from_private_key_file(str(_ed25519(tmp_path)))
    assert known_key(known, "[127.0.0.1]:22101") is None
    record_key(known, "[127.0.0.1]:22101", key)
    record_key(known, "[127.0.0.1]:22100", key)  # replaces the old entry
    assert known_key(known, "[127.0.0.1]:22100") == ("ssh-ed25519", key.get_base64())
    assert known.read_text().count("[127.0.0.1]:22100") == 1
    assert "other ssh-rsa AAAAx" in known.read_text()
    assert fingerprint(key).startswith("SHA256:") and not fingerprint(key).endswith("=")


def _ed25519(tmp_path: Path) -> Path:
    import subprocess

    path = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def checker_report(node: str, status: str, message: str) -> str:
    """What `corectl-health-check --only nccl --json` prints on a node."""
    check = {"name": "nccl", "status": status, "message": message, "seconds": 61.2}
    return json.dumps({"node": node, "ok": status != "fail", "checks": [check]})


def test_burn_in_reads_each_nodes_result_from_the_event_stream(prod_copy: Path, monkeypatch: pytest.MonkeyPatch):
    """The result travels as the set_fact task's result: from the control host or a runner alike."""
    from typer.testing import CliRunner

    from corectl.ansible.events import RunRequest, RunResult
    from corectl.cli import app
    from corectl.commands import burnin

    slow = "bus bandwidth 117.6 GB/s at 8 GiB < expected 450 GB/s"
    said = {
        "dgx01": {"node": "dgx01", "gpus": 8, "rc": 0, "stdout": checker_report("dgx01", "pass", "470.3 GB/s")},
        "dgx02": {"node": "dgx02", "gpus": 8, "rc": 1, "stdout": checker_report("dgx02", "fail", slow)},
    }
    seen: list[RunRequest] = []

    def run_site(request: RunRequest, sink: Any, **_: Any) -> RunResult:
        seen.append(request)
        if request.playbook != "burn-in.yml":
            return RunResult("successful", 0, {}, Path("/nonexistent/run"), 1.0)
        for host, raw in said.items():
            sink(returned(burnin.RETURNED, host, raw))
        sink({"event": "runner_on_ok", "event_data": {"host": "dgx03", "task": "Read the node's Slurm state"}})
        return RunResult("successful", 0, {}, Path("/nonexistent/run"), 1.0)

    monkeypatch.setattr(burnin.ansible, "run", run_site)
    result = CliRunner().invoke(app, ["health", "--burn-in", "--inventory", str(prod_copy)])
    assert result.exit_code == 1, result.output  # dgx02 is slow
    rows = [line.split("│")[1:3] for line in result.stdout.splitlines() if "│ dgx0" in line]
    assert [[cell.strip() for cell in row] for row in rows] == [["dgx01", "pass"], ["dgx02", "fail"]]
    assert seen[0].limit == "compute" and seen[0].playbook == "burn-in.yml"
    # the slow node is drained with its figure in the reason; the fast one is left as it was
    [drain] = seen[1:]
    assert (drain.playbook, drain.extravars["corectl_state_nodes"], drain.extravars["corectl_state"]) == (
        "node-state.yml",
        "dgx02",
        "drain",
    )
    assert drain.extravars["corectl_state_reason"] == f"corectl burn-in: {slow}"


def test_burn_in_verdicts():
    from corectl.commands.burnin import drain_reason, judge

    base = {"node": "dgx01", "gpus": 8, "rc": 0}
    ok = judge({**base, "stdout": checker_report("dgx01", "pass", "bus bandwidth 471.3 GB/s at 8 GiB")})
    assert (ok.status, ok.message) == ("pass", "bus bandwidth 471.3 GB/s at 8 GiB")
    again = judge({**base, "drained_for": "xid: Xid 79", "stdout": checker_report("dgx01", "pass", "fine")})
    assert (again.status, again.message) == ("pass", "fine; drained again: xid: Xid 79")
    slow = judge({**base, "rc": 1, "drained_for": "xid: Xid 79", "stdout": checker_report("dgx01", "fail", "slow")})
    assert (slow.status, drain_reason(slow)) == ("fail", "corectl burn-in: slow (drained before: xid: Xid 79)")
    missing = "nccl-tests' all_reduce_perf is not installed (/usr/local/bin/all_reduce_perf not found)"
    assert judge({**base, "stdout": checker_report("dgx01", "skip", missing)}).status == "skip"
    assert judge({**base, "gpus": 0}).status == "skip"
    refused = judge({**base, "rc": 1, "stdout": "", "stderr": "srun: error: Unable to allocate resources\n"})
    assert (refused.status, refused.message) == (
        "fail",
        "the nccl check did not run (rc 1): srun: error: Unable to allocate resources",
    )
