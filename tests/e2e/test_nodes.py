"""Nodes joining, leaving and upgrading: the rolling driver upgrade, add-node, remove-node, and a Debian 13 DGX
refused beside a Debian 12 head.
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from corectl.lab.nodes import NODE_IMAGE_ENV
from e2e.lab import (
    CORECTL,
    DGX1,
    DGX2,
    FAULTS,
    HEAD,
    NET,
    POINT,
    PORT_BASE,
    SITE,
    UPGRADED_JOB,
    AddedNode,
    P,
    assert_provision_changes_nothing,
    corectl,
    daemon_started,
    docker_exec,
    exec_in,
    job_end,
    job_fields,
    lock_holder,
    offer,
    prometheus,
    runs,
    sbatch,
    site_files,
    slurm_reason,
    slurmd_started,
    table_rows,
    wait_for,
)

pytestmark = pytest.mark.lab


# A job that runs until Slurm drains its node, then prints the drain reason it saw and ends: it
# proves a command waited for it (it cannot end before the drain) without guessing durations.
GATED_JOB = (
    'until scontrol show node "$SLURMD_NODENAME" | grep -q "State=[A-Z+]*DRAIN"; do sleep 1; done; '
    'scontrol show node "$SLURMD_NODENAME" | sed -n "s/^ *Reason=//p"'
)


def submit_gated_job(node: str, *, user: str = "alice", then: str = "") -> str:
    """Submit GATED_JOB (followed by ``then``) as ``user`` to ``node``; return its id once it runs."""
    job = docker_exec(
        HEAD, "runuser", "-u", user, "--", "sbatch", "--parsable", f"--nodelist={node}", "--chdir=/tmp",
        "--output=/tmp/e2e-gated-%j.out", "--wrap", f"{GATED_JOB}; {then}" if then else GATED_JOB,
    ).strip()  # fmt: skip
    state = wait_for(lambda: docker_exec(HEAD, "squeue", "--noheader", "--job", job, "--format", "%T").strip(),
                     lambda s: s == "RUNNING", 60)  # fmt: skip
    assert state == "RUNNING", state
    return job


def driver_versions(container: str) -> list[str]:
    return docker_exec(container, "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").split()


def test_rolling_driver_upgrade_waits_for_running_jobs(lab: Path):
    args = ["--inventory", str(lab)]
    group_vars = lab / "group_vars" / "all.yml"
    group_vars.write_text(group_vars.read_text() + 'nvidia_driver_version: "580.105.08"\n')
    # provision never replaces a running driver
    refused = corectl("provision", *args, "--tags", "gpu", check=False)
    assert refused.returncode == 1

    # --limit, on a node an operator drained: upgraded, and it keeps the operator's drain
    corectl("drain", f"{P}dgx01", "--reason", "e2e DIMM swap", *args)
    limited = corectl("upgrade", "drivers", *args, "--limit", f"{P}dgx01")
    assert re.findall(r"batch \d+/\d+: \S+", limited.stdout) == [f"batch 1/1: {P}dgx01"]
    assert set(runs(lab)[-1]["hosts"]) == {f"{P}dgx01"}  # (its Slurm commands are delegated to head01)
    assert driver_versions(DGX1) == ["580.105.08"] * 8
    assert driver_versions(DGX2) == ["580.95.05"] * 8  # outside --limit: untouched
    assert slurm_reason(f"{P}dgx01").split("|") == ["drain", "e2e DIMM swap"]
    corectl("resume", f"{P}dgx01", *args)

    # a busy node that fails its checks after the upgrade: its batch waits for the job, then the
    # node fails its checks and the rollout stops with the node drained. The job (root's) breaks an
    # IB port once it sees the upgrade's drain, so the fault cannot drain the node any earlier.
    inject, clear = FAULTS["ib"]
    job = submit_gated_job(f"{P}dgx02", user="root", then=inject)
    upgrade = ["upgrade", "drivers", *args, "--batch", "1", "--timeout", "300"]
    proc = subprocess.Popen([CORECTL, *upgrade], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # while the upgrade runs, no add-node: refused at once, cluster.yml untouched
        holder = wait_for(lambda: lock_holder(lab), lambda h: h.get("command") == " ".join(upgrade), 60)
        assert holder["pid"] == proc.pid
        files = site_files(lab)
        node = [f"{P}dgx09", "--address", f"{NET}.19", "--profile", "dgx-standin", "--leaf", "leaf1"]
        refused = corectl("add-node", *node, *args, check=False)
        assert refused.returncode == 75
        assert refused.stderr.startswith(f"error: site {SITE} is busy: `corectl {' '.join(upgrade)}` by root@")
        assert site_files(lab) == files
        out, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
        docker_exec(DGX2, "sh", "-c", clear)
    failed = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    # dgx01 (idle, already upgraded) goes first and has nothing to do
    assert re.findall(r"batch \d+/\d+: \S+", failed.stdout) == [f"batch 1/2: {P}dgx01", f"batch 2/2: {P}dgx02"]
    assert f"error: upgrade drivers stopped at batch 2 ({P}dgx02)" in failed.stderr
    upgrades = [r for r in runs(lab) if r["command"].startswith("upgrade drivers")]
    assert [r["command"] for r in upgrades[-2:]] == [f"upgrade drivers {P}dgx01", f"upgrade drivers {P}dgx02"]
    assert upgrades[-2]["hosts"][f"{P}dgx01"]["changed"] == 0
    assert upgrades[-1]["hosts"][f"{P}dgx02"]["failed"] == 1
    state, exit_code, end = job_end(job)
    assert (state, exit_code) == ("COMPLETED", "0:0")
    started = datetime.fromisoformat(upgrades[-1]["started"]).timestamp()
    assert started <= end <= started + upgrades[-1]["elapsed_s"] + 5
    seen = docker_exec(DGX2, "cat", f"/tmp/e2e-gated-{job}.out")
    assert seen.startswith("corectl upgrade drivers 580.105.08 "), seen
    assert slurm_reason(f"{P}dgx02").split("|") == ["drain", "corectl upgrade drivers 580.105.08"]
    for node in (DGX1, DGX2):
        assert driver_versions(node) == ["580.105.08"] * 8
        assert "580.105.08" in docker_exec(node, "nv-fabricmanager", "--version")

    # the operator resumes the checked node (a node on the declared driver is left alone by a
    # rollout: dgx01's batch above changed nothing)
    corectl("resume", f"{P}dgx02", *args)
    for node in (f"{P}dgx01", f"{P}dgx02"):
        assert wait_for(lambda n=node: slurm_reason(n), lambda r: r == "idle|none", 60) == "idle|none"


def test_add_node_bootstraps_and_provisions_only_what_must_change(lab: Path, added_node: AddedNode):
    args = ["--inventory", str(lab)]
    existing = [f"corectl-{SITE}-{P}dgx01", f"corectl-{SITE}-{P}dgx02"]
    assert f"{P}dgx03" in added_node.lab_add and f"127.0.0.1:{PORT_BASE + 3}" in added_node.lab_add
    endpoint = f"[127.0.0.1]:{PORT_BASE + 3} "
    assert endpoint not in added_node.known_before
    assert "host key ssh-ed25519 SHA256:" in added_node.add_node
    assert endpoint in (lab / "known_hosts").read_text()
    # bootstrap again, now with corectl's key: everything is already there
    again = corectl("bootstrap", *args, f"{P}dgx03", "--key", str(lab / ".lab" / "id_ed25519"), "--yes").stdout
    [row] = table_rows(again)
    assert row[0] == f"{P}dgx03" and row[1].startswith("ssh-ed25519 SHA256:")
    assert row[2:] == ["known", "present", "present"]  # host key recorded, corectl key and python3 there
    records = [r for r in runs(lab) if r["command"].startswith(f"add-node {P}dgx03")]
    assert [r["command"] for r in records] == [
        f"add-node {P}dgx03 (slurm versions)",
        f"add-node {P}dgx03 (hosts)",
        f"add-node {P}dgx03 (config)",
        f"add-node {P}dgx03 (slurmd)",
        f"add-node {P}dgx03",
    ]
    versions_run, hosts_run, config_run, slurmd_run, node_run = records
    assert set(versions_run["hosts"]) == {f"{P}dgx03"} and versions_run["hosts"][f"{P}dgx03"]["changed"] == 0
    # the existing compute nodes: /etc/hosts, then slurmd restarted with the new node list
    # (Slurm 22.05 needs it for a node definition change); their running job went on
    assert hosts_run["tags"] == "node_list"
    # /etc/hosts, the firewall's rules file and their reload
    assert {n: hosts_run["hosts"][n]["changed"] for n in (f"{P}dgx01", f"{P}dgx02")} == {f"{P}dgx01": 3, f"{P}dgx02": 3}
    assert f"{NET}.13" in docker_exec(DGX1, "nft", "list", "set", "inet", "corectl", "allowed_v4")
    assert set(config_run["hosts"]) == {f"{P}head01"}
    assert {n: s["changed"] for n, s in slurmd_run["hosts"].items()} == {f"{P}dgx01": 2, f"{P}dgx02": 2}
    assert set(node_run["hosts"]) == {f"{P}dgx03"}
    now = [slurmd_started(c) for c in existing]
    assert all(now != then for now, then in zip(now, added_node.slurmd_before, strict=True))
    state = docker_exec(HEAD, "squeue", "--noheader", "--job", added_node.job, "--format", "%T").strip()
    assert state == "RUNNING"
    # declared, scheduled, monitored
    assert f"{P}dgx03" in (lab / "cluster.yml").read_text()
    assert wait_for(lambda: slurm_reason(f"{P}dgx03"), lambda r: r == "idle|none", 60) == "idle|none"
    assert docker_exec(HEAD, "srun", f"--nodelist={P}dgx03", "hostname").strip() == f"{P}dgx03"
    out = docker_exec(HEAD, "runuser", "-u", "alice", "--", "srun", "--nodes=3", "--mem=64", "hostname")
    assert sorted(out.split()) == [f"{P}dgx01", f"{P}dgx02", f"{P}dgx03"]

    def gpu_targets_up() -> set[str]:
        targets = prometheus(HEAD, "/api/v1/targets")["data"]["activeTargets"]
        return {t["labels"]["node"] for t in targets if t["labels"]["job"] == "dcgm" and t["health"] == "up"}

    all_three = {f"{P}dgx01", f"{P}dgx02", f"{P}dgx03"}
    assert wait_for(gpu_targets_up, lambda nodes: nodes == all_three, 90) == all_three
    # add-node left nothing for the next run
    assert_provision_changes_nothing(lab, {f"{P}head01", *all_three})


def spares_now() -> dict:
    """corectl-spares' own report on the controller: the pools (held spares, covers) and the history."""
    return json.loads(docker_exec(HEAD, "/usr/local/sbin/corectl-spares", "--status"))


def with_spare(text: str, spare: str | None) -> str:
    """cluster.yml's text with the batch partition's spares set to ``spare`` (None: none)."""
    data = yaml.safe_load(text)
    [batch] = [p for p in data["slurm"]["partitions"] if p["name"] == "batch"]
    batch.pop("spares", None)
    if spare:
        batch["spares"] = {"nodes": spare}
    return yaml.safe_dump(data, sort_keys=False)


def drained_at(node: str) -> int:
    """When the node's reason was set (epoch seconds: `scontrol show node`'s "[user@time]" in SLURM_TIME_FORMAT)."""
    shown = docker_exec(HEAD, "sh", "-c", f"SLURM_TIME_FORMAT=%s scontrol show node {node}")
    found = re.search(r"Reason=.*\[\S+@(\d+)\]", shown)
    assert found, shown
    return int(found.group(1))


# A batch job of two nodes: its first run sleeps until the health program requeues it; a run after a requeue
# (SLURM_RESTART_COUNT) runs a step on both nodes and ends
TWO_NODE_JOB = 'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then srun hostname; else sleep 600; fi'


def test_a_spare_takes_the_place_of_a_node_failed_for_hardware_and_the_repaired_node_becomes_the_spare(
    lab: Path, added_node: AddedNode
):
    """Issue 47: batch (dgx01-03 since add-node) declares dgx03 its spare. The spare is held out of the partition
    and validated there; a 2-node batch job runs on dgx01 and dgx02; an Xid 79 on dgx02: Slurm's health program
    drains it for good and requeues the job, the controller's timer lets the spare into the partition, and the job
    completes on dgx01 and dgx03. The repaired dgx02, resumed, is held as the spare. Status and history show it."""
    args = ["--inventory", str(lab)]
    failing, spare = f"{P}dgx02", f"{P}dgx03"
    cluster = lab / "cluster.yml"
    declared = cluster.read_text()
    cluster.write_text(with_spare(declared, spare))
    job = ""
    try:
        corectl("provision", *args, "--limit", f"{P}head01", "--tags", "slurm")
        held = wait_for(spares_now, lambda s: s["pools"] and s["pools"][0]["spares"] == [spare], 90)
        assert held["pools"][0]["spares"] == [spare], held
        # (slurmctld flags a reserved node within its next pass over the reservations)
        assert wait_for(lambda: slurm_reason(spare), lambda r: r == "resv|none", 90) == "resv|none"
        # validated in its reservation like any idle node
        validated = corectl("validate-nodes", spare, *args).stdout
        assert [row[:2] for row in table_rows(validated)] == [[spare, "pass"]], validated

        job = sbatch("--nodes=2", "--ntasks-per-node=1", "--mem=64", "--gres=gpu:1", "--time=10",
                     "--wrap", TWO_NODE_JOB)  # fmt: skip
        running = wait_for(lambda: job_fields(job), lambda f: f.get("JobState") == "RUNNING", 120)
        assert running.get("NodeList") == f"{P}dgx[01-02]", running  # never on the spare
        docker_exec(DGX2, "gpu-sim", "fault", "xid", "--gpu", "2", "--xid", "79")
        # Slurm's own run of the health program (every 30 s here) drains dgx02 for good
        reason = wait_for(lambda: slurm_reason(failing), lambda r: r.startswith(("drain|", "drng|")), 150)
        assert reason.startswith(("drain|corectl-health: xid: ", "drng|corectl-health: xid: ")), reason
        assert reason.endswith(" (kept)"), reason
        swapped = wait_for(spares_now, lambda s: s["pools"][0]["covers"] == {spare: failing}, 150)
        assert swapped["pools"][0]["spares"] == [], swapped
        [swap] = [e for e in swapped["events"] if e["event"] == "swap"]
        print(f"spare {spare} entered batch {swap['at'] - drained_at(failing)} s after {failing} was drained"
              " (health-check interval 30 s)")  # fmt: skip
        done = wait_for(lambda: job_fields(job), lambda f: f.get("JobState") in ("COMPLETED", "FAILED", None), 300)
        assert (done.get("JobState"), done.get("NodeList"), done.get("Restarts")) == (
            "COMPLETED", f"{P}dgx[01,03]", "1"
        ), done  # fmt: skip
        assert done.get("AdminComment", "").startswith(f"requeued by corectl: {failing} drained: corectl-health: xid:")

        # repaired: the fault gone, the operator resumes it; it is held as the spare
        docker_exec(DGX2, "gpu-sim", "clear", "xid")
        resumed = corectl("resume", failing, *args).stdout
        assert f"{failing}: cleared xid: " in resumed, resumed
        back = wait_for(spares_now, lambda s: s["pools"][0]["spares"] == [failing], 150)
        assert back["pools"][0]["covers"] == {}, back
        assert wait_for(lambda: slurm_reason(failing), lambda r: r == "resv|none", 90) == "resv|none"
        assert slurm_reason(spare) == "idle|none"
        status = " ".join(corectl("status", *args).stdout.split())
        assert f"spares of batch (1 of 1 held): {failing}" in status, status
        history = " ".join(corectl("history", failing, *args).stdout.split())
        assert f"spare in ok: {spare} entered batch for {failing} (corectl-health: xid: " in history, history
        assert f"held as spare ok: {failing} is back in service and held as a spare of batch; {spare} stays" in history
        # the report: the failure, the spare that covered it and when, the repair
        shown = json.loads(corectl("report", *args, "--days", "1", "--json").stdout)["spares"]
        [cover] = [c for c in shown["covers"] if c["spare"] == spare]
        assert cover["node"] == failing and cover["repair_s"] is not None, shown
        print(f"report: {failing} covered after {cover['cover_s']:.0f} s, back after {cover['repair_s']:.0f} s")
    finally:
        if job:
            docker_exec(HEAD, "scancel", job, check=False)
        docker_exec(DGX2, "sh", "-c", FAULTS["xid"][1])
        cluster.write_text(declared)
        corectl("provision", *args, "--limit", f"{P}head01", "--tags", "slurm")
        assert wait_for(spares_now, lambda s: s["pools"] == [], 90)["pools"] == []
        free = docker_exec(HEAD, "scontrol", "show", "reservation", check=False)
        assert wait_for(lambda: docker_exec(HEAD, "scontrol", "show", "reservation", check=False),
                        lambda r: "corectl_spares_" not in r, 90), free  # fmt: skip
        for node in (failing, spare):
            assert wait_for(lambda n=node: slurm_reason(n), lambda r: r == "idle|none", 120) == "idle|none"


def test_remove_node_waits_for_jobs_and_leaves_slurm_prometheus_and_cluster_yml_consistent(
    lab: Path, added_node: AddedNode
):
    job = submit_gated_job(f"{P}dgx03")  # runs until remove-node drains the node
    corectl("remove-node", f"{P}dgx03", "--inventory", str(lab))
    drain_run = next(r for r in reversed(runs(lab)) if r["command"] == f"remove-node {P}dgx03 (drain)")
    state, exit_code, end = job_end(job)
    assert (state, exit_code) == ("COMPLETED", "0:0")
    started = datetime.fromisoformat(drain_run["started"]).timestamp()
    assert started <= end <= started + drain_run["elapsed_s"] + 5  # the drain step waited for the job
    seen = docker_exec(f"corectl-{SITE}-{P}dgx03", "cat", f"/tmp/e2e-gated-{job}.out")
    assert seen.startswith("corectl remove-node "), seen
    nodes = docker_exec(HEAD, "sinfo", "--noheader", "--Node", "--format", "%N").split()
    assert sorted(set(nodes)) == [f"{P}dgx01", f"{P}dgx02"]
    assert f"{P}dgx03" not in (lab / "cluster.yml").read_text()
    corectl("render", "--check", "--inventory", str(lab))

    def monitored() -> set[str]:
        return {t["labels"].get("node") for t in prometheus(HEAD, "/api/v1/targets")["data"]["activeTargets"]}

    assert f"{P}dgx03" not in wait_for(monitored, lambda nodes: f"{P}dgx03" not in nodes, 60)
    assert f"{P}dgx03" not in docker_exec(HEAD, "cat", "/etc/hosts")
    # the remaining compute nodes' slurmd was restarted with the new node list ...
    slurmd_run = next(r for r in reversed(runs(lab)) if r["command"] == f"remove-node {P}dgx03 (slurmd)")
    assert {n: s["changed"] for n, s in slurmd_run["hosts"].items()} == {f"{P}dgx01": 2, f"{P}dgx02": 2}
    # ... and the job that ran on dgx01 through add-node and remove-node completed
    through = wait_for(lambda: job_end(added_node.job), lambda end: end[0] != "RUNNING", 60)
    assert through[:2] == ("COMPLETED", "0:0"), through
    # remove-node left nothing for the next run
    assert_provision_changes_nothing(lab, {f"{P}head01", f"{P}dgx01", f"{P}dgx02"})


def test_a_debian_13_dgx_beside_the_debian_12_head_is_refused_by_add_node_naming_both_slurms(lab: Path):
    """Two OS generations, two Slurm releases (issue 28): a DGX stand-in of Debian 13 would install slurmd
    24.11 beside the head's slurmctld 22.05. add-node refuses it before any other node changes, with one line
    naming both, and takes the node out of cluster.yml again."""
    args = ["--inventory", str(lab)]
    declared = (lab / "cluster.yml").read_text()
    with pytest.MonkeyPatch.context() as env:  # a machine without Slurm: the check reads what apt would install
        env.setenv(NODE_IMAGE_ENV, "bare")
        started = corectl("lab", "add", *args, "--release", "trixie").stdout
    name, address = started.split()[:2]
    port = re.search(r"ssh 127\.0\.0\.1:(\d+)", started).group(1)
    container = f"corectl-{SITE}-{name}"
    assert "13" in docker_exec(container, "sh", "-c", ". /etc/os-release; echo $VERSION_ID")
    head_slurm = docker_exec(HEAD, "dpkg-query", "-W", "-f=${Version}", "slurmctld").split("-")[0]
    offered = re.search(r"Candidate: (\S+)", docker_exec(container, "apt-cache", "policy", "slurmd")).group(1)
    options = ["--address", address, "--profile", "dgx-standin", "--leaf", "leaf1"]
    options += ["--ssh-host", "127.0.0.1", "--ssh-port", port, "--yes"]
    refused = corectl("add-node", name, *args, *options, check=False)
    assert refused.returncode == 1, refused.stdout
    line = (
        f"{name} would install slurmd {offered.split('-')[0]}, but {P}head01 runs slurmctld {head_slurm}: one Slurm "
        "release per cluster (SchedMD: upgrade slurmdbd, then slurmctld, then slurmd, at most 2 releases apart)"
    )
    assert refused.stderr.startswith("error: ") and line in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert head_slurm.startswith("22.05.") and offered.startswith("24.11.")
    # nothing changed: one run, on the new node only, that changed nothing; cluster.yml as it was
    # (found by command: the site keeps only its latest runs, so the count of records stays the same)
    records = [r for r in runs(lab) if r["command"].startswith(f"add-node {name}")]
    assert [r["command"] for r in records] == [f"add-node {name} (slurm versions)"]
    [record] = records
    assert record["status"] == "failed"
    assert set(record["hosts"]) == {name} and record["hosts"][name]["changed"] == 0
    assert (lab / "cluster.yml").read_text() == declared
    assert name not in docker_exec(HEAD, "cat", "/etc/hosts") and name not in docker_exec(DGX1, "cat", "/etc/hosts")
    assert docker_exec(container, "dpkg-query", "-W", "-f=${db:Status-Status}", "slurmd", check=False) != "installed"


def installed(container: str, *packages: str) -> list[str]:
    out = docker_exec(container, "dpkg-query", "-W", "-f", "${Package}=${Version}\n", *packages, check=False)
    return sorted(out.split())


def started_at(container: str) -> float:
    """When the container last started: a reboot inside it ends its systemd and Docker starts it again."""
    stamp = subprocess.run(["docker", "inspect", "-f", "{{.State.StartedAt}}", container], capture_output=True,
                           text=True, check=True).stdout.strip()  # fmt: skip
    return datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp()


def test_upgrade_os_reboots_idle_nodes_first_waits_for_jobs_and_never_boots_a_kernel_without_nvidia(lab: Path):
    args = ["--inventory", str(lab)]
    site_tools, kernel = "corectl-standin-site-tools", "linux-image-corectl-standin"
    for node in (DGX1, DGX2):  # a site's own package and the kernel meta package, at their old versions
        docker_exec(node, "apt-get", "install", "-y", "-q", f"{site_tools}=1.0", f"{kernel}=1.0")
        offer(node, "apt-updates")  # site-tools 1.1 asks for a reboot; kernel 2.0 pulls a kernel DKMS builds for

    for bad in (["--batch", "0"], ["--limit", f"{P}dgx09"]):
        refused = corectl("upgrade", "os", *args, *bad, check=False)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert installed(DGX1, site_tools) == [f"{site_tools}=1.0"]  # refused: nothing changed

    job = submit_gated_job(f"{P}dgx01", user="root")  # ends once it sees its node drained
    before = {node: started_at(node) for node in (DGX1, DGX2)}
    done = corectl("upgrade", "os", *args, "--batch", "1", "--timeout", "600")
    assert re.findall(r"batch \d+/\d+: \S+", done.stdout) == [f"batch 1/2: {P}dgx02", f"batch 2/2: {P}dgx01"]
    state, exit_code, end = job_end(job)
    assert (state, exit_code) == ("COMPLETED", "0:0")
    # (it could only end once it saw its node drained; its output in /tmp went with the reboot)
    after = {node: started_at(node) for node in (DGX1, DGX2)}
    # dgx02 rebooted while dgx01's job ran; dgx01 only after its job had ended
    assert before[DGX2] < after[DGX2] < end <= after[DGX1], (before, after, end)
    for node, name in ((DGX1, f"{P}dgx01"), (DGX2, f"{P}dgx02")):
        assert installed(node, site_tools, kernel) == [f"{site_tools}=1.1", f"{kernel}=2.0"]
        assert exec_in(node, "test", "-e", "/run/reboot-required").returncode == 1
        assert slurm_reason(name) == "idle|none"
    upgrades = [r for r in runs(lab) if r["command"].startswith("upgrade os")][-2:]
    for record, name in zip(upgrades, (f"{P}dgx02", f"{P}dgx01"), strict=True):
        packages = {p["name"]: (p["before"], p["after"]) for p in record["recorded"][name]["packages"]}
        assert packages[site_tools] == ("1.0", "1.1") and packages[kernel] == ("1.0", "2.0"), packages
    shown = corectl("runs", *args, "--show", "last").stdout
    assert f"{P}dgx01: {site_tools} 1.0 -> 1.1" in shown, shown

    # run again: nothing to install, nothing to reboot
    corectl("upgrade", "os", *args)
    again = [r for r in runs(lab) if r["command"].startswith("upgrade os")][-2:]
    assert [sum(h["changed"] for h in r["hosts"].values()) for r in again] == [0, 0]
    assert {node: started_at(node) for node in (DGX1, DGX2)} == after

    # a kernel the NVIDIA driver's source does not build against: dgx02 is not rebooted, and the run names it
    offer(DGX2, "apt-kernel")
    try:
        refused = corectl("upgrade", "os", *args, "--limit", f"{P}dgx02", check=False)
        assert refused.returncode == 1
        assert (
            f"{P}dgx02 is not rebooted: its next kernel 99.0.3-corectl-standin has no nvidia module" in refused.stdout
        ), refused.stdout
        assert started_at(DGX2) == after[DGX2]
        assert slurm_reason(f"{P}dgx02") == "idle|none"  # it keeps running jobs on its kernel
    finally:  # the operator takes the kernel back out
        docker_exec(DGX2, "rm", "-f", "/etc/apt/sources.list.d/corectl-e2e-apt-kernel.sources", "/run/reboot-required",
                    "/run/reboot-required.pkgs")  # fmt: skip
        docker_exec(DGX2, "apt-get", "update", "-q")
        docker_exec(DGX2, "apt-get", "install", "-y", "-q", "--allow-downgrades", f"{kernel}=2.0")
        docker_exec(DGX2, "apt-get", "purge", "-y", "-q", "linux-image-99.0.3-corectl-standin")


def slurm_reports() -> dict[str, str]:
    """Each daemon's version in its own words: slurmdbd's start-up line, slurmctld's configuration, and the version
    each slurmd registered with."""
    dbd = re.findall(r"slurmdbd version (\S+) started", docker_exec(HEAD, "cat", "/var/log/slurm/slurmdbd.log"))
    ctld = re.search(r"SLURM_VERSION\s*=\s*(\S+)", docker_exec(HEAD, "scontrol", "show", "config"))
    nodes = docker_exec(HEAD, "scontrol", "show", "node", "--oneliner")
    found = {"slurmdbd": dbd[-1], "slurmctld": ctld.group(1) if ctld else ""}
    for name, version in re.findall(r"NodeName=(\S+) .*?\bVersion=(\S+)", nodes):
        found[name] = version
    return found


def backups_kept(args: list[str]) -> list[dict]:
    """The listing, whether or not every backup verifies (an earlier test leaves one it corrupted on purpose:
    test_head.py; the listing then exits 1 and still lists them all)."""
    listed = corectl("backup", *args, "--list", "--json", check=False)
    assert listed.returncode in (0, 1), listed
    return json.loads(listed.stdout)


def backup_names(args: list[str]) -> set[str]:
    return {b["name"] for b in backups_kept(args)}


def accounted() -> set[str]:
    return set(docker_exec(HEAD, "sacct", "-a", "-X", "-n", "-P", "-S", "2020-01-01", "-o", "JobID").split())


def test_upgrade_slurm_goes_slurmdbd_then_slurmctld_then_each_slurmd_under_a_running_job(lab: Path):
    """Issue 48: the stand-in point release offered to every Slurm host; refused while a node is offered another
    release; then a backup, slurmdbd, slurmctld and each slurmd in that order, read from the daemons' own reports,
    a job running across it all completes, and sacct keeps every record. Run again: nothing to do."""
    args = ["--inventory", str(lab)]
    daemons = ((HEAD, "slurmdbd"), (HEAD, "slurmctld"), (DGX1, "slurmd"), (DGX2, "slurmd"))
    old = slurm_reports()
    assert set(old.values()) == {"22.05.8"}, old
    records = accounted()
    started = {d: daemon_started(*d) for d in daemons}
    kept = backup_names(args)

    for bad in (["--batch", "0"],):
        refused = corectl("upgrade", "slurm", *args, *bad, check=False)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    # dgx02's repositories do not offer it yet: refused before anything changes, naming it
    for node in (HEAD, DGX1):
        offer(node, "apt-slurm")
    refused = corectl("upgrade", "slurm", *args, check=False)
    assert refused.returncode == 1, refused
    assert re.search(rf"{P}dgx02's repositories offer slurmd 22\.05\.8\S*, {P}head01's slurmctld {POINT}-",
                     refused.stderr), refused.stderr  # fmt: skip
    assert slurm_reports() == old and {d: daemon_started(*d) for d in daemons} == started
    assert backup_names(args) == kept

    offer(DGX2, "apt-slurm")
    job = sbatch(f"--nodelist={P}dgx01", "--time=20", "--wrap", UPGRADED_JOB.format(version=POINT))
    assert wait_for(lambda: job_fields(job).get("JobState"), lambda s: s == "RUNNING", 120) == "RUNNING"
    done = corectl("upgrade", "slurm", *args, "--batch", "1")
    assert re.search(rf"upgrade slurm: 22\.05\.8\S+ -> {POINT}-\S+: slurmdbd on {P}head01, slurmctld on {P}head01, "
                     rf"slurmd on {P}dgx\[01-02\]", done.stdout), done.stdout  # fmt: skip
    # the daemons say the new version themselves
    new = slurm_reports()
    assert set(new.values()) == {POINT}, new
    # SchedMD's order, read from when each daemon's process started
    after = {d: daemon_started(*d) for d in daemons}
    dbd, ctld, slurmd1, slurmd2 = (after[d] for d in daemons)
    assert all(after[d] > started[d] for d in daemons), (started, after)
    assert dbd < ctld < slurmd1 < slurmd2, after  # --batch 1: one slurmd after the other
    # the job ran across every restart and ended as it should; accounting kept every record
    state, exit_code, _end = wait_for(lambda: job_end(job), lambda j: j[0] not in ("RUNNING", "PENDING"), 300)
    assert (state, exit_code) == ("COMPLETED", "0:0")
    assert records | {job} <= accounted()
    # a backup first
    backups = backups_kept(args)
    [taken] = [b for b in backups if b["name"] not in kept]
    upgrade = next(r for r in reversed(runs(lab)) if r["command"].startswith(f"upgrade slurm {POINT}"))
    assert taken["verified"] == "ok", taken
    assert datetime.fromisoformat(taken["created"]) <= datetime.fromisoformat(upgrade["started"]), (taken, upgrade)
    # what changed, per host, in the run record and runs --show
    packages = {host: {p["name"]: p["after"] for p in rec["packages"]} for host, rec in upgrade["recorded"].items()
                if "packages" in rec}  # fmt: skip
    assert packages[f"{P}head01"]["slurmdbd"].startswith(POINT) and packages[f"{P}dgx02"]["slurmd"].startswith(POINT)
    shown = corectl("runs", *args, "--show", "last").stdout
    assert re.search(rf"{P}dgx01: slurmd 22\.05\.8\S* -> {POINT}-", shown), shown

    # again: nothing to upgrade, no backup, no restart
    again = corectl("upgrade", "slurm", *args)
    assert f"every Slurm host has {POINT}-" in again.stdout and "nothing to upgrade" in again.stdout, again.stdout
    assert {d: daemon_started(*d) for d in daemons} == after
    assert backup_names(args) == {b["name"] for b in backups}
