"""End to end through the CLI on a real stand-in lab: lab up, provision twice, limits, host keys.

Needs Docker and root (the lab starts the engine and builds the image when missing).
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corectl import secrets
from corectl.runner import control_path_dir
from corectl.site import resolve_site

pytestmark = pytest.mark.lab

CORECTL = str(Path(sys.executable).parent / "corectl")
SUBNET = "172.29.210.0/24"
PORT_BASE = 22300


def corectl(*args: str, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([CORECTL, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"corectl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def docker_exec(container: str, *argv: str) -> str:
    return subprocess.run(["docker", "exec", container, *argv], capture_output=True, text=True, check=True).stdout


def runs(site: Path) -> list[dict]:
    records = sorted((site / ".runs").glob("*/corectl.json"))
    return [json.loads(path.read_text()) for path in records]


def containers(site: Path) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=corectl.lab={site.name}", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sorted(out.split())


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    site = tmp_path_factory.mktemp("sites") / "labtest"
    args = ["--inventory", str(site)]
    options = ["--nodes", "1", "--subnet", SUBNET, "--ssh-port-base", str(PORT_BASE), "--prefix", "e2e-"]
    corectl("lab", "up", *args, *options)
    try:
        yield site
    finally:
        corectl("lab", "down", *args)
        assert containers(site) == []


def test_lab_up_wrote_the_inventory(lab: Path):
    assert (lab / "cluster.yml").is_file()
    assert (lab / "hosts.yml").is_file()
    assert containers(lab) == ["corectl-labtest-e2e-ceph", "corectl-labtest-e2e-dgx01", "corectl-labtest-e2e-head01"]
    known = (lab / "known_hosts").read_text().splitlines()
    assert [line.split()[0] for line in known] == [f"[127.0.0.1]:{PORT_BASE}", f"[127.0.0.1]:{PORT_BASE + 1}"]
    corectl("render", "--check", "--inventory", str(lab))


def test_provision_converges_then_changes_nothing(lab: Path):
    first = corectl("provision", "--inventory", str(lab))
    assert "failed=0 hosts=2" in first.stdout
    second = corectl("provision", "--inventory", str(lab))
    assert "changed=0 failed=0 hosts=2" in second.stdout
    record = runs(lab)[-1]
    assert record["status"] == "successful"
    assert set(record["hosts"]) == {"e2e-head01", "e2e-dgx01"}
    assert all(h["changed"] == 0 and h["failed"] == 0 and h["unreachable"] == 0 for h in record["hosts"].values())
    # what the run did is real on the node: the compute node syncs time from the head node
    sources = subprocess.run(
        ["docker", "exec", "corectl-labtest-e2e-dgx01", "chronyc", "-n", "-c", "sources"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "172.29.210.10" in sources


def test_slurm_runs_a_job_and_secrets_stay_out_of_the_artifacts(lab: Path):
    head = "corectl-labtest-e2e-head01"
    sinfo = docker_exec(head, "sinfo", "--noheader", "--Node", "--format", "%N %t %P")
    assert sinfo.split() == ["e2e-dgx01", "idle", "batch*"]
    assert docker_exec(head, "srun", "--nodes=1", "hostname").strip() == "e2e-dgx01"
    # the generated secrets reached the nodes ...
    site = resolve_site(str(lab))
    files = secrets.SecretFiles(site)
    key = secrets._vault(secrets.vault_password(files)).decrypt(files.munge_key.read_bytes())
    values = secrets.read_values(site)
    password = values["corectl_slurm_db_password"]
    node_key = subprocess.run(
        ["docker", "exec", "corectl-labtest-e2e-dgx01", "cat", "/etc/munge/munge.key"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    assert node_key == key
    # ... and appear nowhere in what the runs kept
    ceph_key = values["corectl_cephfs_client_keys"]["corectl"]
    needles = [password.encode(), key[:24], base64.b64encode(key)[:32], ceph_key.encode()]
    artifacts = [p for p in (lab / ".runs").rglob("*") if p.is_file()]
    assert len(artifacts) > 10
    for path in artifacts:
        data = path.read_bytes()
        assert not any(needle in data for needle in needles), path


def test_drain_and_resume(lab: Path):
    head, args = "corectl-labtest-e2e-head01", ["--inventory", str(lab)]

    def state() -> str:
        return docker_exec(head, "sinfo", "--noheader", "--Node", "--nodes", "e2e-dgx01", "--format", "%t|%E").strip()

    corectl("drain", "e2e-dgx01", "--reason", "e2e maintenance", *args)
    assert state() == "drain|e2e maintenance"
    again = corectl("drain", "e2e-dgx01", "--reason", "e2e maintenance", *args)
    assert runs(lab)[-1]["hosts"]["e2e-head01"]["changed"] == 0, again.stdout  # already drained: no-op
    corectl("resume", "e2e-dgx01", *args)
    assert state() == "idle|none"
    refused = corectl("drain", "e2e-head01", "--reason", "x", *args, check=False)
    assert refused.returncode == 2
    assert "not compute nodes of site labtest: e2e-head01" in refused.stderr
    listing = corectl("runs", *args)
    assert "drain e2e-dgx01" in listing.stdout and "resume e2e-dgx01" in listing.stdout


def test_cephfs_is_shared_between_nodes(lab: Path):
    head, dgx = "corectl-labtest-e2e-head01", "corectl-labtest-e2e-dgx01"
    assert docker_exec(dgx, "findmnt", "--noheadings", "--output", "FSTYPE", "/shared").strip() == "fuse.ceph-fuse"
    docker_exec(head, "sh", "-c", "echo from-head > /shared/e2e-file && chown alice:research /shared/e2e-file")
    assert docker_exec(dgx, "stat", "--format", "%U %u", "/shared/e2e-file").strip() == "alice 20001"
    assert docker_exec(dgx, "cat", "/shared/e2e-file").strip() == "from-head"


def test_limit_check_and_diff_pass_through(lab: Path):
    options = ["--limit", "e2e-dgx01", "--check", "--diff", "--tags", "base"]
    result = corectl("provision", "--inventory", str(lab), *options)
    assert "changed=0 failed=0 hosts=1" in result.stdout
    record = runs(lab)[-1]
    assert list(record["hosts"]) == ["e2e-dgx01"]
    assert record["check"] is True
    assert record["limit"] == "e2e-dgx01"


def test_host_key_checking_is_on(lab: Path):
    known = lab / "known_hosts"
    original = known.read_text()
    lines = original.splitlines()
    # give dgx01's endpoint the head node's host key: SSH must refuse to connect
    forged = [lines[0], lines[0].replace(f"[127.0.0.1]:{PORT_BASE}", f"[127.0.0.1]:{PORT_BASE + 1}")]
    known.write_text("\n".join(forged) + "\n")
    # a persisted SSH master would skip the handshake: drop this site's masters first
    for socket_path in control_path_dir(resolve_site(str(lab))).glob("*"):
        subprocess.run(["ssh", "-O", "exit", "-S", str(socket_path), "x"], capture_output=True, check=False)
    try:
        result = corectl("provision", "--inventory", str(lab), "--limit", "e2e-dgx01", check=False)
    finally:
        known.write_text(original)
    assert result.returncode == 1
    assert "provision failed: e2e-dgx01" in result.stderr
    assert runs(lab)[-1]["hosts"]["e2e-dgx01"]["unreachable"] == 1


def test_ctrl_c_cancels_cleanly(lab: Path):
    before = len(runs(lab))
    proc = subprocess.Popen(
        [CORECTL, "provision", "--inventory", str(lab)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(4)  # let the run get going (a provision here takes well over 10 s)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    records = runs(lab)
    assert len(records) == before + 1
    assert records[-1]["status"] == "canceled"
