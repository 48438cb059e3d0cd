"""Node-local runs (cluster.yml node_local, issue 30): which runs and nodes go node-local, and the section's
validation. The runs themselves go through real SSH to DGX stand-ins in tests/e2e/test_fleet.py; what a node
receives is decoded from the real stream in tests/integration/test_jobpack.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path, PurePosixPath

import pytest
from typer.testing import CliRunner

from corectl.ansible.events import RunRequest
from corectl.ansible.lifecycle import Cancel, Live
from corectl.ansible.remote import nodelocal, runnerhost
from corectl.cli import app
from corectl.site import Site
from corectl.site.inventory import render_site


def _site(prod_copy: Path, root: Path, section: str) -> Site:
    cluster_yml = prod_copy / "cluster.yml"
    cluster_yml.write_text(cluster_yml.read_text() + section)
    site = Site(root=root, directory=prod_copy)
    render_site(site, check_only=False)
    return site


def test_auto_by_default_and_on_for_every_compute_node_of_a_site_run(prod_copy: Path, root: Path):
    site = Site(root=root, directory=prod_copy)
    cluster, _ = render_site(site, check_only=False)
    assert (cluster.config.node_local.mode, cluster.config.node_local.auto_from) == ("auto", 64)
    assert nodelocal.chosen(RunRequest(site=site), cluster) == []  # prod's 12 DGX: under auto_from
    site = _site(prod_copy, root, "node_local:\n  mode: on\n")  # YAML's bare on is a boolean: read as meant
    cluster, _ = render_site(site, check_only=False)
    assert cluster.config.node_local.mode == "on"
    chosen = nodelocal.chosen(RunRequest(site=site), cluster)
    assert chosen == [f"dgx{i:02d}" for i in range(1, 13)]  # not head01: the service nodes run from here
    # only site.yml, never with --local (fan_out False), and never without the controller in the run
    assert nodelocal.chosen(RunRequest(site=site, playbook="health.yml"), cluster) == []
    assert nodelocal.chosen(RunRequest(site=site, fan_out=False), cluster) == []
    assert nodelocal.chosen(RunRequest(site=site, limit="dgx0*"), cluster) == []
    assert nodelocal.chosen(RunRequest(site=site, limit="head01,dgx05"), cluster) == ["dgx05"]


def test_auto_turns_on_from_a_node_count(prod_copy: Path, root: Path):
    site = _site(prod_copy, root, "node_local:\n  mode: auto\n  auto_from: 3\n")
    cluster, _ = render_site(site, check_only=False)
    assert nodelocal.chosen(RunRequest(site=site, limit="head01,dgx01,dgx02"), cluster) == []
    three = RunRequest(site=site, limit="head01,dgx01,dgx02,dgx03")
    assert nodelocal.chosen(three, cluster) == ["dgx01", "dgx02", "dgx03"]


def test_node_local_runs_log_in_as_root_with_the_site_key(prod_copy: Path):
    cluster_yml = prod_copy / "cluster.yml"
    text = cluster_yml.read_text().replace("    key: ~/.ssh/corectl_ed25519\n", "")
    cluster_yml.write_text(text.replace("    user: root\n", "    user: admin\n", 1) + "node_local:\n  mode: 'on'\n")
    result = CliRunner().invoke(app, ["validate", "--inventory", str(prod_copy)])
    assert result.exit_code == 2
    assert "node_local.mode: node-local runs need cluster.ssh.key" in result.output
    assert "cluster.ssh.user: node-local runs log in as root (cluster.ssh.user is 'admin')" in result.output


def test_auto_leaves_a_site_it_can_not_reach_or_with_runners_on_this_host(prod_copy: Path, root: Path):
    """auto (the default) never refuses a site: one without root and the site's key, or with runners, runs from the
    control host, and a run auto would have made node-local says why in one line."""
    cluster_yml = prod_copy / "cluster.yml"
    admin = cluster_yml.read_text().replace("    user: root\n", "    user: admin\n", 1)
    cluster_yml.write_text(admin + "node_local:\n  mode: auto\n  auto_from: 3\n")
    assert CliRunner().invoke(app, ["validate", "--inventory", str(prod_copy)]).exit_code == 0
    site = Site(root=root, directory=prod_copy)
    cluster, _ = render_site(site, check_only=False)
    request = RunRequest(site=site)
    assert nodelocal.chosen(request, cluster) == []
    why = "cluster.ssh.user: node-local runs log in as root (cluster.ssh.user is 'admin')"
    assert nodelocal.auto_declined(request, cluster) == why
    assert nodelocal.auto_declined(RunRequest(site=site, limit="head01,dgx01"), cluster) == ""  # under auto_from
    cluster_yml.write_text(admin.replace("    user: admin\n", "    user: root\n", 1) + "node_local:\n  mode: auto\n")
    site = _site(prod_copy, root, "  auto_from: 3\ncontrol:\n  runners:\n    - {name: r1, host: 10.0.0.9}\n")
    cluster, _ = render_site(site, check_only=False)
    assert cluster.config.control is not None
    assert nodelocal.chosen(RunRequest(site=site), cluster) == []  # the site's runners run it
    assert nodelocal.auto_declined(RunRequest(site=site), cluster) == ""


def test_the_job_command_refuses_another_python_then_a_stale_install(tmp_path: Path):
    """What a node-local job's remote command does before any job starts, run here by sh: a python3 of another
    minor version exits 98 (the node then runs from the control host), an install without the control host's
    stamp exits 97 (corectl installs, then sends the job again)."""
    job = PurePosixPath("/dev/shm/corectl-job-x")
    command = runnerhost.worker_command(str(tmp_path / "install"), job, "abc", "node")
    other = tmp_path / "other-python"
    other.mkdir()
    (other / "python3").write_text("#!/bin/sh\nexit 1\n")  # any python3 that is not the control host's minor
    (other / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{other}:{os.environ['PATH']}"}
    unfit = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True, check=False)
    assert unfit.returncode == runnerhost.UNFIT_EXIT, unfit
    assert "python3 on this node is not" in unfit.stderr
    stale = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    assert stale.returncode == runnerhost.STALE_EXIT, stale
    assert "node is not at the control host's versions" in stale.stderr


def test_a_nodes_own_run_is_under_mitogen_when_this_hosts_is(
    prod_copy: Path, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """CORECTL_ACCELERATOR=mitogen reaches each node's job as it reaches the runners' (its payload carries Mitogen):
    a node-local no-op of head + 2 DGX cost the machine 0.58 of its CPU that way (docs/scale.md)."""
    site = _site(prod_copy, root, "node_local:\n  mode: on\n")
    cluster, _ = render_site(site, check_only=False)
    for accelerator, strategy in (("mitogen", "corectl.fleet.mitogen_linear"), ("none", None)):
        monkeypatch.setenv("CORECTL_ACCELERATOR", accelerator)
        live = Live(RunRequest(site=site), "x1", tmp_path, Cancel())
        run = nodelocal._Run(live, cluster.config.node_local, tmp_path / "key", cluster.config.cluster.ssh, "0123abcd")
        common = nodelocal._common(run, None, "", tmp_path / accelerator)
        assert common.kwargs["envvars"].get("ANSIBLE_STRATEGY") == strategy
        assert common.kwargs["extravars"]["ansible_connection"] == "local"


def test_the_node_jobs_are_followed_by_a_process_per_core_at_most_one_per_node_or_job_at_once(
    prod_copy: Path, root: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    site = _site(prod_copy, root, "node_local:\n  mode: auto\n")
    settings = render_site(site, check_only=False)[0].config.node_local
    assert settings.processes is None and settings.parallel == 32
    assert [nodelocal.processes(settings, n) for n in (1, 2, 12, 1000)] == [1, 2, 12, 16]
    assert nodelocal.processes(settings.model_copy(update={"parallel": 4}), 1000) == 4
    assert nodelocal.processes(settings.model_copy(update={"processes": 3}), 1000) == 3
    (prod_copy / "cluster.yml").write_text((prod_copy / "cluster.yml").read_text() + "  processes: 0\n")
    result = CliRunner().invoke(app, ["validate", "--inventory", str(prod_copy)])
    assert result.exit_code == 2 and "node_local.processes" in result.output, result.output


def test_a_node_jobs_ssh_has_the_sites_key_exchange_and_the_nodes_own_jump_host(
    prod_copy: Path, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """cluster.ssh.kex_algorithms and a node's own ssh.jump_host reach the ssh of its job's install and of its stop
    (a stand-in ssh first on PATH writes down its arguments), as they reach Ansible's through hosts.yml."""
    text = (prod_copy / "cluster.yml").read_text()
    text = text.replace("    user: root\n", "    user: root\n    kex_algorithms: [curve25519-sha256]\n", 1)
    text = text.replace("    leaf: leaf2\n", "    leaf: leaf2\n    ssh: {jump_host: admin@bastion2}\n", 1)
    (prod_copy / "cluster.yml").write_text(text)
    site = _site(prod_copy, root, "node_local:\n  mode: on\n")
    cluster, _ = render_site(site, check_only=False)
    said = tmp_path / "said"
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {said}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(nodelocal, "_payload", lambda _run: b"")
    live = Live(RunRequest(site=site), "x1", tmp_path, Cancel())
    run = nodelocal._Run(live, cluster.config.node_local, tmp_path / "key", cluster.config.cluster.ssh, "0123abcd")
    assert nodelocal._install(run, cluster.node("dgx01")) == ""
    assert nodelocal._install(run, cluster.node("dgx07")) == ""
    worker = subprocess.Popen(["sleep", "30"])
    job = PurePosixPath("/dev/shm/corectl-job-x1")
    runnerhost.stop_jobs(site, run.key, [(worker, job, nodelocal._endpoint(cluster.node("dgx07")), ["-o", "A=b"])])
    assert worker.wait(timeout=10) != 0  # killed
    install1, install7, stop7 = said.read_text().splitlines()
    assert " -o KexAlgorithms=curve25519-sha256 10.10.1.11 " in install1 and "ProxyJump" not in install1
    assert " -o KexAlgorithms=curve25519-sha256 -o ProxyJump=admin@bastion2 10.10.1.17 " in install7
    assert " -o A=b 10.10.1.17 pkill " in stop7
    hosts = json.loads((prod_copy / "hosts.yml").read_text())["all"]
    kex = "-o KexAlgorithms=curve25519-sha256"
    assert hosts["vars"]["ansible_ssh_common_args"] == kex
    assert hosts["hosts"]["dgx07"]["ansible_ssh_common_args"] == f"{kex} -o ProxyJump=admin@bastion2"
    assert "ansible_ssh_common_args" not in hosts["hosts"]["dgx01"]


def test_provision_says_in_one_line_why_auto_runs_from_here(
    prod_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The line comes before the run, which goes from here (a stand-in for corectl.ansible.run sees no node-local)."""
    from corectl import ansible, secrets
    from corectl.ansible.events import RunResult

    cluster_yml = prod_copy / "cluster.yml"
    cluster_yml.write_text(
        cluster_yml.read_text().replace("    user: root\n", "    user: admin\n", 1) + "node_local:\n  auto_from: 3\n"
    )
    monkeypatch.setattr(secrets, "check", lambda _site: None)  # prod's Ceph and BMC secrets are not the point here
    ran: list[RunRequest] = []

    def run(request: RunRequest, _sink: object, *, cluster: object) -> RunResult:
        ran.append(request)
        return RunResult("successful", 0, {}, tmp_path, 0.0)

    monkeypatch.setattr(ansible, "run", run)
    result = CliRunner().invoke(app, ["provision", "--inventory", str(prod_copy)])
    assert result.exit_code == 0, result.output
    line = "node_local auto: this run goes from the control host (cluster.ssh.user: node-local runs log in as root"
    assert result.output.startswith(line), result.output
    assert len(ran) == 1 and ran[0].fan_out
