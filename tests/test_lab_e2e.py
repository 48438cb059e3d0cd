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
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import pytest

from corectl import secrets
from corectl.runner import control_path_dir
from corectl.site import resolve_site

pytestmark = pytest.mark.lab
T = TypeVar("T")

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
    options = ["--nodes", "2", "--subnet", SUBNET, "--ssh-port-base", str(PORT_BASE), "--prefix", "e2e-"]
    corectl("lab", "up", *args, *options)
    try:
        yield site
    finally:
        corectl("lab", "down", *args)
        assert containers(site) == []


def test_lab_up_wrote_the_inventory(lab: Path):
    assert (lab / "cluster.yml").is_file()
    assert (lab / "hosts.yml").is_file()
    assert containers(lab) == [
        "corectl-labtest-e2e-ceph",
        "corectl-labtest-e2e-dgx01",
        "corectl-labtest-e2e-dgx02",
        "corectl-labtest-e2e-head01",
        "corectl-labtest-e2e-repo",
    ]
    known = (lab / "known_hosts").read_text().splitlines()
    assert [line.split()[0] for line in known] == [f"[127.0.0.1]:{PORT_BASE + i}" for i in range(3)]
    corectl("render", "--check", "--inventory", str(lab))


def test_provision_converges_then_changes_nothing(lab: Path):
    first = corectl("provision", "--inventory", str(lab))
    assert "failed=0 hosts=3" in first.stdout
    second = corectl("provision", "--inventory", str(lab))
    assert "changed=0 failed=0 hosts=3" in second.stdout
    record = runs(lab)[-1]
    assert record["status"] == "successful"
    assert set(record["hosts"]) == {"e2e-head01", "e2e-dgx01", "e2e-dgx02"}
    plan = corectl("plan", "--inventory", str(lab), "--tags", "base,monitoring")
    assert runs(lab)[-1]["check"] is True and runs(lab)[-1]["command"] == "plan"
    assert "nothing would change" in plan.stdout, plan.stdout
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
    assert sinfo.split() == ["e2e-dgx01", "idle", "batch*", "e2e-dgx02", "idle", "batch*"]
    # a declared user runs a 2-node job
    out = docker_exec(head, "runuser", "-u", "alice", "--", "srun", "--nodes=2", "hostname")
    assert sorted(out.split()) == ["e2e-dgx01", "e2e-dgx02"]
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


def prometheus(head: str, path: str) -> dict:
    code = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9090{path}').read().decode())"
    return json.loads(docker_exec(head, "python3", "-c", code))


def test_gpu_stack_monitoring_and_containers(lab: Path):
    head, dgx = "corectl-labtest-e2e-head01", "corectl-labtest-e2e-dgx01"
    # the driver, Fabric Manager and DCGM from the stand-in repository, at the declared versions
    versions = docker_exec(
        dgx, "dpkg-query", "-W", "-f=${Package}=${Version}\\n", "cuda-drivers-580", "nvidia-fabricmanager"
    )
    assert versions.split() == ["cuda-drivers-580=580.95.05-1", "nvidia-fabricmanager=580.95.05-1"]
    assert (
        docker_exec(dgx, "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").split()
        == ["580.95.05"] * 8
    )
    # Prometheus on the head node scrapes every node and the GPU node's dcgm-exporter
    deadline = time.monotonic() + 120
    while True:
        targets = prometheus(head, "/api/v1/targets")["data"]["activeTargets"]
        health = sorted((t["labels"].get("node", "self"), t["labels"]["job"], t["health"]) for t in targets)
        if all(h[2] == "up" for h in health) or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert health == [
        ("e2e-dgx01", "dcgm", "up"),
        ("e2e-dgx01", "node", "up"),
        ("e2e-dgx02", "dcgm", "up"),
        ("e2e-dgx02", "node", "up"),
        ("e2e-head01", "node", "up"),
        ("self", "prometheus", "up"),
    ]
    series = prometheus(head, "/api/v1/query?query=DCGM_FI_DEV_GPU_TEMP")["data"]["result"]
    per_node = sorted((s["metric"]["node"], int(s["metric"]["gpu"])) for s in series)
    assert per_node == [(node, gpu) for node in ("e2e-dgx01", "e2e-dgx02") for gpu in range(8)]
    # pyxis: a user's job step with --container-image
    out = docker_exec(head, "runuser", "-u", "alice", "--", "srun", "--container-image=ubuntu:24.04",
                      "sh", "-c", "echo image=$PYXIS_STANDIN_IMAGE")  # fmt: skip
    assert out.strip() == "image=ubuntu:24.04"


def test_drain_and_resume(lab: Path):
    head, args = "corectl-labtest-e2e-head01", ["--inventory", str(lab)]

    def state() -> str:
        return docker_exec(head, "sinfo", "--noheader", "--Node", "--nodes", "e2e-dgx01", "--format", "%t|%E").strip()

    corectl("drain", "e2e-dgx01", "--reason", "e2e maintenance", *args)
    assert state() == "drain|e2e maintenance"
    again = corectl("drain", "e2e-dgx01", "--reason", "e2e maintenance", *args)
    assert runs(lab)[-1]["hosts"]["e2e-head01"]["changed"] == 0, again.stdout  # already drained: no-op
    corectl("resume", "e2e-dgx01", *args)
    assert wait_for(state, lambda s: s == "idle|none", 60) == "idle|none"
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


DGX1, HEAD = "corectl-labtest-e2e-dgx01", "corectl-labtest-e2e-head01"


def slurm_reason(node: str) -> str:
    return docker_exec(HEAD, "sinfo", "--noheader", "--Node", "--nodes", node, "--format", "%t|%E").strip()


def wait_for(what: Callable[[], T], predicate: Callable[[T], bool], timeout: float = 90.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if predicate(value) or time.monotonic() > deadline:
            return value
        time.sleep(2)


def health_report(lab: Path, *options: str) -> tuple[int, dict]:
    result = corectl("health", "--inventory", str(lab), "--json", *options, check=False)
    return result.returncode, json.loads(result.stdout)


def test_health_passes_on_every_compute_node(lab: Path):
    rc, report = wait_for(lambda: health_report(lab), lambda r: r[0] == 0)
    assert rc == 0, report
    assert sorted(report["nodes"]) == ["e2e-dgx01", "e2e-dgx02"]
    for node in report["nodes"].values():
        passed = {c["name"] for c in node["checks"] if c["status"] == "pass"}
        assert {"gpu-count", "driver-version", "fm-version", "fabric", "ecc", "xid", "nvlink", "ib", "mounts"} <= passed
    table = corectl("status", "--inventory", str(lab)).stdout
    assert "e2e-dgx01" in table and "ok " in table


def test_burn_in_says_why_it_is_skipped(lab: Path):
    result = corectl("health", "--burn-in", "--inventory", str(lab))
    assert result.stdout.count("all_reduce_perf is not installed") == 2, result.stdout


# (fault injected on dgx01, how to clear it, the check that must name it)
FAULTS = [
    ("gpu-sim fault lost-gpu --gpu 3", "gpu-sim clear", "gpu-count"),
    ("gpu-sim fault ecc --gpu 1", "gpu-sim clear", "ecc"),
    ("gpu-sim fault xid --gpu 2", "gpu-sim clear", "xid"),
    ("gpu-sim fault nvlink-down --gpu 0", "gpu-sim clear", "nvlink"),
    ("systemctl stop nvidia-fabricmanager", "systemctl start nvidia-fabricmanager", "fabricmanager"),
    (
        "cp /usr/lib/gpu-sim/fm-version /root/fm-version && echo 580.82.07 > /usr/lib/gpu-sim/fm-version",
        "cp /root/fm-version /usr/lib/gpu-sim/fm-version",
        "fm-version",
    ),
    ("gpu-sim fault hot --gpu 4", "gpu-sim clear", "temperature"),
    ("gpu-sim fault ib-down", "gpu-sim clear", "ib"),
    ("umount /shared", "mount /shared", "mounts"),
]


@pytest.mark.parametrize(("inject", "clear", "check"), FAULTS, ids=[f[2] for f in FAULTS])
def test_injected_fault_fails_health_and_drains_the_node(lab: Path, inject: str, clear: str, check: str):
    docker_exec(DGX1, "sh", "-c", inject)
    try:
        rc, report = health_report(lab)
        assert rc == 1
        assert report["nodes"]["e2e-dgx02"]["ok"] is True  # the healthy node stays healthy
        failed = [c["name"] for c in report["nodes"]["e2e-dgx01"]["checks"] if c["status"] == "fail"]
        assert failed[:1] == [check], report["nodes"]["e2e-dgx01"]
        # Slurm's health check drains it with that reason within one interval (30 s in the lab)
        state = wait_for(lambda: slurm_reason("e2e-dgx01"), lambda r: f"corectl-health: {check}:" in r, 90)
        assert state.startswith(("drain", "drng")) and f"corectl-health: {check}:" in state, state
        assert slurm_reason("e2e-dgx02").startswith("idle")
    finally:
        docker_exec(DGX1, "sh", "-c", clear)
    # cleared: the next health check resumes the node it drained
    assert wait_for(lambda: slurm_reason("e2e-dgx01"), lambda r: r == "idle|none", 90) == "idle|none"


def test_rolling_driver_upgrade_waits_for_running_jobs(lab: Path):
    args = ["--inventory", str(lab)]
    job = docker_exec(
        HEAD, "runuser", "-u", "alice", "--", "sbatch", "--parsable", "--nodelist=e2e-dgx02", "--chdir=/tmp",
        "--wrap", "sleep 75",
    ).strip()  # fmt: skip
    wait_for(lambda: docker_exec(HEAD, "squeue", "--noheader", "--job", job, "--format", "%T").strip(),
             lambda s: s == "RUNNING", 60)  # fmt: skip
    group_vars = lab / "group_vars" / "all.yml"
    group_vars.write_text(group_vars.read_text() + 'nvidia_driver_version: "580.105.08"\n')
    # provision never replaces a running driver
    refused = corectl("provision", *args, "--tags", "gpu", check=False)
    assert refused.returncode == 1
    upgrade = corectl("upgrade", "drivers", *args, "--batch", "1", "--timeout", "300")
    assert "batch 1/2: e2e-dgx01" in upgrade.stdout and "batch 2/2: e2e-dgx02" in upgrade.stdout
    upgrades = [r for r in runs(lab) if r["command"].startswith("upgrade drivers")]
    assert [r["command"] for r in upgrades[-2:]] == ["upgrade drivers e2e-dgx01", "upgrade drivers e2e-dgx02"]
    # the busy node's batch waited for the job: the job ended while that batch ran, and completed
    sacct = docker_exec(HEAD, "sh", "-c", f"SLURM_TIME_FORMAT=%s sacct -X -n -P -j {job} -o State,ExitCode,End")
    state, exit_code, end = sacct.strip().split("|")
    assert (state, exit_code) == ("COMPLETED", "0:0")
    started = datetime.fromisoformat(upgrades[-1]["started"]).timestamp()
    assert started < int(end) < started + upgrades[-1]["elapsed_s"] + 5
    for node in ("corectl-labtest-e2e-dgx01", "corectl-labtest-e2e-dgx02"):
        smi = docker_exec(node, "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
        assert smi.split() == ["580.105.08"] * 8
        assert "580.105.08" in docker_exec(node, "nv-fabricmanager", "--version")
    for node in ("e2e-dgx01", "e2e-dgx02"):
        assert wait_for(lambda n=node: slurm_reason(n), lambda r: r == "idle|none", 60) == "idle|none"
    # nothing left to do: a second rollout touches no node
    again = corectl("upgrade", "drivers", *args)
    assert all(r["hosts"].get(n, {}).get("changed", 0) == 0 for r in runs(lab)[-2:] for n in ("e2e-dgx01", "e2e-dgx02"))
    assert "batch" in again.stdout


def slurmd_started(container: str) -> str:
    return docker_exec(container, "systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "--value", "slurmd")


def test_add_node_bootstraps_and_provisions_only_what_must_change(lab: Path, monkeypatch: pytest.MonkeyPatch):
    args = ["--inventory", str(lab)]
    existing = ["corectl-labtest-e2e-dgx01", "corectl-labtest-e2e-dgx02"]
    before = [slurmd_started(c) for c in existing]
    # a fresh machine: no corectl key, host key unknown, an admin user with a password and sudo
    started = corectl("lab", "add", *args, "--bare").stdout
    assert "e2e-dgx03" in started and f"127.0.0.1:{PORT_BASE + 3}" in started
    endpoint = f"[127.0.0.1]:{PORT_BASE + 3} "
    assert endpoint not in (lab / "known_hosts").read_text()
    monkeypatch.setenv("E2E_ADMIN_PASSWORD", (lab / ".lab" / "e2e-dgx03.password").read_text().strip())
    options = ["--address", "172.29.210.13", "--profile", "dgx-standin", "--leaf", "leaf1"]
    options += ["--ssh-host", "127.0.0.1", "--ssh-port", str(PORT_BASE + 3)]
    options += ["--bootstrap-user", "dgxadmin", "--password-env", "E2E_ADMIN_PASSWORD", "--yes"]
    added = corectl("add-node", "e2e-dgx03", *args, *options)
    assert "host key ssh-ed25519 SHA256:" in added.stdout
    assert endpoint in (lab / "known_hosts").read_text()
    # bootstrap again, now with corectl's key: everything is already there
    again = corectl("bootstrap", *args, "e2e-dgx03", "--key", str(lab / ".lab" / "id_ed25519"), "--yes").stdout
    assert "known" in again and "installed" not in again
    records = [r for r in runs(lab) if r["command"].startswith("add-node e2e-dgx03")]
    assert [r["command"] for r in records] == [
        "add-node e2e-dgx03 (hosts)",
        "add-node e2e-dgx03 (config)",
        "add-node e2e-dgx03",
    ]
    hosts_run, config_run, node_run = records
    # the existing compute nodes: /etc/hosts only, and their slurmd was not restarted
    assert hosts_run["tags"] == "etc_hosts"
    assert {n: hosts_run["hosts"][n]["changed"] for n in ("e2e-dgx01", "e2e-dgx02")} == {"e2e-dgx01": 1, "e2e-dgx02": 1}
    assert set(config_run["hosts"]) == {"e2e-head01"}
    assert set(node_run["hosts"]) == {"e2e-dgx03"}
    assert [slurmd_started(c) for c in existing] == before
    # declared, scheduled, monitored
    assert "e2e-dgx03" in (lab / "cluster.yml").read_text()
    assert wait_for(lambda: slurm_reason("e2e-dgx03"), lambda r: r == "idle|none", 60) == "idle|none"
    assert docker_exec(HEAD, "srun", "--nodelist=e2e-dgx03", "hostname").strip() == "e2e-dgx03"
    out = docker_exec(HEAD, "runuser", "-u", "alice", "--", "srun", "--nodes=3", "hostname")
    assert sorted(out.split()) == ["e2e-dgx01", "e2e-dgx02", "e2e-dgx03"]

    def gpu_targets_up() -> set[str]:
        targets = prometheus(HEAD, "/api/v1/targets")["data"]["activeTargets"]
        return {t["labels"]["node"] for t in targets if t["labels"]["job"] == "dcgm" and t["health"] == "up"}

    all_three = {"e2e-dgx01", "e2e-dgx02", "e2e-dgx03"}
    assert wait_for(gpu_targets_up, lambda nodes: nodes == all_three, 90) == all_three


def test_remove_node_leaves_slurm_prometheus_and_cluster_yml_consistent(lab: Path):
    corectl("remove-node", "e2e-dgx03", "--inventory", str(lab))
    nodes = docker_exec(HEAD, "sinfo", "--noheader", "--Node", "--format", "%N").split()
    assert sorted(set(nodes)) == ["e2e-dgx01", "e2e-dgx02"]
    assert "e2e-dgx03" not in (lab / "cluster.yml").read_text()
    corectl("render", "--check", "--inventory", str(lab))

    def monitored() -> set[str]:
        return {t["labels"].get("node") for t in prometheus(HEAD, "/api/v1/targets")["data"]["activeTargets"]}

    assert "e2e-dgx03" not in wait_for(monitored, lambda nodes: "e2e-dgx03" not in nodes, 60)
    assert "e2e-dgx03" not in docker_exec(HEAD, "cat", "/etc/hosts")


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
    before = {path.parent for path in (lab / ".runs").glob("*/corectl.json")}
    proc = subprocess.Popen(
        [CORECTL, "provision", "--inventory", str(lab)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(4)  # let the run get going (a provision here takes well over 10 s)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    # exactly one new run record (older ones may have been pruned: 30 are kept)
    new = [path.parent for path in (lab / ".runs").glob("*/corectl.json") if path.parent not in before]
    assert len(new) == 1
    assert json.loads((new[0] / "corectl.json").read_text())["status"] == "canceled"
