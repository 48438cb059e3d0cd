"""The smaller end-to-end test on the second OS generation (issue 28): a lab of Debian 13 (trixie:
Slurm 24.11, PMIx 5, systemd 257, Python 3.13) stand-ins, provisioned from scratch through the CLI,
converged (the second provision, on corectl's default strategy, changes nothing on any host), a job on
both nodes, a container job through pyxis and enroot, and pam_slurm_adopt. The whole suite runs on
Debian 12 (tests/e2e/test_*.py); this lab has its own site name, subnet, ports and node names, so both
can run at once (tests/stages.py runs it in lane 1 after the Debian 12 lab)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.lab import (
    CONTAINER_IMAGE,
    containers,
    corectl,
    docker_exec,
    make_container_image,
    runs,
    ssh_as_alice,
    wait_for,
)

pytestmark = pytest.mark.lab_release

RELEASE = "trixie"
SUBNET = "172.29.211.0/24"
PORT_BASE = 22400
NODES = ("t13-head01", "t13-dgx01", "t13-dgx02")
HEAD, DGX1, DGX2 = (f"corectl-labnext-{n}" for n in NODES)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, subprocess.CompletedProcess[str]]]:
    """Debian 13 stand-ins (corectl lab up --release trixie) and their first provision; removed at the end."""
    site = tmp_path_factory.mktemp("sites") / "labnext"
    args = ["--inventory", str(site)]
    options = ["--nodes", "2", "--subnet", SUBNET, "--ssh-port-base", str(PORT_BASE), "--prefix", "t13-"]
    corectl("lab", "down", *args)  # an earlier run's leftovers (a stopped CI) are not adopted
    corectl("lab", "up", *args, *options, "--release", RELEASE)
    try:
        yield site, corectl("provision", *args)
    finally:
        corectl("lab", "down", *args)
        assert containers(site) == []


# Its time holds the lab's set-up and first provision from the bare image (the module's fixture) and the second
# provision on Ansible's stock strategy: beside both other labs on two cores that passed the suite's 1,200 s guard
# against a hung test (runs Q and R, docs/testing.md; about 15 minutes beside one lab). A guard, not a speed limit.
@pytest.mark.timeout(2400)
def test_debian_13_stand_ins_provision_from_scratch_and_converge(lab: tuple[Path, subprocess.CompletedProcess[str]]):
    site, first = lab
    assert "failed=0 hosts=3" in first.stdout, first.stdout
    for container in (HEAD, DGX1, DGX2):
        assert docker_exec(container, "sh", "-c", ". /etc/os-release; echo $VERSION_CODENAME").strip() == RELEASE
    assert docker_exec(HEAD, "slurmctld", "-V").startswith("slurm-wlm 24.11.")
    assert docker_exec(DGX1, "slurmd", "-V").startswith("slurm-wlm 24.11.")
    # the second provision on corectl's default strategy (ansible.cfg's corectl.fleet.linear, CORECTL_ACCELERATOR
    # unset), whatever the first ran on (the suite runs its labs under Mitogen): one whole-site run in every `make test`
    # takes the path users get by default, every role on every host, and finds nothing to change
    with pytest.MonkeyPatch.context() as env:
        env.delenv("CORECTL_ACCELERATOR", raising=False)
        corectl("provision", "--inventory", str(site))
    record = runs(site)[-1]
    assert record["status"] == "successful"
    assert {host: counts["changed"] for host, counts in record["hosts"].items()} == dict.fromkeys(NODES, 0)
    run_dir = sorted((site / ".runs").glob("*/corectl.json"))[-1].parent
    assert "ANSIBLE_STRATEGY" not in json.loads((run_dir / "command").read_text())["env"]  # ansible.cfg's strategy


def test_a_job_runs_on_both_nodes(lab: tuple[Path, subprocess.CompletedProcess[str]]):
    out = docker_exec(HEAD, "runuser", "-u", "alice", "--", "srun", "--nodes=2", "--mem=64", "--gpus-per-node=1",
                      "sh", "-c", 'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"')  # fmt: skip
    assert sorted(out.split("\n")[:-1]) == ["t13-dgx01 0", "t13-dgx02 0"], out


def test_a_container_job_runs_through_pyxis_and_enroot(lab: tuple[Path, subprocess.CompletedProcess[str]]):
    """pyxis built by the role against Slurm 24.11's headers, enroot from the stand-in repository: the task
    runs in the image (its os-release), as alice, on both nodes."""
    make_container_image(DGX1, DGX2)
    task = 'echo "$SLURMD_NODENAME $(id -un) $(. /etc/os-release && echo $VARIANT_ID)"'
    out = docker_exec(
        HEAD, "runuser", "-u", "alice", "--", "srun", "--nodes=2", "--ntasks-per-node=1", "--mem=256",
        f"--container-image={CONTAINER_IMAGE}", "sh", "-c", task,
    )  # fmt: skip
    assert sorted(out.split("\n")[:-1]) == ["t13-dgx01 alice corectl-e2e", "t13-dgx02 alice corectl-e2e"], out


def test_pam_slurm_adopt_lets_alice_only_onto_a_node_with_her_job(lab: tuple[Path, subprocess.CompletedProcess[str]]):
    site, _ = lab
    denied = ssh_as_alice(site, PORT_BASE + 1, "id -un")
    assert denied.returncode == 255 and "Access denied by pam_slurm_adopt" in denied.stderr, denied.stderr
    job = docker_exec(
        HEAD, "runuser", "-u", "alice", "--", "sbatch", "--parsable", "--nodelist=t13-dgx01", "--chdir=/tmp",
        "--output=/dev/null", "--mem=64", "--wrap", "sleep 600",
    ).strip()  # fmt: skip
    try:
        state = wait_for(lambda: docker_exec(HEAD, "squeue", "--noheader", "--job", job, "--format", "%T").strip(),
                         lambda s: s == "RUNNING", 60)  # fmt: skip
        assert state == "RUNNING"
        adopted = ssh_as_alice(site, PORT_BASE + 1, "cat /proc/self/cgroup")
        assert adopted.returncode == 0 and f"/job_{job}/step_extern" in adopted.stdout, adopted.stdout + adopted.stderr
    finally:
        docker_exec(HEAD, "scancel", job)
    assert wait_for(lambda: ssh_as_alice(site, PORT_BASE + 1, "true").returncode, lambda rc: rc == 255, 60) == 255
