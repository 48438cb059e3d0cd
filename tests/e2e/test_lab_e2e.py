"""End to end through the CLI on a real stand-in lab: lab up, provision twice, limits, host keys.

Needs Docker and root (the lab starts the engine and builds the image when missing).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from conftest import ROOT
from corectl import secrets
from corectl.ansible.runner import control_path_dir
from corectl.health.report import last_verdicts
from corectl.lab.docker import accounting_flags
from corectl.lab.nodes import NODE_IMAGE_ENV
from corectl.site import resolve_site

pytestmark = pytest.mark.lab
T = TypeVar("T")

CORECTL = str(Path(sys.executable).parent / "corectl")
# The lab this module runs on: `labtest`, or with CORECTL_E2E_LAB=labfleet a second one (`tests/stages.py lab-fleet`
# runs the tests marked `second_lab`, independent of the others' state, there). Two labs on one machine need their
# own site, subnet, ports and node names (Slurm names its host cgroups after nodes).
LABS = {
    "labtest": ("172.29.210", 22300, "e2e-"),
    "labfleet": ("172.29.212", 22500, "e2f-"),
}
SITE = os.environ.get("CORECTL_E2E_LAB", "labtest")
if SITE not in LABS:
    raise SystemExit(f"CORECTL_E2E_LAB={SITE}: no such e2e lab; one of {', '.join(LABS)}")
NET, PORT_BASE, P = LABS[SITE]
SUBNET = f"{NET}.0/24"
HEAD, DGX1, DGX2, DGX3 = (f"corectl-{SITE}-{P}{n}" for n in ("head01", "dgx01", "dgx02", "dgx03"))


CONSOLE: list[str] = []  # everything corectl printed in this module (scanned for secrets after each test)


def corectl(*args: str, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([CORECTL, *args], capture_output=True, text=True, timeout=timeout, check=False)
    CONSOLE.append(proc.stdout + proc.stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"corectl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def on_terminal(argv: list[str], columns: int) -> tuple[int, str]:
    """Run ``argv`` on a pseudo-terminal ``columns`` wide, as an operator's shell would; its exit
    code and what it printed, with Unix line ends. TERM=dumb and NO_COLOR: no colours and no
    live display, which erases itself at the end anyway; what stays on the screen is the same."""
    import fcntl
    import pty
    import struct
    import termios

    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb"}
    proc = subprocess.Popen(argv, stdin=terminal, stdout=terminal, stderr=terminal, env=env, close_fds=True)
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the program ended and closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    rc = proc.wait(timeout=600)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    CONSOLE.append(text)
    return rc, text.replace("\r\n", "\n").replace("\r", "")


EXEC_LIMIT_S = 300  # one docker exec: an exec into a container that is stopping or rebooting can wait for good


def exec_in(container: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """docker exec, never waiting past EXEC_LIMIT_S: an exec that does is answered as a failure (exit 124)."""
    command = ["docker", "exec", container, *argv]
    try:
        return subprocess.run(command, capture_output=True, text=True, check=False, timeout=EXEC_LIMIT_S)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 124, "", f"docker exec: no answer in {EXEC_LIMIT_S} s")


def docker_exec(container: str, *argv: str, check: bool = True) -> str:
    done = exec_in(container, *argv)
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the rich tables in ``text``, each as its stripped cells."""
    rows = []
    for line in text.splitlines():
        if line.count("\u2502") >= 2:  # a row: │ cell │ cell │
            rows.append([cell.strip() for cell in line.split("\u2502")[1:-1]])
    return rows


def runs(site: Path) -> list[dict]:
    records = sorted((site / ".runs").glob("*/corectl.json"))
    return [json.loads(path.read_text()) for path in records]


def container_started(name: str) -> str:
    return subprocess.run(
        ["docker", "inspect", "--format", "{{.State.StartedAt}}", name], capture_output=True, text=True, check=True
    ).stdout.strip()


def containers(site: Path) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=corectl.lab={site.name}", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sorted(out.split())


@pytest.fixture(scope="module")
def lab_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The lab's nodes started (corectl lab up), not provisioned yet; removed at the end."""
    site = tmp_path_factory.mktemp("sites") / SITE
    args = ["--inventory", str(site)]
    options = ["--nodes", "2", "--subnet", SUBNET, "--ssh-port-base", str(PORT_BASE), "--prefix", P]
    # an earlier run killed before its teardown (a stopped CI) leaves containers named like these:
    # this run's lab must not adopt them
    corectl("lab", "down", *args)
    corectl("lab", "up", *args, *options)
    try:
        yield site
    finally:
        corectl("lab", "down", *args)
        assert containers(site) == []


@pytest.fixture(scope="module")
def first_provision(lab_up: Path) -> Iterator[subprocess.CompletedProcess[str]]:
    """The lab's first provision (from bare stand-ins to a working cluster). It proved every role's install
    from the bare image; the nodes the tests add from then on start from the baked image (the same Debian
    packages already in it: tests/standin/node-packages.yml, issue 45)."""
    result = corectl("provision", "--inventory", str(lab_up))
    before = os.environ.get(NODE_IMAGE_ENV)
    os.environ[NODE_IMAGE_ENV] = "baked"
    try:
        yield result
    finally:
        if before is None:
            os.environ.pop(NODE_IMAGE_ENV, None)
        else:
            os.environ[NODE_IMAGE_ENV] = before


@pytest.fixture(scope="module")
def lab(lab_up: Path, first_provision: subprocess.CompletedProcess[str]) -> Path:
    """The provisioned lab: a test that takes it (alone, with -k, or in any order) finds Slurm,
    the GPU stack, users and monitoring in place."""
    return lab_up


def test_lab_up_wrote_the_inventory(lab_up: Path):
    lab = lab_up
    assert (lab / "cluster.yml").is_file()
    assert (lab / "hosts.yml").is_file()
    assert containers(lab) == [
        f"corectl-{SITE}-{P}ceph",
        f"corectl-{SITE}-{P}dgx01",
        f"corectl-{SITE}-{P}dgx02",
        f"corectl-{SITE}-{P}head01",
        f"corectl-{SITE}-{P}repo",
    ]
    known = (lab / "known_hosts").read_text().splitlines()
    assert [line.split()[0] for line in known] == [f"[127.0.0.1]:{PORT_BASE + i}" for i in range(3)]
    corectl("render", "--check", "--inventory", str(lab))
    # another directory's lab of the same name would adopt these containers: refused, none touched
    started = {name: container_started(name) for name in containers(lab)}
    other = lab.parent / "elsewhere" / lab.name
    refused = corectl("lab", "up", "--inventory", str(other), "--subnet", SUBNET, "--prefix", P, check=False)
    assert refused.returncode == 1, refused
    assert refused.stderr.startswith(f"error: containers of an earlier lab named {SITE} exist (corectl-{SITE}-{P}")
    assert f"remove them with: corectl lab down --inventory {other}" in refused.stderr
    assert {name: container_started(name) for name in containers(lab)} == started
    assert not (other / ".lab").exists()


def test_provision_converges(lab: Path, first_provision: subprocess.CompletedProcess[str]):
    # (that a second provision then changes nothing is asserted after add-node and after
    # remove-node below: assert_provision_changes_nothing, on every host)
    first = first_provision
    assert "failed=0 hosts=3" in first.stdout
    record = runs(lab)[-1]
    assert record["status"] == "successful"
    assert set(record["hosts"]) == {f"{P}head01", f"{P}dgx01", f"{P}dgx02"}
    assert all(h["failed"] == 0 and h["unreachable"] == 0 for h in record["hosts"].values())
    # what the run did is real on the node: the compute node syncs time from the head node
    sources = subprocess.run(
        ["docker", "exec", f"corectl-{SITE}-{P}dgx01", "chronyc", "-n", "-c", "sources"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert f"{NET}.10" in sources
    # the fabric (switches.json) reached Slurm: the controller knows which leaf each node is on
    topology = {
        line.split()[0]: set(line.split()[1:])
        for line in docker_exec(f"corectl-{SITE}-{P}head01", "scontrol", "show", "topology").splitlines()
        if line.startswith("SwitchName=")
    }
    assert set(topology) == {"SwitchName=leaf1", "SwitchName=spine1"}, topology
    assert f"Nodes={P}dgx[01-02]" in topology["SwitchName=leaf1"]
    assert "Switches=leaf1" in topology["SwitchName=spine1"]


def test_slurm_runs_a_job_and_secrets_stay_out_of_the_artifacts(lab: Path):
    head = f"corectl-{SITE}-{P}head01"
    sinfo = docker_exec(head, "sinfo", "--noheader", "--Node", "--format", "%N %t %P")
    assert sinfo.split() == [f"{P}dgx01", "idle", "batch*", f"{P}dgx02", "idle", "batch*"]
    # a declared user runs a 2-node job
    out = docker_exec(head, "runuser", "-u", "alice", "--", "srun", "--nodes=2", "hostname")
    assert sorted(out.split()) == [f"{P}dgx01", f"{P}dgx02"]
    # the generated secrets reached the nodes ...
    site = resolve_site(str(lab))
    files = secrets.SecretFiles(site)
    key = secrets._vault(secrets.vault_password(files)).decrypt(files.munge_key.read_bytes())
    values = secrets.read_values(site)
    password = values["corectl_slurm_db_password"]
    node_key = subprocess.run(
        ["docker", "exec", f"corectl-{SITE}-{P}dgx01", "cat", "/etc/munge/munge.key"],
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


def ssh_as_alice(lab: Path, port: int, command: str) -> subprocess.CompletedProcess[str]:
    """alice's own SSH login (her key is declared in the lab's cluster.yml) from this machine."""
    argv = [
        "ssh", "-i", str(lab / ".lab" / "alice_ed25519"), "-p", str(port),
        "-o", f"UserKnownHostsFile={lab / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "alice@127.0.0.1", command,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_pam_slurm_adopt_lets_users_only_onto_nodes_with_their_jobs(lab: Path):
    # the login node lets her in; a compute node where she has no job refuses her
    assert ssh_as_alice(lab, PORT_BASE, "id -un").stdout == "alice\n"
    denied = ssh_as_alice(lab, PORT_BASE + 1, "id -un")
    assert denied.returncode == 255 and denied.stdout == ""
    assert "Access denied by pam_slurm_adopt: you have no active jobs on this node" in denied.stderr
    # with a job there, her session is adopted into the job's cgroup
    job = docker_exec(
        HEAD, "runuser", "-u", "alice", "--", "sbatch", "--parsable", f"--nodelist={P}dgx01", "--chdir=/tmp",
        "--output=/dev/null", "--wrap", "sleep 600",
    ).strip()  # fmt: skip
    try:
        running = wait_for(lambda: docker_exec(HEAD, "squeue", "--noheader", "--job", job, "--format", "%T").strip(),
                           lambda s: s == "RUNNING", 60)  # fmt: skip
        assert running == "RUNNING"
        adopted = ssh_as_alice(lab, PORT_BASE + 1, "cat /proc/self/cgroup")
        assert adopted.returncode == 0, adopted.stderr
        assert f"/job_{job}/step_extern" in adopted.stdout, adopted.stdout
    finally:
        docker_exec(HEAD, "scancel", job)
    # the job is gone: so is her way in
    assert wait_for(lambda: ssh_as_alice(lab, PORT_BASE + 1, "true").returncode, lambda rc: rc == 255, 60) == 255


# A second munged on dgx01 with a key of its own: what a node with a wrong munge key would send.
WRONG_MUNGE = (
    "set -e; d=/run/e2e-wrong-munge; install -d -o munge -g munge -m 0700 $d; "
    "dd if=/dev/urandom of=$d/key bs=1024 count=1 2>/dev/null; chown munge:munge $d/key; chmod 0400 $d/key; "
    "runuser -u munge -- munged --force --key-file=$d/key --socket=$d/socket --pid-file=$d/pid "
    "--log-file=$d/log --seed-file=$d/seed; munge --socket=$d/socket --no-input; kill $(cat $d/pid)"
)


def test_munge_refuses_a_credential_made_with_another_key(lab: Path):
    def unmunge_on_head(credential: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", "exec", "-i", HEAD, "unmunge"], input=credential,
                              capture_output=True, text=True, check=False)  # fmt: skip

    good = unmunge_on_head(docker_exec(DGX1, "munge", "--no-input"))  # the site's key on both nodes
    assert good.returncode == 0 and "STATUS:          Success (0)" in good.stdout, good.stdout + good.stderr
    bad = unmunge_on_head(docker_exec(DGX1, "sh", "-c", WRONG_MUNGE))
    assert bad.returncode != 0
    assert "Invalid credential" in bad.stderr, bad.stdout + bad.stderr


def test_plan_names_a_real_pending_change(lab: Path):
    # the whole site on a converged lab: every read the roles decide by runs in check mode too
    converged = corectl("plan", "--inventory", str(lab))
    assert "nothing would change" in converged.stdout, converged.stdout
    limits = "/etc/security/limits.d/90-corectl.conf"
    docker_exec(DGX1, "mv", limits, "/root/90-corectl.conf")
    try:
        plan = corectl("plan", "--inventory", str(lab), "--limit", f"{P}dgx01", "--tags", "base")
        missing = subprocess.run(["docker", "exec", DGX1, "test", "-e", limits], check=False).returncode
    finally:
        docker_exec(DGX1, "mv", "/root/90-corectl.conf", limits)
    plan_rows = [row for row in table_rows(plan.stdout) if len(row) == 2]  # host | tasks that would change
    assert plan_rows == [[f"{P}dgx01", "base: /etc/security/limits.d/90-corectl.conf"]], plan.stdout
    assert missing == 1  # a plan is a dry run: the file is still missing after it
    assert (runs(lab)[-1]["command"], runs(lab)[-1]["check"]) == ("plan", True)


def prometheus(head: str, path: str) -> dict:
    code = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9090{path}').read().decode())"
    return json.loads(docker_exec(head, "python3", "-c", code))


def test_gpu_stack_monitoring_and_containers(lab: Path):
    head, dgx = f"corectl-{SITE}-{P}head01", f"corectl-{SITE}-{P}dgx01"
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
        if (health and all(h[2] == "up" for h in health)) or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert health == [
        (f"{P}dgx01", "dcgm", "up"),
        (f"{P}dgx01", "node", "up"),
        (f"{P}dgx02", "dcgm", "up"),
        (f"{P}dgx02", "node", "up"),
        (f"{P}head01", "node", "up"),
        ("self", "prometheus", "up"),
    ]
    series = prometheus(head, "/api/v1/query?query=DCGM_FI_DEV_GPU_TEMP")["data"]["result"]
    per_node = sorted((s["metric"]["node"], int(s["metric"]["gpu"])) for s in series)
    assert per_node == [(node, gpu) for node in (f"{P}dgx01", f"{P}dgx02") for gpu in range(8)]


DASHBOARDS = Path(__file__).resolve().parents[2] / "roles" / "monitoring" / "files" / "dashboards"
# what a Grafana viewer picks (node, user) and Grafana fills in (range, rate interval), to run a panel's query by hand
PANEL_VARIABLES = {"$node": f"{P}dgx01", "$user": "alice", "$__range": "1h", "$__rate_interval": "1m"}
# node_exporter reads InfiniBand counters only from /sys/class/infiniband, which containers do not have (the stand-in
# ports live in gpu-sim's own tree): that panel's query must run, but has no series here (docs/testing.md)
NO_SERIES_ON_STANDINS = {"InfiniBand receive errors"}
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def grafana(path: str) -> Any:
    """GET from Grafana on the head, as a viewer without an account."""
    code = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:3000{path}').read().decode())"
    return json.loads(docker_exec(HEAD, "python3", "-c", code))


def panel_query(expr: str) -> dict:
    for name, value in PANEL_VARIABLES.items():
        expr = expr.replace(name, value)
    return prometheus(HEAD, f"/api/v1/query?query={urllib.parse.quote(expr)}")


def test_every_dashboard_panel_answers_from_prometheus_and_alices_job_is_under_alice(lab: Path):
    """Issue 29: Grafana serves corectl's dashboards as generated; every panel's query, run against the lab's live
    Prometheus, returns series with the labels its legend groups by; a GPU job of alice's is under alice."""
    shipped = {json.loads(p.read_text())["uid"]: json.loads(p.read_text()) for p in DASHBOARDS.glob("*.json")}
    assert sorted(d["uid"] for d in grafana("/api/search?type=dash-db")) == sorted(shipped)
    for uid, board in shipped.items():
        assert grafana(f"/api/dashboards/uid/{uid}")["dashboard"] == board  # provisioned as the repository has it
    # what the panels show: the GPUs at work (gpu-sim's utilisation, what dcgm-exporter reads), a job of alice's on
    # two of them, a drained node
    for gpu in range(8):
        docker_exec(DGX1, "gpu-sim", "set", f"gpus.{gpu}.utilization_pct", "80")
        docker_exec(DGX1, "gpu-sim", "set", f"gpus.{gpu}.memory_used_mib", "40960")
    job = sbatch("--gpus=2", f"--nodelist={P}dgx01", "--wrap", "sleep 600")
    corectl("drain", f"{P}dgx02", "--reason", "e2e dashboards", "--inventory", str(lab))
    try:
        wait_for(lambda: job_state(job), lambda s: s.startswith("RUNNING"), 120)
        docker_exec(HEAD, "systemctl", "start", "corectl-slurm-metrics.service")  # as its timer would, sooner
        panels = {p["title"]: p["targets"][0]["expr"] for p in shipped["corectl-jobs"]["panels"]}

        def per_user() -> list[tuple[str, float]]:
            result = panel_query(panels["GPU utilisation per user"])["data"]["result"]
            return [(s["metric"]["user"], float(s["value"][1])) for s in result]

        # dcgm-exporter reads gpu-sim each collection and Prometheus scrapes it: wait for both GPUs at 80 under alice
        assert wait_for(per_user, lambda r: r == [("alice", 80.0)], 180) == [("alice", 80.0)]
        wait_for(lambda: panel_query("corectl_slurm_node_drained")["data"]["result"], bool, 120)
        targets = [
            (f"{uid} / {panel['title']}: {target['expr']}", panel["title"], target)
            for uid, board in sorted(shipped.items()) for panel in board["panels"] for target in panel["targets"]
        ]  # fmt: skip

        def faults() -> list[str]:
            """Every panel's query, run now: what is wrong with the answers (nothing: all good)."""
            found = []
            for where, title, target in targets:
                answer = panel_query(target["expr"])
                result = answer["data"]["result"] if answer["status"] == "success" else None
                if result is None:
                    found.append(f"{where}: {answer}")
                elif not result and title not in NO_SERIES_ON_STANDINS:
                    found.append(f"{where}: no series")
                found += [
                    f"{where}: no {label} label"
                    for label in LEGEND_LABEL.findall(target["legendFormat"])
                    if not all(label in series["metric"] for series in result or [])
                ]
            return found

        # GPU-hours are sampled on whole minutes (a subquery): a job that began seconds ago has none until the next
        assert wait_for(faults, lambda found: not found, 180) == []
        assert len(targets) >= 20
        # alice's job is under alice in the per-user panels: her two GPUs, at the utilisation gpu-sim gives them
        held = panel_query(panels["GPUs held per user"])["data"]["result"]
        # (a job without GPUs, another test's, would hold 0)
        assert [(s["metric"]["user"], float(s["value"][1])) for s in held if float(s["value"][1])] == [("alice", 2.0)]
        per_job = panel_query(panels["GPU utilisation per job"])["data"]["result"]
        assert {(s["metric"]["hpc_job"], s["metric"]["node"]) for s in per_job} == {(job, f"{P}dgx01")}
        assert len(per_job) == 2
        drained = panel_query("corectl_slurm_node_drained")["data"]["result"]
        assert [(s["metric"]["slurm_node"], s["metric"]["cause"]) for s in drained] == [(f"{P}dgx02", "other")]
    finally:
        docker_exec(HEAD, "scancel", job, check=False)
        corectl("resume", f"{P}dgx02", "--inventory", str(lab))
        for gpu in range(8):
            docker_exec(DGX1, "gpu-sim", "set", f"gpus.{gpu}.utilization_pct", "0")
            docker_exec(DGX1, "gpu-sim", "set", f"gpus.{gpu}.memory_used_mib", "0")
        wait_for(lambda: job_state(job), lambda s: s == "", 120)


CONTAINER_IMAGE = "/var/tmp/corectl-e2e-debian.sqsh"
# What each task of the container job prints (node, job, user, the image's os-release, a write in
# the home directory, the GPUs it may open and those the device cgroup denies: the stand-in GPUs
# have no driver behind them, so an allowed open fails with ENXIO, a denied one with EPERM), then
# it leaves its PID for the test, which reads the task's cgroup from the node (inside, enroot's
# cgroup namespace shows only "/"), and waits to be let go.
CONTAINER_TASK = (
    'echo "node=$SLURMD_NODENAME job=$SLURM_JOB_ID user=$(id -un):$(id -u) os=$(. /etc/os-release && echo $VARIANT_ID)'
    ' home=$(echo in-container > "$HOME/pyxis-$SLURMD_NODENAME" && echo "$HOME")'
    ' gpus=$(for d in /dev/nvidia[0-9]*; do (exec 3<$d) 2>&1 | grep -q "No such device" && echo -n x; done)'
    ' denied=$(for d in /dev/nvidia[0-9]*; do (exec 3<$d) 2>&1 | grep -q "not permitted" && echo -n x; done)";'
    ' echo $$ > "$HOME/pyxis-pid-$SLURMD_NODENAME";'
    ' for i in $(seq 120); do [ -e "$HOME/pyxis-done-$SLURMD_NODENAME" ] && exit 0; sleep 0.5; done; exit 1'
)


def make_container_image(first: str = DGX1, then: str = DGX2) -> None:
    """A squashfs of a minimal Debian root (debootstrap's minbase, the stand-in nodes' image) with
    its own os-release mark, made on dgx01 and copied to dgx02, where the job's tasks find it."""
    image = subprocess.run(
        ["docker", "inspect", "--format", "{{.Config.Image}}", first], capture_output=True, text=True, check=True
    ).stdout.strip()
    created = subprocess.run(["docker", "create", image], capture_output=True, text=True, check=True).stdout.strip()
    try:
        pack = (
            "set -e; rm -rf /var/tmp/img; mkdir /var/tmp/img; tar -x -C /var/tmp/img;"
            " cd /var/tmp/img; rm -rf dev/* proc/* sys/* run/*;"  # docker export's device nodes; enroot mounts its own
            " rm -rf usr/share/doc usr/share/man usr/share/locale var/cache/* var/lib/apt/lists/*;"
            " cp --remove-destination usr/lib/os-release etc/os-release; echo VARIANT_ID=corectl-e2e >> etc/os-release;"
            # as NGC images declare it: enroot's 98-nvidia.sh hook then hands the GPUs over
            " echo NVIDIA_VISIBLE_DEVICES=all >> etc/environment;"
            f" mksquashfs /var/tmp/img {CONTAINER_IMAGE} -noappend -comp lzo -quiet -no-progress;"
            f" chmod 0644 {CONTAINER_IMAGE}; rm -rf /var/tmp/img"
        )
        exported = subprocess.Popen(["docker", "export", created], stdout=subprocess.PIPE)
        subprocess.run(["docker", "exec", "-i", first, "sh", "-c", pack], stdin=exported.stdout, check=True)
        assert exported.wait() == 0
    finally:
        subprocess.run(["docker", "rm", created], capture_output=True, check=False)
    copied = subprocess.Popen(["docker", "exec", first, "cat", CONTAINER_IMAGE], stdout=subprocess.PIPE)
    subprocess.run(
        ["docker", "exec", "-i", then, "sh", "-c", f"cat > {CONTAINER_IMAGE} && chmod 0644 {CONTAINER_IMAGE}"],
        stdin=copied.stdout,
        check=True,
    )
    assert copied.wait() == 0


@pytest.fixture(scope="module")
def container_image(lab: Path) -> str:
    """The test image (Debian's base system, squashed) on both GPU nodes, made once."""
    make_container_image()
    return CONTAINER_IMAGE


def test_a_container_job_runs_through_pyxis_and_enroot(lab: Path, container_image: str):
    """The real pyxis (built by the role from its release archive) and the real enroot (release
    .debs built from upstream source): `srun --container-image` on both GPU nodes runs the task in
    the image, as the submitting user, with the user's home and the job's GPUs (through enroot's
    nvidia hook and the stand-in nvidia-container-cli), in the job's cgroup; the container is
    removed when the step ends."""
    for container in (DGX1, DGX2):
        docker_exec(container, "sh", "-c", "rm -f /home/alice/pyxis-*")
    job = subprocess.Popen(
        ["docker", "exec", HEAD, "runuser", "-u", "alice", "--", "srun", "--nodes=2", "--ntasks-per-node=1",
         "--gpus-per-node=2", f"--container-image={CONTAINER_IMAGE}", "--container-mount-home",
         "sh", "-c", CONTAINER_TASK],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    cgroups = {}
    try:
        for node, container in ((f"{P}dgx01", DGX1), (f"{P}dgx02", DGX2)):
            pid = wait_for(
                lambda c=container, n=node: docker_exec(c, "cat", f"/home/alice/pyxis-pid-{n}", check=False).strip(),
                lambda found: found != "" or job.poll() is not None,
                180,
            )
            assert pid, job.communicate()
            cgroups[node] = docker_exec(container, "cat", f"/proc/{pid}/cgroup")
            docker_exec(container, "runuser", "-u", "alice", "--", "touch", f"/home/alice/pyxis-done-{node}")
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, out + err
    lines = sorted(out.split("\n")[:-1])
    assert len(lines) == 2, out + err
    for line, node, container in zip(lines, (f"{P}dgx01", f"{P}dgx02"), (DGX1, DGX2), strict=True):
        fields = dict(item.split("=", 1) for item in line.split())
        assert fields["node"] == node and fields["user"] == "alice:20001", line
        assert fields["os"] == "corectl-e2e", line  # the image's os-release, not the node's
        assert f"/job_{fields['job']}/step_0/" in cgroups[node], cgroups[node]  # the task runs in the job's step
        # all eight GPUs' device nodes are in the container; the job's two may be opened
        assert (len(fields["gpus"]), len(fields["denied"])) == (2, 6), line
        # the write in the container landed in alice's home on the node, owned by her
        home = fields["home"]
        written = docker_exec(container, "stat", "--format", "%U %n", f"{home}/pyxis-{node}").strip()
        assert written == f"alice {home}/pyxis-{node}", written
        assert docker_exec(container, "cat", f"{home}/pyxis-{node}").strip() == "in-container"
        # pyxis removed the job's container: nothing left in alice's enroot data directory
        left = docker_exec(container, "sh", "-c", "ls -A /raid/enroot/data/user-20001 2>/dev/null; true").split()
        assert left == [], left


# What a research team's job needs (issue 32): MPI through PMIx, bare and in a container, each
# job with its own /tmp, and GPUs bound to the cores of their socket.
MPI_IMAGE = "/var/tmp/corectl-e2e-mpi.sqsh"
# each rank adds rank+1: four ranks sum to 10; the job's /tmp is its own mount
MPI_TASK = (
    "python3 -c 'from mpi4py import MPI; c = MPI.COMM_WORLD; "
    'print("rank=%d size=%d sum=%d" % (c.rank, c.size, c.allreduce(c.rank + 1)))\'; '
    'echo "tmp=$(findmnt -n -o SOURCE /tmp) pmix=$(env | grep -c ^PMIX_SERVER_URI)"'
)


def install_mpi_as_a_user_would() -> None:
    """Debian's OpenMPI and mpi4py on the GPU nodes, as a site's user software would be."""
    for container in (DGX1, DGX2):
        subprocess.run(
            ["docker", "exec", "-e", "DEBIAN_FRONTEND=noninteractive", container, "apt-get", "install", "-y", "-qq",
             "--no-install-recommends", "openmpi-bin", "python3-mpi4py"],
            capture_output=True, check=True,
        )  # fmt: skip


def make_mpi_image() -> None:
    """A squashfs of the stand-in image with OpenMPI and mpi4py installed in it (the job's own
    MPI, not the node's), on both GPU nodes."""
    image = subprocess.run(
        ["docker", "inspect", "--format", "{{.Config.Image}}", DGX1], capture_output=True, text=True, check=True
    ).stdout.strip()
    name = f"corectl-{SITE}-{P}mpi-image"
    subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    install = (
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends"
        " openmpi-bin python3-mpi4py >/dev/null"
    )
    run = ["docker", "run", "--name", name, *accounting_flags(), image, "sh", "-c", install]
    subprocess.run(run, capture_output=True, check=True)
    try:
        pack = (
            "set -e; rm -rf /var/tmp/mpi; mkdir /var/tmp/mpi; tar -x -C /var/tmp/mpi; cd /var/tmp/mpi;"
            " rm -rf dev/* proc/* sys/* run/* usr/share/doc usr/share/man var/cache/* var/lib/apt/lists/*;"
            f" mksquashfs /var/tmp/mpi {MPI_IMAGE} -noappend -comp lzo -quiet -no-progress;"
            f" chmod 0644 {MPI_IMAGE}; rm -rf /var/tmp/mpi"
        )
        exported = subprocess.Popen(["docker", "export", name], stdout=subprocess.PIPE)
        subprocess.run(["docker", "exec", "-i", DGX1, "sh", "-c", pack], stdin=exported.stdout, check=True)
        assert exported.wait() == 0
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    copied = subprocess.Popen(["docker", "exec", DGX1, "cat", MPI_IMAGE], stdout=subprocess.PIPE)
    subprocess.run(
        ["docker", "exec", "-i", DGX2, "sh", "-c", f"cat > {MPI_IMAGE} && chmod 0644 {MPI_IMAGE}"],
        stdin=copied.stdout,
        check=True,
    )
    assert copied.wait() == 0


def mpi_lines(out: str) -> list[dict[str, str]]:
    return sorted(
        (dict(item.split("=", 1) for item in line.split()) for line in out.splitlines() if "=" in line),
        key=lambda fields: sorted(fields.items()),
    )


def test_an_mpi_job_runs_across_two_nodes_through_pmix_bare_and_in_a_container(lab: Path):
    install_mpi_as_a_user_would()
    make_mpi_image()
    # MpiDefault is pmix: the plain srun line users type; --mpi=pmix said explicitly in the second
    for extra in ([], [f"--container-image={MPI_IMAGE}", "--mpi=pmix"]):
        run = subprocess.run(
            ["docker", "exec", HEAD, "runuser", "-u", "alice", "--", "srun", "--nodes=2", "--ntasks=4",
             "--ntasks-per-node=2", *extra, "sh", "-c", MPI_TASK],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        fields = mpi_lines(run.stdout)
        ranks = [f for f in fields if "rank" in f]
        assert sorted(f["rank"] for f in ranks) == ["0", "1", "2", "3"], run.stdout + run.stderr
        assert {(f["size"], f["sum"]) for f in ranks} == {("4", "10")}, run.stdout
        places = [f for f in fields if "tmp" in f]
        assert len(places) == 4, run.stdout
        for place in places:
            # a bare task's /tmp is its job's directory on the node's scratch (job_container/tmpfs);
            # in a container, enroot mounts a tmpfs of the container's own on /tmp
            if extra:
                assert place["tmp"] == "tmpfs", place
            else:
                assert re.search(rf"\[/raid/slurm-job-tmp/{P}dgx0[12]/\d+/\.\d+\]$", place["tmp"]), place
            # PMIx's server is reachable from the task, in the container too
            assert int(place["pmix"]) >= 1, place


def test_each_job_has_its_own_tmp_that_is_gone_after_it(lab: Path):
    hold = (
        'echo "from $SLURM_JOB_ID" > /tmp/e2e-private; echo "$SLURM_JOB_ID $(findmnt -n -o SOURCE /tmp)"'
        ' > "$HOME/e2e-tmp-first"; until [ -e "$HOME/e2e-tmp-done" ]; do sleep 0.5; done'
    )
    docker_exec(DGX1, "sh", "-c", "rm -f /home/alice/e2e-tmp-*")
    first = subprocess.Popen(
        ["docker", "exec", HEAD, "runuser", "-u", "alice", "--", "srun", f"--nodelist={P}dgx01", "--ntasks=1",
         "--cpus-per-task=1", "sh", "-c", hold],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        seen = wait_for(lambda: docker_exec(DGX1, "cat", "/home/alice/e2e-tmp-first", check=False).split(),
                        lambda found: len(found) == 2 or first.poll() is not None, 120)  # fmt: skip
        assert len(seen) == 2, first.communicate()
        job, mount = seen
        assert mount.endswith(f"/slurm-job-tmp/{P}dgx01/{job}/.{job}]"), mount
        # a second job at the same time on the same node sees an empty /tmp of its own
        second = docker_exec(
            HEAD, "runuser", "-u", "alice", "--", "srun", f"--nodelist={P}dgx01", "--ntasks=1", "--cpus-per-task=1",
            "sh", "-c", "ls -A /tmp; findmnt -n -o SOURCE /tmp",
        ).split()  # fmt: skip
        assert len(second) == 1 and second[0] != mount and f"/slurm-job-tmp/{P}dgx01/" in second[0], second
        # the first job's file is on the node's scratch while it runs, not in the node's /tmp
        kept = docker_exec(DGX1, "sh", "-c", f"cat /raid/slurm-job-tmp/{P}dgx01/{job}/.{job}/e2e-private")
        assert kept.strip() == f"from {job}"
        assert docker_exec(DGX1, "sh", "-c", "ls -A /tmp").split().count("e2e-private") == 0
        docker_exec(DGX1, "runuser", "-u", "alice", "--", "touch", "/home/alice/e2e-tmp-done")
        out, err = first.communicate(timeout=60)
        assert first.returncode == 0, out + err
    finally:
        if first.poll() is None:
            first.kill()
    # the job is over: its directory is gone from the scratch
    listing = f"ls -A /raid/slurm-job-tmp/{P}dgx01/ | grep -x {job}; true"
    left = wait_for(lambda: docker_exec(DGX1, "sh", "-c", listing), lambda found: found.strip() == "", 30)
    assert left.strip() == "", left


def test_gpus_come_with_the_cores_of_their_socket(lab: Path):
    """The stand-in DGX is declared as 2 sockets of 1 core, GPUs 0-3 on socket 0 and 4-7 on
    socket 1 (gres.conf Cores=). With one core taken by a CPU-only job, a 4-GPU job with
    --gres-flags=enforce-binding can only get the other socket's GPUs; without Cores= it would
    take GPUs 0-3 whatever core it got."""
    gpu_task = 'echo "gpus=$SLURM_STEP_GPUS $(grep Cpus_allowed_list /proc/self/status | tr -d "\\t")"'
    for _ in range(2):
        docker_exec(DGX1, "sh", "-c", "rm -f /home/alice/e2e-bind-*")
        filler = subprocess.Popen(
            ["docker", "exec", HEAD, "runuser", "-u", "alice", "--", "srun", f"--nodelist={P}dgx01", "--ntasks=1",
             "--cpus-per-task=1", "sh", "-c",
             'grep Cpus_allowed_list /proc/self/status | cut -f2 > "$HOME/e2e-bind-filler";'
             ' until [ -e "$HOME/e2e-bind-done" ]; do sleep 0.5; done'],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            core = wait_for(lambda: docker_exec(DGX1, "cat", "/home/alice/e2e-bind-filler", check=False).strip(),
                            lambda found, job=filler: found != "" or job.poll() is not None, 60)  # fmt: skip
            assert core in ("0", "1"), filler.communicate()
            bound = docker_exec(
                HEAD, "runuser", "-u", "alice", "--", "srun", f"--nodelist={P}dgx01", "--ntasks=1",
                "--cpus-per-task=1", "--gres=gpu:4", "--gres-flags=enforce-binding", "sh", "-c", gpu_task,
            ).strip()  # fmt: skip
            other = 1 - int(core)
            assert bound == f"gpus={','.join(str(4 * other + i) for i in range(4))} Cpus_allowed_list:{other}", bound
            docker_exec(DGX1, "runuser", "-u", "alice", "--", "touch", "/home/alice/e2e-bind-done")
            assert filler.wait(timeout=60) == 0
        finally:
            if filler.poll() is None:
                filler.kill()


def stray_process(container: str) -> int:
    """A process started on the node outside any job (as a daemonised helper would be): its pid."""
    return int(docker_exec(container, "sh", "-c", "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!").strip())


def process_running(container: str, pid: int) -> bool:
    state = docker_exec(container, "sh", "-c", f"cut -d' ' -f3 /proc/{pid}/stat 2>/dev/null; true").strip()
    return state not in ("", "Z")


def test_the_epilog_kills_what_a_job_left_on_its_gpus_and_drains_when_a_gpu_stays_held(lab: Path):
    """Two 4-GPU jobs on one node; stray processes outside any job's cgroup listed (by the stand-in
    nvidia-smi) on each job's GPUs. Job B's end kills the one on B's GPU and leaves the one on A's;
    a GPU of A that stays held after its process is killed drains the node, naming the process."""
    hold = (
        'echo "$SLURM_JOB_GPUS" > "$HOME/e2e-handover-$1";'
        ' until [ -e "$HOME/e2e-handover-$1-done" ]; do sleep 0.5; done'
    )
    docker_exec(DGX1, "sh", "-c", "rm -f /home/alice/e2e-handover-*")
    jobs = [
        sbatch(f"--nodelist={P}dgx01", "--ntasks=1", "--cpus-per-task=1", "--gres=gpu:4", f"--job-name=handover-{n}",
               "--wrap", f"sh -c '{hold}' - {n}")
        for n in ("a", "b")
    ]  # fmt: skip
    strays: list[int] = []
    try:
        gpus = {}
        for n in ("a", "b"):
            mark = f"/home/alice/e2e-handover-{n}"
            listed = wait_for(lambda mark=mark: docker_exec(DGX1, "cat", mark, check=False).strip(),
                              lambda found: found != "", 120)  # fmt: skip
            assert listed, [job_state(job) for job in jobs]
            gpus[n] = [int(g) for g in listed.split(",")]
        assert len(gpus["a"]) == len(gpus["b"]) == 4 and not set(gpus["a"]) & set(gpus["b"]), gpus
        on_b, on_a, stuck_on_a = stray_process(DGX1), stray_process(DGX1), stray_process(DGX1)
        strays = [on_b, on_a, stuck_on_a]
        docker_exec(DGX1, "gpu-sim", "attach", "--gpu", str(gpus["b"][1]), "--pid", str(on_b))
        docker_exec(DGX1, "gpu-sim", "attach", "--gpu", str(gpus["a"][0]), "--pid", str(on_a))
        listed = docker_exec(DGX1, "nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader").split()
        assert sorted(listed) == sorted([str(on_b), str(on_a)])

        docker_exec(DGX1, "touch", "/home/alice/e2e-handover-b-done")
        wait_for(lambda: job_state(jobs[1]), lambda state: state == "", 60)
        wait_for(lambda: process_running(DGX1, on_b), lambda running: not running, 60)
        assert not process_running(DGX1, on_b)
        assert process_running(DGX1, on_a)  # on job A's GPU: not B's to kill
        assert not slurm_reason(f"{P}dgx01").startswith("drain"), slurm_reason(f"{P}dgx01")

        # a GPU whose context is never released (the stand-in's --stuck) after its process dies
        docker_exec(DGX1, "gpu-sim", "attach", "--gpu", str(gpus["a"][2]), "--pid", str(stuck_on_a), "--stuck")
        docker_exec(DGX1, "touch", "/home/alice/e2e-handover-a-done")
        state = wait_for(lambda: slurm_reason(f"{P}dgx01"), lambda found: "corectl-epilog" in found, 90)
        assert state.split("|")[0] in ("drain", "drng"), state
        assert f"left pid {stuck_on_a} (sleep) on GPU {gpus['a'][2]}, still there after SIGKILL" in state, state
        assert not process_running(DGX1, on_a) and not process_running(DGX1, stuck_on_a)
    finally:
        for job in jobs:
            docker_exec(HEAD, "scancel", job, check=False)
        docker_exec(DGX1, "gpu-sim", "detach", check=False)
        for pid in strays:
            docker_exec(DGX1, "kill", "-9", str(pid), check=False)
        if "corectl-epilog" in slurm_reason(f"{P}dgx01"):
            docker_exec(HEAD, "scontrol", "update", f"nodename={P}dgx01", "state=resume")
    back = wait_for(lambda: slurm_reason(f"{P}dgx01"), lambda found: found.split("|")[0] == "idle", 60)
    assert back.startswith("idle"), back


def test_nvml_autodetect_without_its_plugin_stops_the_run_before_any_change(lab: Path):
    cluster_yml = lab / "cluster.yml"
    declared = cluster_yml.read_text()
    assert declared.count("autodetect: 'off'") == 1
    cluster_yml.write_text(declared.replace("autodetect: 'off'", "autodetect: nvml"))
    try:
        corectl("render", "--inventory", str(lab))
        refused = corectl("provision", "--inventory", str(lab), check=False)
    finally:
        cluster_yml.write_text(declared)
        corectl("render", "--inventory", str(lab))
    assert refused.returncode == 1, refused.stdout
    slurm = docker_exec(DGX1, "dpkg-query", "-W", "-f=${Version}", "slurm-wlm-basic-plugins")
    for node in (f"{P}dgx01", f"{P}dgx02"):
        assert (
            f"{node}: gpus.autodetect nvml needs slurm-wlm-nvml-plugin {slurm} (Debian contrib) and the "
            "driver's libnvidia-ml, but no repository of the node offers the plugin" in refused.stdout
        ), refused.stdout
    record = runs(lab)[-1]
    assert record["status"] == "failed"
    assert all(h["changed"] == 0 for h in record["hosts"].values()), record["hosts"]
    assert set(record["hosts"]) == {f"{P}dgx01", f"{P}dgx02"}  # stopped in its first play: no other host reached


def sbatch(*args: str) -> str:
    """Submit as alice; the job id."""
    return docker_exec(
        HEAD, "runuser", "-u", "alice", "--", "sbatch", "--parsable", "--output=/dev/null", *args
    ).strip()  # fmt: skip


def job_state(job: str) -> str:
    """'STATE REASON' of a job in the queue ("" once it left)."""
    return docker_exec(HEAD, "squeue", "--noheader", "--job", job, "--format", "%T %r", check=False).strip()


def test_fair_share_tree_and_gpu_jobs_count_in_usage(lab: Path):
    tree = docker_exec(HEAD, "sshare", "--noheader", "--parsable2", "--all", "--format=Account,User,RawShares")
    accounts = [line for line in tree.splitlines() if line.split("|")[1:2] == [""]]
    # the declared tree: research (10 shares) with its sub-account vision (5), hpcadmin (1), under root
    assert {" research||10", "  vision||5", " hpcadmin||1"} <= set(accounts), tree
    assert "   vision|alice|1" in tree.splitlines(), tree

    def usage() -> int:
        line = docker_exec(HEAD, "sshare", "--noheader", "--parsable2", "--accounts=vision", "--format=RawUsage")
        return int(line.splitlines()[0])

    before = usage()
    billed = {}
    for gres in ("", "--gres=gpu:4"):
        job = docker_exec(
            HEAD, "runuser", "-u", "alice", "--", "srun", "--account=vision", f"--nodelist={P}dgx02", "--ntasks=1",
            "--cpus-per-task=1", *([gres] if gres else []), "sh", "-c", 'sleep 2; echo "$SLURM_JOB_ID"',
        ).strip()  # fmt: skip
        # slurmctld hands the job's record to slurmdbd through a queue: wait for it to be there
        tres = wait_for(
            lambda j=job: docker_exec(HEAD, "sacct", "-X", "-n", "-P", "-j", j, "-o", "AllocTRES").strip(),
            lambda text: "billing=" in text,
            60,
        )
        billed[gres] = dict(item.split("=", 1) for item in tres.split(","))
    # TRESBillingWeights count GPUs: the same job with four GPUs (the cap of vision) is billed more
    assert billed["--gres=gpu:4"]["gres/gpu"] == "4", billed
    assert int(billed["--gres=gpu:4"]["billing"]) > int(billed[""]["billing"]), billed
    assert wait_for(usage, lambda now: now > before, 60) > before


def test_a_job_past_its_accounts_gpu_cap_pends_with_slurms_reason(lab: Path):
    # vision's cap is gres/gpu=4 (GrpTRES): 4 GPUs run, one more waits although dgx02 has 8 free
    first = sbatch("--account=vision", f"--nodelist={P}dgx01", "--gres=gpu:4", "--wrap", "sleep 300")
    second = sbatch("--account=vision", f"--nodelist={P}dgx02", "--gres=gpu:1", "--wrap", "sleep 300")
    try:
        assert wait_for(lambda: job_state(first), lambda s: s.startswith("RUNNING"), 60).startswith("RUNNING")
        assert wait_for(lambda: job_state(second), lambda s: s == "PENDING AssocGrpGRES", 60) == "PENDING AssocGrpGRES"
        # under research itself, which has no cap, the same request runs
        third = sbatch("--account=research", f"--nodelist={P}dgx02", "--gres=gpu:1", "--wrap", "sleep 300")
        assert wait_for(lambda: job_state(third), lambda s: s.startswith("RUNNING"), 60).startswith("RUNNING")
    finally:
        docker_exec(HEAD, "scancel", "--user=alice")
    assert wait_for(lambda: docker_exec(HEAD, "squeue", "--noheader", "--user=alice"), lambda q: q.strip() == "") == ""


def test_a_job_of_a_preempting_qos_requeues_a_preemptable_one(lab: Path):
    low = sbatch("--qos=low", "--nodes=2", "--exclusive", "--wrap", "sleep 600")
    try:
        assert wait_for(lambda: job_state(low), lambda s: s.startswith("RUNNING"), 60).startswith("RUNNING")
        high = sbatch("--qos=high", "--nodes=1", "--exclusive", "--wrap", "sleep 600")
        assert wait_for(lambda: job_state(high), lambda s: s.startswith("RUNNING"), 90).startswith("RUNNING")

        def restarts() -> int:
            shown = docker_exec(HEAD, "scontrol", "show", "job", low)
            return int(re.search(r"Restarts=(\d+)", shown).group(1))  # type: ignore[union-attr]

        # the low job was requeued (not cancelled): its restart count up and, once its nodes ran the epilog
        # (REQUEUED/COMPLETING meanwhile), back in the queue
        assert wait_for(restarts, lambda n: n >= 1, 60) >= 1
        state = wait_for(lambda: job_state(low), lambda s: s.startswith("PENDING"), 90)
        assert state.startswith("PENDING"), state
    finally:
        docker_exec(HEAD, "scancel", "--user=alice")
    assert wait_for(lambda: docker_exec(HEAD, "squeue", "--noheader", "--user=alice"), lambda q: q.strip() == "") == ""


def vision_limit() -> str:
    return docker_exec(
        HEAD, "sacctmgr", "--noheader", "--parsable2", "show", "assoc", "where", "account=vision", "user=",
        "format=GrpTRES",
    ).strip()  # fmt: skip


def last_run_changes(lab: Path) -> dict[str, int]:
    return {host: counts["changed"] for host, counts in runs(lab)[-1]["hosts"].items()}


def changes_shown(lab: Path) -> str:
    """What a failed no-op check names: `corectl runs --show last` (each task the newest run changed, per host) and
    the head's service units that logged a warning or worse in the last ten minutes (a daemon that died between two
    runs is started again by the second: its last words say why)."""
    shown = corectl("runs", "--inventory", str(lab), "--show", "last").stdout
    journal = ("journalctl", "--no-pager", "-q", "-p", "warning", "--since", "-10min", "-n", "40")
    said = docker_exec(HEAD, *journal, check=False)
    dbd = docker_exec(HEAD, "tail", "-n", "8", "/var/log/slurm/slurmdbd.log", check=False)
    return f"{shown}\nthe head's warnings of the last ten minutes:\n{said}\nslurmdbd.log ends:\n{dbd}"


def test_the_accounting_database_converges_to_cluster_yml(lab: Path):
    args = ["--inventory", str(lab), "--tags", "slurm"]
    # a limit changed by hand is put back, and only that changes
    docker_exec(HEAD, "sacctmgr", "--immediate", "modify", "account", "where", "name=vision", "set",
                "grptres=gres/gpu=7")  # fmt: skip
    assert vision_limit() == "gres/gpu=7"
    corectl("provision", *args)
    assert vision_limit() == "gres/gpu=4"
    assert last_run_changes(lab) == {f"{P}head01": 1, f"{P}dgx01": 0, f"{P}dgx02": 0}
    corectl("provision", *args)
    assert set(last_run_changes(lab).values()) == {0}, changes_shown(lab)
    # an account cluster.yml drops while it has a pending job is reported and kept
    held = sbatch("--account=vision", "--hold", "--wrap", "true")
    cluster_yml = lab / "cluster.yml"
    declared = cluster_yml.read_text()
    dropped = declared.replace("  - research\n  - vision\n", "  - research\n")
    dropped = re.sub(r"  - name: vision\n(    .*\n)+", "", dropped)
    assert "vision" not in dropped, dropped
    cluster_yml.write_text(dropped)
    try:
        corectl("render", "--inventory", str(lab))
        kept = corectl("provision", *args)
        assert f"WARNING {P}head01: account vision: kept, it has running or pending jobs" in kept.stdout, kept.stdout
        assert vision_limit() == "gres/gpu=4"
    finally:
        cluster_yml.write_text(declared)
        corectl("render", "--inventory", str(lab))
        docker_exec(HEAD, "scancel", held)
    corectl("provision", *args)
    assert set(last_run_changes(lab).values()) == {0}, changes_shown(lab)


NCCL = ["NCCL_IB_GID_INDEX=3", f"NCCL_IB_HCA={','.join(f'mlx5_{i}' for i in range(8))}", "NCCL_SOCKET_IFNAME=eth0"]


def test_backups_of_the_head_verify_and_the_timer_keeps_the_retention_count(lab: Path):
    """Issue 34: `corectl backup` takes the accounting database (one transaction), slurmctld's saved state and
    corectl's own records, each checksummed; the head's timer service keeps the newest two (the lab's retention);
    a damaged file is named and fails the listing."""
    args = ("--inventory", str(lab))
    marker = "e2e-backup-marker"
    job = sbatch(f"--job-name={marker}", "--wrap", "true")
    sacct = ("sacct", "-j", job, "-X", "-n", "-o", "State")
    wait_for(lambda: docker_exec(HEAD, *sacct).split(), lambda states: states == ["COMPLETED"], 120)
    docker_exec(HEAD, "rm", "-rf", "/shared/corectl-backups")  # this test's backups only
    # the provision may have started Prometheus seconds ago: its snapshot holds a block once it holds samples
    up = "/api/v1/query?query=up%7Bjob%3D%22node%22%7D"
    wait_for(lambda: prometheus(HEAD, up)["data"]["result"], lambda series: len(series) >= 3, 120)
    [taken] = json.loads(corectl("backup", *args, "--json").stdout)
    assert (taken["host"], taken["verified"]) == (f"{P}head01", "ok"), taken
    archives = ["prometheus-tsdb.tar.gz", "slurm_acct_db.sql.gz", "slurmctld-state.tar.gz"]
    assert taken["files"] == ["corectl-site.tar.gz", *archives]
    path = f"/shared/corectl-backups/{taken['name']}"
    assert docker_exec(HEAD, "stat", "-c", "%a %U", "/shared/corectl-backups").split() == ["700", "root"]
    # the dump holds the job just run; the state archive slurmctld's job state; corectl's archive the site as
    # corectl keeps it, its secrets vault-encrypted and without the vault password
    assert int(docker_exec(HEAD, "zgrep", "-c", marker, f"{path}/slurm_acct_db.sql.gz")) >= 1
    assert "slurmctld/job_state" in docker_exec(HEAD, "tar", "-tzf", f"{path}/slurmctld-state.tar.gz").split()
    # Prometheus's data through its snapshot API: the blocks (the head's samples written out as one), and no
    # snapshot left in Prometheus's data directory
    tsdb = docker_exec(HEAD, "tar", "-tzf", f"{path}/prometheus-tsdb.tar.gz").split()
    assert [name for name in tsdb if re.fullmatch(r"prometheus/[0-9A-Z]{26}/meta\.json", name)], tsdb
    assert docker_exec(HEAD, "ls", "-A", "/var/lib/prometheus/metrics2/snapshots").split() == []
    # its admin API is on, so its port answers the head itself and operators' networks, not the nodes
    reach = f"import socket; socket.create_connection(('{NET}.10', 9090), timeout=10)"
    refused = exec_in(DGX1, "python3", "-c", reach)
    assert refused.returncode == 1 and "ConnectionRefusedError" in refused.stderr, refused
    site_files = docker_exec(HEAD, "tar", "-tzf", f"{path}/corectl-site.tar.gz").split()
    assert {f"{lab.name}/cluster.yml", f"{lab.name}/secrets/munge.key"} <= set(site_files), site_files
    assert not [name for name in site_files if ".vault-pass" in name or "/.lab" in name], site_files
    munge = docker_exec(HEAD, "sh", "-c", f"tar -xzOf {path}/corectl-site.tar.gz {lab.name}/secrets/munge.key")
    assert munge.startswith("$ANSIBLE_VAULT;"), munge[:40]
    copy = subprocess.run(["docker", "exec", HEAD, "test", "-e", "/root/corectl-site.tar.gz"], check=False)
    assert copy.returncode == 1  # corectl's copy of its archive is gone from the head
    # the timer's own service twice more: three backups taken, the newest two kept, each verifying
    assert docker_exec(HEAD, "systemctl", "is-enabled", "corectl-backup.timer").strip() == "enabled"
    for _ in range(2):
        docker_exec(HEAD, "systemctl", "start", "corectl-backup.service")  # oneshot: returns when it is done
    kept = json.loads(corectl("backup", "--list", *args, "--json").stdout)
    assert len(kept) == 2 and taken["name"] not in [k["name"] for k in kept], kept
    assert [k["verified"] for k in kept] == ["ok", "ok"]
    assert kept[-1]["files"] == archives  # the timer's: the head's own
    # each outcome reaches Prometheus through node_exporter's textfile collector (role monitoring's alerts)
    query = "/api/v1/query?query=corectl_backup_kept"

    def kept_series() -> list:
        return [(r["metric"]["node"], r["value"][1]) for r in prometheus(HEAD, query)["data"]["result"]]

    assert wait_for(kept_series, lambda series: series == [(f"{P}head01", "2")], 90) == [(f"{P}head01", "2")]
    # a byte changed in the newest dump: named, and the listing exits 1
    newest = f"/shared/corectl-backups/{kept[-1]['name']}/slurm_acct_db.sql.gz"
    docker_exec(HEAD, "sh", "-c", f"printf X | dd of={newest} bs=1 seek=30 conv=notrunc status=none")
    broken = corectl("backup", "--list", *args, check=False)
    assert broken.returncode == 1, broken.stdout
    rows = {row[0]: row[3] for row in table_rows(broken.stdout) if row[0].startswith("20")}
    corrupt = "corrupt: slurm_acct_db.sql.gz does not match its checksum"
    assert rows == {kept[0]["name"]: "ok", kept[-1]["name"]: corrupt}, broken.stdout


CEPH = f"corectl-{SITE}-{P}ceph"  # the stand-in Ceph server's container: the backup host of the next test


def test_backups_go_to_a_backup_host_over_ssh_with_the_sites_own_key(lab: Path):
    """Issue 34: with backup.ssh naming a backup host (the Ceph stand-in's machine and its sshd), the head sends
    each backup there with tar over SSH, logging in with the key corectl made for the site (`corectl secrets
    backup-key`, the one line an operator puts in authorized_keys) and trusting only the pinned host key; the
    listing verifies them there, the timer keeps the retention count there, nothing stays on the head, and a
    restore check fetches one back. A host answering with another host key is refused."""
    args = ("--inventory", str(lab))
    cluster_yml = lab / "cluster.yml"
    declared = cluster_yml.read_text()
    host_key = " ".join(docker_exec(CEPH, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()[:2])
    config = yaml.safe_load(declared)
    backup_host = {"host": f"{NET}.5", "user": "corectl-backup", "host_key": host_key}
    config["backup"].update(destination="/srv/corectl-backups", ssh=backup_host)
    cluster_yml.write_text(yaml.safe_dump(config, sort_keys=False))
    where = f"corectl-backup@{NET}.5:/srv/corectl-backups"
    try:
        assert "corectl_backup_ssh_key" in corectl("secrets", "init", *args).stdout
        public = corectl("secrets", "backup-key", *args).stdout.strip()
        assert re.fullmatch(rf"ssh-ed25519 [A-Za-z0-9+/]+ corectl-backup@{lab.name}", public), public
        # the backup host's administrator: a user for the backups with that key, and the directory for them
        docker_exec(CEPH, "useradd", "--create-home", "corectl-backup", check=False)
        prepare = (
            "install -d -m 700 -o corectl-backup ~corectl-backup/.ssh /srv/corectl-backups"
            f" && printf '%s\\n' '{public}' > ~corectl-backup/.ssh/authorized_keys"
            " && chown corectl-backup ~corectl-backup/.ssh/authorized_keys"
        )
        docker_exec(CEPH, "sh", "-c", prepare)
        corectl("provision", *args, "--limit", f"{P}head01", "--tags", "backup")
        assert docker_exec(HEAD, "stat", "-c", "%a %U", "/etc/corectl/backup-ssh/id_ed25519").split() == ["600", "root"]
        [taken] = json.loads(corectl("backup", *args, "--json").stdout)
        assert (taken["verified"], taken["path"]) == ("ok", f"{where}/{taken['name']}"), taken
        there = f"/srv/corectl-backups/{taken['name']}"
        assert sorted(docker_exec(CEPH, "ls", there).split()) == [
            "MANIFEST.json",
            "corectl-site.tar.gz",
            "prometheus-tsdb.tar.gz",
            "slurm_acct_db.sql.gz",
            "slurmctld-state.tar.gz",
        ]
        assert docker_exec(CEPH, "stat", "-c", "%U", f"{there}/slurm_acct_db.sql.gz").strip() == "corectl-backup"
        assert docker_exec(HEAD, "ls", "-A", "/var/lib/corectl/backup-staging").split() == []  # nothing left here
        # the timer's own service twice more: the newest two kept on the backup host, each verifying there
        for _ in range(2):
            docker_exec(HEAD, "systemctl", "start", "corectl-backup.service")  # oneshot: returns when it is done
        kept = json.loads(corectl("backup", "--list", *args, "--json").stdout)
        assert [k["verified"] for k in kept] == ["ok", "ok"] and taken["name"] not in [k["name"] for k in kept], kept
        assert sorted(docker_exec(CEPH, "ls", "/srv/corectl-backups").split()) == [k["name"] for k in kept]
        # a byte changed there: named by the listing
        newest = f"/srv/corectl-backups/{kept[-1]['name']}/slurm_acct_db.sql.gz"
        docker_exec(CEPH, "sh", "-c", f"printf X | dd of={newest} bs=1 seek=30 conv=notrunc status=none")
        broken = corectl("backup", "--list", *args, check=False)
        assert broken.returncode == 1, broken.stdout
        rows = {row[0]: row[3] for row in table_rows(broken.stdout) if row[0].startswith("20")}
        corrupt = "corrupt: slurm_acct_db.sql.gz does not match its checksum"
        assert rows == {kept[0]["name"]: "ok", kept[-1]["name"]: corrupt}, broken.stdout
        # a restore check fetches the other back to the head (and leaves no copy)
        checked = exec_in(HEAD, "corectl-backup", "restore", kept[0]["name"], "--check", "--force")
        assert checked.returncode == 0 and json.loads(checked.stdout)["backup"] == kept[0]["name"], checked
        assert docker_exec(HEAD, "ls", "-A", "/var/lib/corectl/backup-staging").split() == []
        # another host key at that address (the head's own, as a host put in its place would show): refused
        impostor = " ".join(docker_exec(HEAD, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()[:2])
        docker_exec(HEAD, "sh", "-c", f"echo '{NET}.5 {impostor}' > /etc/corectl/backup-ssh/known_hosts")
        refused = exec_in(HEAD, "corectl-backup", "list")
        assert refused.returncode == 1 and "Host key verification failed" in refused.stderr, refused
    finally:
        cluster_yml.write_text(declared)
        corectl("provision", *args, "--limit", f"{P}head01", "--tags", "backup")
    assert exec_in(HEAD, "test", "-e", "/etc/corectl/backup-ssh").returncode == 1  # the key is gone with the host


def test_every_nodes_logs_reach_the_head_and_are_read_there_while_the_node_is_down(lab: Path):
    """Issue 29: each node's rsyslog forwards its journal to the head over TCP; `corectl logs NODE` reads the
    head's copy (named from the sender's address), also while the node is stopped: a line logged by a program,
    and an Xid from the stand-in's kernel log (gpu-sim puts each in the node's journal as a kernel line; an
    application Xid, 13, drains nothing)."""
    args = ("--inventory", str(lab))
    marker = f"e2e-logs-{uuid.uuid4().hex[:8]}"
    for container, node in ((DGX1, f"{P}dgx01"), (DGX2, f"{P}dgx02")):
        docker_exec(container, "logger", "-t", "e2e", f"{marker} from {node}")
    read = ("logs", f"{P}dgx02", *args, "--grep", marker)

    def dgx02_lines(*options: str) -> list[str]:
        return corectl("logs", f"{P}dgx02", *args, *options, check=False).stdout.splitlines()

    seen = wait_for(lambda: dgx02_lines("--grep", marker), lambda lines: len(lines) == 1, 90)
    assert seen[0].endswith(f" e2e: {marker} from {P}dgx02"), seen
    docker_exec(DGX2, "gpu-sim", "fault", "xid", "--gpu", "6", "--xid", "13")
    [xid] = docker_exec(DGX2, "gpu-sim", "kernel-log").splitlines()[-1:]
    assert xid.startswith("NVRM: Xid (PCI:") and ": 13, " in xid, xid
    # (that very line: other lines mention Xids too, such as Ansible's record of the health checker's settings)
    that_xid = ("--grep", re.escape(xid))
    kernel = wait_for(lambda: dgx02_lines(*that_xid), lambda lines: len(lines) == 1, 90)
    assert f" {P}dgx02 kernel" in kernel[0] and kernel[0].endswith(f": {xid}"), kernel
    before = slurmd_registered(f"{P}dgx02")
    subprocess.run(["docker", "stop", DGX2], capture_output=True, check=True)
    try:
        down = corectl(*read).stdout.splitlines()  # the node is down: its lines are on the head
        assert down == seen
        assert dgx02_lines(*that_xid) == kernel
        since = corectl("logs", f"{P}dgx01", *args, "--grep", marker, "--since", "10m").stdout.splitlines()
        assert len(since) == 1 and since[0].endswith(f" e2e: {marker} from {P}dgx01"), since
    finally:
        subprocess.run(["docker", "start", DGX2], capture_output=True, check=True)
        # back for the next test once its new slurmd has registered and it is idle
        wait_for(lambda: slurmd_registered(f"{P}dgx02"), lambda started: started != before, 240)
        wait_for(lambda: slurm_reason(f"{P}dgx02"), lambda reason: reason == "idle|none", 240)
    missing = corectl("logs", f"{P}nosuch", *args, check=False)
    assert missing.returncode == 2 and f"{P}nosuch is not a node of" in missing.stderr


def test_gpu_nodes_on_the_fabric_are_rdma_ready(lab: Path, container_image: str):
    packages = ["rdma-core", "ibverbs-utils", "infiniband-diags", "perftest"]
    states = "dpkg-query -W -f='${db:Status-Status}\\n' " + " ".join(packages) + " 2>/dev/null; true"
    for container in (DGX1, DGX2):
        assert docker_exec(container, "sh", "-c", states).split() == ["installed"] * 4
        assert docker_exec(container, "cat", "/etc/modules-load.d/corectl-gpudirect.conf").splitlines()[-1] == (
            "nvidia_peermem"
        )
    # the head node hangs off no leaf switch: none of it
    assert docker_exec(HEAD, "sh", "-c", states).split() == []
    module_file = subprocess.run(
        ["docker", "exec", HEAD, "test", "-e", "/etc/modules-load.d/corectl-gpudirect.conf"], check=False
    )
    assert module_file.returncode == 1
    # the health check finds nvidia-peermem loaded (gpu-sim's module list stands in for /proc/modules) ...
    passed = json.loads(docker_exec(DGX1, "corectl-health-check", "--json", "--only", "gpudirect"))
    assert [(c["name"], c["status"], c["message"]) for c in passed["checks"]] == [
        ("gpudirect", "pass", "nvidia_peermem loaded")
    ]
    # ... and fails against a module list without it (its own copy of the settings: Slurm's
    # periodic health program keeps reading the real list and leaves the node in service)
    without = (
        "set -e; { grep -v '^nvidia_peermem ' /var/lib/gpu-sim/modules || true; } > /run/e2e-modules;"
        " python3 -c \"import json; c = json.load(open('/etc/corectl/health.json'));"
        " c['modules_file'] = '/run/e2e-modules'; json.dump(c, open('/run/e2e-health.json', 'w'))\";"
        " corectl-health-check --config /run/e2e-health.json --json --only gpudirect || true"
    )
    failed = json.loads(docker_exec(DGX1, "sh", "-c", without))
    assert [(c["name"], c["status"]) for c in failed["checks"]] == [("gpudirect", "fail")], failed
    assert "nvidia_peermem not loaded" in failed["checks"][0]["message"], failed
    # the site's NCCL settings: in the environment of a bare job (corectl_job_env, the pyxis role's
    # SPANK plugin), a value the user set winning; in NCCL's own file for processes started outside
    # Slurm; and in the environment of a task in a pyxis container (enroot's environ.d; the node's
    # /etc is not inside the container)
    job_env = ["sh", "-c", "env | grep ^NCCL_ | sort"]
    bare = docker_exec(HEAD, "runuser", "-u", "alice", "--", "srun", f"--nodelist={P}dgx01", *job_env)
    assert bare.split() == NCCL, bare
    mine = docker_exec(
        HEAD, "runuser", "-u", "alice", "--", "env", "NCCL_SOCKET_IFNAME=ib0", "srun", f"--nodelist={P}dgx01", *job_env
    )  # fmt: skip
    assert mine.split() == [*NCCL[:-1], "NCCL_SOCKET_IFNAME=ib0"], mine
    assert docker_exec(DGX1, "cat", "/etc/nccl.conf").split() == NCCL
    printenv = ["sh", "-c", "env | grep ^NCCL_ | sort; test ! -e /etc/nccl.conf"]
    inside = docker_exec(
        HEAD, "runuser", "-u", "alice", "--", "srun", f"--nodelist={P}dgx02", f"--container-image={CONTAINER_IMAGE}",
        *printenv,
    )  # fmt: skip
    assert inside.split() == NCCL, inside
    assert docker_exec(DGX2, "cat", "/etc/enroot/environ.d/50-corectl-nccl.env").split() == NCCL
    # in a container the site's value wins unless the user names hers with pyxis's --container-env
    container = ["srun", f"--nodelist={P}dgx02", f"--container-image={CONTAINER_IMAGE}", *printenv]
    site_wins = docker_exec(HEAD, "runuser", "-u", "alice", "--", "env", "NCCL_SOCKET_IFNAME=ib0", *container)
    assert site_wins.split() == NCCL, site_wins
    container.insert(1, "--container-env=NCCL_SOCKET_IFNAME")
    mine = docker_exec(HEAD, "runuser", "-u", "alice", "--", "env", "NCCL_SOCKET_IFNAME=ib0", *container)
    assert mine.split() == [*NCCL[:-1], "NCCL_SOCKET_IFNAME=ib0"], mine


def test_drain_and_resume(lab: Path):
    head, args = f"corectl-{SITE}-{P}head01", ["--inventory", str(lab)]

    def state() -> str:
        return docker_exec(head, "sinfo", "--noheader", "--Node", "--nodes", f"{P}dgx01", "--format", "%t|%E").strip()

    def silences() -> list[tuple[str, str, str]]:
        """The active silences in Alertmanager on the head: (matchers, author, comment)."""
        out = docker_exec(head, "amtool", "--alertmanager.url=http://127.0.0.1:9093", "silence", "query", "-o", "json")
        return [
            (",".join(f"{m['name']}={m['value']}" for m in s["matchers"]), s["createdBy"], s["comment"])
            for s in json.loads(out or "[]")
        ]

    corectl("drain", f"{P}dgx01", "--reason", "e2e maintenance", *args)
    assert state() == "drain|e2e maintenance"
    assert silences() == [(f"node={P}dgx01", "corectl", "corectl drain: e2e maintenance")]  # issue 29
    again = corectl("drain", f"{P}dgx01", "--reason", "e2e maintenance", *args)
    assert runs(lab)[-1]["hosts"][f"{P}head01"]["changed"] == 0, again.stdout  # already drained, silenced: no-op
    assert len(silences()) == 1
    corectl("resume", f"{P}dgx01", *args)
    assert wait_for(state, lambda s: s == "idle|none", 60) == "idle|none"
    assert silences() == []
    refused = corectl("drain", f"{P}head01", "--reason", "x", *args, check=False)
    assert refused.returncode == 2
    assert f"not compute nodes of site {SITE}: {P}head01" in refused.stderr
    listing = corectl("runs", *args)
    assert f"drain {P}dgx01" in listing.stdout and f"resume {P}dgx01" in listing.stdout


def test_cephfs_is_shared_between_nodes(lab: Path):
    head, dgx = f"corectl-{SITE}-{P}head01", f"corectl-{SITE}-{P}dgx01"
    assert docker_exec(dgx, "findmnt", "--noheadings", "--output", "FSTYPE", "/shared").strip() == "fuse.ceph-fuse"
    docker_exec(head, "sh", "-c", "echo from-head > /shared/e2e-file && chown alice:research /shared/e2e-file")
    assert docker_exec(dgx, "stat", "--format", "%U %u", "/shared/e2e-file").strip() == "alice 20001"
    assert docker_exec(dgx, "cat", "/shared/e2e-file").strip() == "from-head"


def slurm_reason(node: str) -> str:
    return docker_exec(HEAD, "sinfo", "--noheader", "--Node", "--nodes", node, "--format", "%t|%E").strip()


def slurmd_registered(node: str) -> str:
    """When slurmctld last saw ``node``'s slurmd start (SlurmdStartTime). A node stopped and started again within
    slurmctld's timeouts is never marked down, and looks idle before its new slurmd has registered: a job started
    on it then waits in its prolog for good (seen under load). This changes once the new slurmd has registered."""
    shown = docker_exec(HEAD, "scontrol", "show", "node", node)
    found = re.search(r"SlurmdStartTime=(\S+)", shown)
    return found.group(1) if found else ""


def wait_for(what: Callable[[], T], predicate: Callable[[T], bool], timeout: float = 90.0) -> T:
    """Ask ``what`` until ``predicate`` holds of its answer, or until an answer asked for after ``timeout``
    seconds also fails it (on a loaded machine one docker exec can take longer than the whole timeout:
    an answer that began before the deadline never ends the wait)."""
    deadline = time.monotonic() + timeout
    while True:
        asked = time.monotonic()
        value = what()
        if predicate(value) or asked > deadline:
            return value
        time.sleep(2)


def health_report(lab: Path, *options: str) -> tuple[int, dict]:
    result = corectl("health", "--inventory", str(lab), "--json", *options, check=False)
    return result.returncode, json.loads(result.stdout)


def test_health_passes_on_every_compute_node(lab: Path):
    rc, report = wait_for(lambda: health_report(lab), lambda r: r[0] == 0)
    assert rc == 0, report
    # cluster.yml's health.thresholds reached the nodes' settings, over the role's default (300)
    assert json.loads(docker_exec(DGX1, "cat", "/etc/corectl/health.json"))["clock_unsynced_grace_s"] == 600
    assert sorted(report["nodes"]) == [f"{P}dgx01", f"{P}dgx02"]
    for node in report["nodes"].values():
        passed = {c["name"] for c in node["checks"] if c["status"] == "pass"}
        assert {"gpu-count", "driver-version", "fm-version", "fabric", "ecc", "xid", "nvlink", "ib", "mounts"} <= passed
    # status: idle nodes whose last health check passed are one host list, no row each (once both are idle: a node
    # Slurm has planned for a job that a test before this one left pending shows as planned until it starts)
    expected = ["2 nodes: 2 idle", f"idle and healthy (2): {P}dgx[01-02]"]

    def status_lines() -> list[str]:
        return corectl("status", "--inventory", str(lab)).stdout.splitlines()

    status = wait_for(status_lines, lambda lines: lines[:2] == expected)
    assert status[:2] == expected, status
    verdicts = last_verdicts(resolve_site(str(lab)))
    assert sorted(verdicts) == [f"{P}dgx01", f"{P}dgx02"]
    assert all(re.fullmatch(r"ok \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", v) for v in verdicts.values()), verdicts


def test_burn_in_runs_through_slurm_on_idle_and_drained_nodes_and_drains_a_slow_one(lab: Path):
    """Issue 33: burn-in runs all_reduce_perf (nccl-tests' stand-in) as Slurm jobs: on the idle dgx01 as an
    exclusive job; on dgx02, drained for a kept Xid (Slurm starts no job on a drained node), through a
    maintenance reservation of its own, with Slurm's health program holding its drain meanwhile; dgx02 is
    drained again with the reason it had and the reservation is gone. A node whose NCCL runs at a quarter of
    its bandwidth is drained with the figure in its reason."""
    args = ["--inventory", str(lab)]
    docker_exec(DGX2, "gpu-sim", "fault", "xid", "--gpu", "3", "--xid", "119")
    try:
        drain_by_health(DGX2, f"{P}dgx02", "xid")
        drained = slurm_reason(f"{P}dgx02")
        result = corectl("health", "--burn-in", *args)
        rows = {row[0]: row[1] for row in table_rows(result.stdout) if row[0].startswith(P)}
        assert rows == {f"{P}dgx01": "pass", f"{P}dgx02": "pass"}, result.stdout
        assert result.stdout.count("470.3 GB/s") == 2, result.stdout  # the checker's figure for each node
        assert slurm_reason(f"{P}dgx02") == drained  # drained again, for what it was drained for
        assert "corectl-burn-in" not in docker_exec(HEAD, "scontrol", "show", "reservation")
        # slurmctld's own record of each node's latest burn-in job (kept MinJobAge, 300 s, after it ended):
        # dgx02's completed while the node was drained before and after, which only its reservation allows
        # (deleting a reservation clears it from the jobs that ran in it, in slurmctld and in sacct alike)
        ran = {node: job["JobState"] for node, job in latest_jobs("corectl-burn-in").items()}
        assert ran == {f"{P}dgx01": "COMPLETED", f"{P}dgx02": "COMPLETED"}, ran
        # a slow node fails and is drained with its figure
        docker_exec(DGX1, "gpu-sim", "fault", "nccl-slow")
        slow = corectl("health", "--burn-in", *args, "--limit", f"{P}dgx01", check=False)
        assert slow.returncode == 1, slow.stdout
        assert (
            slurm_reason(f"{P}dgx01") == "drain|corectl burn-in: bus bandwidth 117.6 GB/s at 8 GiB < expected 450 GB/s"
        )
    finally:
        docker_exec(DGX1, "gpu-sim", "clear", "nccl-slow")
        docker_exec(
            DGX2, "sh", "-c", "gpu-sim clear xid && corectl-health-check --clear-sticky 'e2e: cleanup' >/dev/null"
        )
    corectl("resume", f"{P}dgx[01-02]", *args)
    for node in (f"{P}dgx01", f"{P}dgx02"):
        assert wait_for(lambda n=node: slurm_reason(n), lambda r: r == "idle|none", 90) == "idle|none"


VALIDATION = "corectl-validation"  # the validation jobs' name (role slurm's corectl-validate)


JOB_FIELDS = re.compile(r"(?:^| )(JobId|JobName|JobState|QOS|ReqNodeList)=(\S*)")
RUNNING_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED")


def latest_jobs(name: str, after: int = 0) -> dict[str, dict[str, str]]:
    """slurmctld's record (queued, running, or ended in the last MinJobAge, 300 s) of each node's latest job of
    this name with an id above ``after``: node -> JobId, JobState, QOS."""
    found: dict[str, dict[str, str]] = {}
    for line in docker_exec(HEAD, "scontrol", "show", "job", "--oneliner", check=False).splitlines():
        job = dict(JOB_FIELDS.findall(line))
        if job.get("JobName") == name and int(job["JobId"]) > after:
            node = job["ReqNodeList"]
            if int(job["JobId"]) > int(found.get(node, {}).get("JobId", 0)):
                found[node] = job
    return found


def highest_job_id() -> int:
    ids = re.findall(r"JobId=(\d+)", docker_exec(HEAD, "scontrol", "show", "job", "--oneliner", check=False))
    return max(map(int, ids), default=0)


def processes(container: str, pattern: str) -> list[str]:
    return docker_exec(container, "pgrep", "-a", "-f", pattern, check=False).splitlines()


def test_the_validation_timer_runs_jobs_of_the_validation_qos_and_drains_a_slow_node(lab: Path):
    """Issue 33: the controller's timer (its service started here, as the timer starts it) submits the health
    checker's dcgm-diag and nccl checks as Slurm jobs of the validation QOS to both idle DGX; dgx02, whose NCCL
    runs at a quarter of its bandwidth, is drained by its own job with the check and figure in the reason, and
    Slurm's health program leaves that drain alone; dgx01 passes and stays in service."""
    assert docker_exec(HEAD, "systemctl", "is-active", "corectl-validation.timer").strip() == "active"
    timer = docker_exec(HEAD, "systemctl", "cat", "corectl-validation.timer")
    assert "OnUnitActiveSec=1440min" in timer, timer  # cluster.yml health.validation.interval_min
    qos = docker_exec(HEAD, "sacctmgr", "--noheader", "--parsable2", "show", "qos", "format=name,preempt,preemptmode")
    rows = {line.split("|")[0]: line.split("|")[1:] for line in qos.split()}
    assert rows["validation"] == ["", "cancel"], qos
    assert all("validation" in preempt.split(",") for name, (preempt, _) in rows.items() if name != "validation")
    docker_exec(DGX2, "gpu-sim", "fault", "nccl-slow")
    before = highest_job_id()
    try:
        docker_exec(HEAD, "systemctl", "start", "corectl-validation.service")
        jobs = wait_for(
            lambda: latest_jobs(VALIDATION, before),
            lambda seen: len(seen) == 2 and all(j["JobState"] not in RUNNING_STATES for j in seen.values()),
            300,
        )
        ended = {node: (job["QOS"], job["JobState"]) for node, job in jobs.items()}
        assert ended == {f"{P}dgx01": ("validation", "COMPLETED"), f"{P}dgx02": ("validation", "FAILED")}, ended
        slow = "drain|corectl validation: nccl: bus bandwidth 117.6 GB/s at 8 GiB < expected 450 GB/s"
        assert slurm_reason(f"{P}dgx02") == slow
        assert slurm_reason(f"{P}dgx01") == "idle|none"
        assert run_hook(DGX2) == 0 and slurm_reason(f"{P}dgx02") == slow  # healthy to Slurm's program: still drained
    finally:
        docker_exec(DGX2, "gpu-sim", "clear", "nccl-slow")
    corectl("resume", f"{P}dgx02", "--inventory", str(lab))
    assert wait_for(lambda: slurm_reason(f"{P}dgx02"), lambda r: r == "idle|none", 90) == "idle|none"


def test_a_user_job_preempts_a_validation_job_and_finds_no_diagnostic_left(lab: Path):
    """Issue 33: `corectl validate-nodes` runs a round by hand; a user's job (QOS normal) submitted while the
    validation job's dcgmi diag runs preempts it: the validation job is cancelled, nothing of the diagnostic is
    left on the node when the user's job starts, and the node is not drained for it."""
    docker_exec(DGX1, "gpu-sim", "fault", "diag-slow")  # a diagnostic of minutes, as on real GPUs
    user_job = ""
    try:
        command = [CORECTL, "validate-nodes", f"{P}dgx01", "--inventory", str(lab)]
        before = highest_job_id()
        by_hand = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert wait_for(lambda: processes(DGX1, "dcgmi diag"), bool, 240), "no diagnostic started"
        [validating] = latest_jobs(VALIDATION, before).values()
        job = validating["JobId"]
        assert (validating["QOS"], validating["JobState"]) == ("validation", "RUNNING"), validating
        user_job = sbatch(f"--nodelist={P}dgx01", "--exclusive", "--gres=gpu:8", "--wrap", "sleep 600")
        assert wait_for(lambda: job_state(user_job), lambda s: s.startswith("RUNNING"), 120).startswith("RUNNING")
        assert processes(DGX1, "dcgmi diag") == []  # (Slurm's periodic health program never runs a diagnostic)
        out, _ = by_hand.communicate(timeout=300)
        CONSOLE.append(out)
        assert by_hand.returncode == 0, out  # preempted is no failure
        rows = {row[0]: row[1:3] for row in table_rows(out) if row[0].startswith(P)}
        assert rows == {f"{P}dgx01": ["preempted", job]}, out
        assert latest_jobs(VALIDATION, before)[f"{P}dgx01"]["JobState"] in ("PREEMPTED", "CANCELLED")
        assert slurm_reason(f"{P}dgx01") == "alloc|none"
    finally:
        docker_exec(DGX1, "gpu-sim", "clear", "diag-slow")
        if user_job:
            docker_exec(HEAD, "scancel", user_job)
    assert wait_for(lambda: slurm_reason(f"{P}dgx01"), lambda r: r == "idle|none", 90) == "idle|none"


HEALTH_HOOK = "/usr/local/sbin/corectl-node-health"  # Slurm's HealthCheckProgram on every compute node
SHARED_CLEAR = "gpu-sim clear"

# (fault injected, how to clear it, the check that must name it)
FAULTS = {
    "gpu-count": ("gpu-sim fault lost-gpu --gpu 3", SHARED_CLEAR),
    "ecc": ("gpu-sim fault ecc --gpu 1", SHARED_CLEAR),
    # a hardware Xid is kept on the node until heal or an operator ends it (corectl resume does this)
    "xid": ("gpu-sim fault xid --gpu 2", f"{SHARED_CLEAR} && corectl-health-check --clear-sticky 'e2e: cleared'"),
    "nvlink": ("gpu-sim fault nvlink-down --gpu 0", SHARED_CLEAR),
    "fabricmanager": ("systemctl stop nvidia-fabricmanager", "systemctl start nvidia-fabricmanager"),
    "fm-version": (
        "cp /usr/lib/gpu-sim/fm-version /root/fm-version && echo 580.82.07 > /usr/lib/gpu-sim/fm-version",
        "cp /root/fm-version /usr/lib/gpu-sim/fm-version",
    ),
    "temperature": ("gpu-sim fault hot --gpu 4", SHARED_CLEAR),
    "ib": ("gpu-sim fault ib-down", SHARED_CLEAR),
    "pcie": ("gpu-sim fault pcie-narrow --gpu 3", SHARED_CLEAR),
    # an uncorrectable memory error: counted until a boot, kept until ended
    "edac": ("gpu-sim fault edac-ue", "corectl-health-check --clear-sticky 'e2e: cleared'"),
    "mounts": ("umount /shared", "mount /shared"),
    # a data drive gone from the bus and another raising a SMART critical warning
    "nvme": ("gpu-sim fault nvme-missing --device nvme9 && gpu-sim fault nvme-warning --device nvme3", SHARED_CLEAR),
}
# Each round injects one fault on each compute node at once; fabricmanager is the case that waits
# for Slurm's own HealthCheckInterval (test_slurm_health_interval_drains_and_resumes).
ROUNDS = [
    ("gpu-count", "ecc"),
    ("xid", "nvlink"),
    ("fm-version", "temperature"),
    ("ib", "mounts"),
    ("pcie", "edac"),
    ("nvme", "gpu-count"),
]


def failed_checks(report: dict, node: str) -> list[str]:
    return [c["name"] for c in report["nodes"][node]["checks"] if c["status"] == "fail"]


def run_hook(container: str) -> int:
    """What slurmd runs every HealthCheckInterval, run now (same program, same node)."""
    return exec_in(container, HEALTH_HOOK).returncode


def hook_output(container: str) -> str:
    """What the health program says on the node now (for a failed assertion's message)."""
    done = exec_in(container, HEALTH_HOOK)
    return f"{container}: exit {done.returncode}\n{done.stdout}{done.stderr}"


def hook_until_passes(container: str, node: str, timeout: float) -> tuple[int, list[str]]:
    """Run the health program until it exits 0 (or ``timeout``); its last exit code and the Slurm
    state|reason after each run (a failed run drains the node with the failing check's name)."""
    seen: list[str] = []

    def once() -> int:
        rc = run_hook(container)
        seen.append(slurm_reason(node))
        return rc

    return wait_for(once, lambda rc: rc == 0, timeout), seen


@pytest.mark.parametrize("pair", ROUNDS, ids=["+".join(r) for r in ROUNDS])
def test_injected_faults_fail_health_and_drain_the_node(lab: Path, pair: tuple[str, str]):
    placed = dict(zip((f"{P}dgx01", f"{P}dgx02"), pair, strict=True))
    containers_of = {f"{P}dgx01": DGX1, f"{P}dgx02": DGX2}
    for node, check in placed.items():
        docker_exec(containers_of[node], "sh", "-c", FAULTS[check][0])
    try:
        rc, report = health_report(lab)
        assert rc == 1
        for node, check in placed.items():
            assert report["nodes"][node]["ok"] is False
            assert failed_checks(report, node)[:1] == [check], report["nodes"][node]
        # Slurm's health program drains each node with the failing check as the reason
        assert [run_hook(containers_of[node]) for node in placed] == [1, 1]
        for node, check in placed.items():
            state, reason = slurm_reason(node).split("|", 1)
            assert state == "drain", (node, state, reason)
            assert reason.startswith(f"corectl-health: {check}: "), (node, reason)
    finally:
        for node, check in placed.items():
            docker_exec(containers_of[node], "sh", "-c", FAULTS[check][1])
    # cleared: the next run of the health program resumes the nodes it drained (and slurmd, busy
    # with Slurm's own health runs on this 2-core machine, answers the controller's next ping)
    assert [run_hook(containers_of[node]) for node in placed] == [0, 0]
    for node in placed:
        assert wait_for(lambda n=node: slurm_reason(n), lambda r: r == "idle|none", 60) == "idle|none"


def test_slurm_health_interval_drains_and_resumes(lab: Path):
    """The one case that waits for slurmd's own HealthCheckInterval (30 s in the lab), both ways."""
    inject, clear = FAULTS["fabricmanager"]
    docker_exec(DGX1, "sh", "-c", inject)
    try:
        rc, report = health_report(lab)
        assert rc == 1
        assert report["nodes"][f"{P}dgx02"]["ok"] is True  # the healthy node stays healthy
        assert failed_checks(report, f"{P}dgx01")[:1] == ["fabricmanager"]
        # what an operator reads on an 80-column terminal: the summary, then the failing node, whole
        rc, shown = on_terminal([CORECTL, "health", "--inventory", str(lab)], columns=80)
        (ROOT / "build").mkdir(exist_ok=True)
        (ROOT / "build" / "health-80-columns.txt").write_text(shown)  # docs/operations.md shows it
        lines = shown.splitlines()
        assert rc == 1
        assert all(len(line.rstrip()) <= 80 for line in lines), lines
        summary = [line for line in lines if line.startswith("health: 2 nodes checked, 1 passed, 1 failed")]
        assert len(summary) == 1, lines
        assert any(re.match(rf"{P}dgx01 +fabricmanager: ", line) for line in lines), lines
        assert not any(line.startswith(f"{P}dgx02") for line in lines), lines
        state = wait_for(lambda: slurm_reason(f"{P}dgx01"), lambda r: r.startswith("drain|corectl-health: "), 90)
        assert state.startswith("drain|corectl-health: fabricmanager: "), state
        assert slurm_reason(f"{P}dgx02") == "idle|none"
    finally:
        docker_exec(DGX1, "sh", "-c", clear)
    assert wait_for(lambda: slurm_reason(f"{P}dgx01"), lambda r: r == "idle|none", 90) == "idle|none"


def test_a_hardware_xid_keeps_its_node_drained_through_the_log_window_and_a_reboot(lab: Path):
    """Issue 33: an Xid the catalog calls hardware (119, RESET_GPU) drains the node, and Slurm's own health
    program keeps it drained after the Xid has left the kernel log window (10 s here) and after a reboot; an
    application Xid (13) and an IGNORE one (63) drain nothing; corectl resume ends it and says what it ended."""
    config, kept, marker, seen = (
        "/etc/corectl/health.json",
        "/root/health.json.e2e",
        "/etc/corectl/health.d/00-e2e",
        "/run/e2e-hook-ran",
    )
    shorten = (
        f"import json; c = json.load(open('{config}')); c['xid_window_s'] = 10; json.dump(c, open('{config}', 'w'))"
    )
    docker_exec(DGX2, "cp", "-p", config, kept)
    docker_exec(DGX2, "python3", "-c", shorten)

    def slurm_ran_the_hook() -> None:
        """Wait for slurmd's own next run of the health program (a first script in its directory notes it)."""
        docker_exec(DGX2, "rm", "-f", seen)
        assert wait_for(lambda: docker_exec(DGX2, "cat", seen, check=False), bool, 120), "slurmd ran no health check"

    try:
        docker_exec(DGX2, "gpu-sim", "fault", "xid", "--gpu", "1", "--xid", "13")
        docker_exec(DGX2, "gpu-sim", "fault", "xid", "--gpu", "1", "--xid", "63")
        assert run_hook(DGX2) == 0, hook_output(DGX2)
        assert slurm_reason(f"{P}dgx02") == "idle|none"
        docker_exec(DGX2, "gpu-sim", "fault", "xid", "--gpu", "3", "--xid", "119")
        drain_by_health(DGX2, f"{P}dgx02", "xid")
        reason = slurm_reason(f"{P}dgx02")
        assert reason.startswith("drain|corectl-health: xid: XID 119 on PCI:0000:"), reason
        assert "RESET_GPU" in reason, reason
        # the Xid leaves the window; slurmd's own run of the health program keeps the node drained
        assert (
            wait_for(lambda: docker_exec(DGX2, "gpu-sim", "kernel-log", "--since", "10"), lambda log: log == "", 60)
            == ""
        )
        docker_exec(DGX2, "sh", "-c", f"printf '#!/bin/sh\\ndate +%s > {seen}\\n' > {marker} && chmod 0755 {marker}")
        slurm_ran_the_hook()
        assert slurm_reason(f"{P}dgx02") == reason
        # a reboot (a clean one: its CephFS client leaves, and the other node's /shared goes on): the kernel
        # log starts anew (gpu-sim-boot.service); the record does not
        before = booted_at(DGX2)
        exec_in(DGX2, "systemctl", "reboot")  # (its answer, if any, does not matter)
        assert wait_for(lambda: booted_at(DGX2), lambda now: now != before, 180) != before
        # (systemd answers before the boot's own units have run: gpu-sim-boot.service starts the log anew)
        booted = wait_for(lambda: docker_exec(DGX2, "systemctl", "is-active", "gpu-sim-boot", check=False).strip(),
                          lambda state: state == "active", 120)  # fmt: skip
        assert booted == "active"
        assert docker_exec(DGX2, "gpu-sim", "kernel-log") == ""
        # once the node is up (its Fabric Manager done), the program names the kept Xid again; slurmd runs it
        slurm_said = wait_for(lambda: hook_output(DGX2), lambda out: "xid: XID 119 on PCI:" in out, 120)
        assert "exit 1" in slurm_said, slurm_said
        slurm_ran_the_hook()
        assert slurm_reason(f"{P}dgx02") == reason
        # the operator ends it, and is told what ended
        resumed = corectl("resume", f"{P}dgx02", "--inventory", str(lab)).stdout
        assert f"{P}dgx02: cleared xid: XID 119 on PCI:0000:" in resumed, resumed
        assert run_hook(DGX2) == 0, hook_output(DGX2)
        assert wait_for(lambda: slurm_reason(f"{P}dgx02"), lambda r: r == "idle|none", 90) == "idle|none"
    finally:
        docker_exec(DGX2, "rm", "-f", marker)
        docker_exec(DGX2, "cp", "-p", kept, config)
        docker_exec(
            DGX2, "sh", "-c", "gpu-sim clear xid && corectl-health-check --clear-sticky 'e2e: cleanup' >/dev/null"
        )


def history_rows(text: str) -> list[str]:
    """`corectl history`'s rows, each whole (a row wrapped at 80 columns joined), spaces collapsed."""
    rows: list[str] = []
    for line in text.splitlines()[1:]:
        if re.match(r"\d{4}-\d\d-\d\d ", line) or not rows:
            rows.append(line.strip())
        else:
            rows[-1] += " " + line.strip()
    return [" ".join(row.split()) for row in rows]


def test_failure_history_names_the_repeat_offenders(lab: Path):
    """Every `corectl health` above was recorded, and every drain Slurm's health program made (read from
    Slurm's accounting): each fault round failed both nodes (a failing run, then the program's drain: one
    failure), the Slurm interval test failed e2e-dgx01 once more (fabricmanager: two runs and slurmd's own
    drain, one failure)."""
    history = history_rows(corectl("history", f"{P}dgx01", "--inventory", str(lab), "--last", "20").stdout)
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ"
    # the drain slurmd made in the interval test (ended when it passed again), and the runs that saw the fault:
    # slurmd's 30 s interval may fall before, between or after them, so the rows may come in any order
    drained = next(
        n for n, row in enumerate(history) if re.match(rf"{stamp} DRAIN corectl-health: fabricmanager: ", row)
    )
    assert re.search(r"\(root\(0\), until \S+ \S+\)$", history[drained]), history
    assert any(re.match(rf"{stamp} FAIL fabricmanager: ", row) for row in history), history
    data = json.loads(corectl("rma", "--inventory", str(lab), "--json").stdout)
    counts = {n["node"]: n["failures"] for n in data["nodes"]}
    assert counts[f"{P}dgx01"] >= len(ROUNDS) + 1 and counts[f"{P}dgx02"] >= len(ROUNDS), counts
    seen = {c["name"] for n in data["nodes"] if n["node"] == f"{P}dgx02" for e in n["evidence"] for c in e["checks"]}
    assert {pair[1] for pair in ROUNDS} <= seen
    drained = {
        d["reason"].split(":")[1].strip() for n in data["nodes"] if n["node"] == f"{P}dgx01" for d in n["drains"]
    }
    assert {pair[0] for pair in ROUNDS} <= drained, drained  # Slurm's program drained it in each round
    status = corectl("status", "--inventory", str(lab)).stdout.splitlines()
    # both nodes failed in every round; the list is by failures, most first
    assert status[-1].startswith("repeat offenders (>=3 failures in 7 days): "), status
    assert f"{P}dgx01 (" in status[-1], status


def test_a_drain_by_slurms_own_health_program_is_in_the_history_and_counts(lab: Path):
    """Issue 33: a drain no corectl command saw (slurmd's periodic run of the health program) reaches
    `corectl history` and `corectl rma` through Slurm's accounting; an operator's drain is shown but is
    no failure."""
    args = ["--inventory", str(lab)]
    before = json.loads(corectl("rma", *args, "--json", "--failures", "1").stdout)
    counted_before = {n["node"]: n["failures"] for n in before["nodes"]}.get(f"{P}dgx02", 0)
    inject, clear = FAULTS["temperature"]
    docker_exec(DGX2, "sh", "-c", inject)
    try:
        reason = wait_for(lambda: slurm_reason(f"{P}dgx02"), lambda r: r.startswith("drain|corectl-health: "), 120)
        assert reason.startswith("drain|corectl-health: temperature: "), reason
    finally:
        docker_exec(DGX2, "sh", "-c", clear)
    assert wait_for(lambda: slurm_reason(f"{P}dgx02"), lambda r: r == "idle|none", 120) == "idle|none"
    corectl("drain", f"{P}dgx02", *args, "--reason", "e2e: planned work")
    corectl("resume", f"{P}dgx02", *args)
    history = history_rows(corectl("history", f"{P}dgx02", *args, "--last", "3").stdout)
    assert re.match(r"\S+ \S+ DRAIN e2e: planned work \(root\(0\), until ", history[0]), history
    assert re.match(r"\S+ \S+ DRAIN corectl-health: temperature: GPU 4 at 95 C .*\(root\(0\), until ", history[1]), (
        history
    )
    after = json.loads(corectl("rma", *args, "--json", "--failures", "1").stdout)
    [node] = [n for n in after["nodes"] if n["node"] == f"{P}dgx02"]
    assert node["failures"] == counted_before + 1, (counted_before, node)  # slurmd's drain; not the operator's


def test_ib_errors_and_a_flapping_link_drain_the_node_until_resumed(lab: Path):
    """Issue 33: Slurm's health program compares each IB port's error counters with its last run: 1,000
    symbol errors more on dgx01's mlx5_3 and two link flaps on dgx02's mlx5_0 drain each node, naming the
    check and the port; they stay drained without a new error until corectl resume ends it."""
    for container in (DGX1, DGX2):
        assert run_hook(container) == 0, hook_output(container)  # a baseline of the counters
    docker_exec(DGX1, "gpu-sim", "fault", "ib-errors", "--device", "mlx5_3")
    docker_exec(DGX2, "gpu-sim", "fault", "ib-flap", "--device", "mlx5_0")
    try:
        for container in (DGX1, DGX2):
            assert run_hook(container) == 1
            assert run_hook(container) == 1  # no new error: still failing
        assert slurm_reason(f"{P}dgx01").startswith("drain|corectl-health: ib-errors: mlx5_3/1 symbol_error +1000 ")
        assert slurm_reason(f"{P}dgx02").startswith("drain|corectl-health: ib-errors: mlx5_0/1 went down 2 times ")
        resumed = corectl("resume", f"{P}dgx[01-02]", "--inventory", str(lab)).stdout
        assert f"{P}dgx01: cleared ib-errors: mlx5_3/1 symbol_error +1000 " in resumed, resumed
        assert f"{P}dgx02: cleared ib-errors: mlx5_0/1 went down 2 times " in resumed, resumed
    finally:
        for container in (DGX1, DGX2):
            docker_exec(container, "sh", "-c", "corectl-health-check --clear-sticky 'e2e: cleanup' >/dev/null")
    for node, container in ((f"{P}dgx01", DGX1), (f"{P}dgx02", DGX2)):
        assert run_hook(container) == 0, hook_output(container)
        assert wait_for(lambda n=node: slurm_reason(n), lambda r: r == "idle|none", 90) == "idle|none"


def booted_at(container: str) -> str:
    """When the node's systemd started (a container shares the host's boot_id; this changes).
    Right after a power on the node is still booting and systemd does not answer yet: wait."""
    argv = ["systemctl", "show", "--property=UserspaceTimestampMonotonic", "--value"]
    answer = wait_for(
        lambda: exec_in(container, *argv),
        lambda done: done.returncode == 0 and done.stdout.strip() not in ("", "0"),
        120,
    )
    assert answer.returncode == 0, answer.stderr
    return answer.stdout.strip()


def drain_by_health(container: str, node: str, check: str) -> None:
    assert run_hook(container) == 1
    state = slurm_reason(node)
    assert state.startswith(f"drain|corectl-health: {check}: "), state


def outcome_rows(text: str) -> dict[str, list[str]]:
    return {row[0]: row[1:] for row in table_rows(text) if row and row[0].startswith(P)}


@pytest.mark.second_lab
def test_heal_walks_the_ladders_and_power_goes_through_the_bmcs(lab: Path):
    """corectl heal on real faults: a restart, a reboot and a GPU reset heal; a node failing again soon
    after goes straight to hardware service; a GPU fallen off the bus survives a reboot and comes
    back with a power cycle through the (Redfish) BMC; a dead one is left for hardware service,
    alerted and in the RMA report. Then
    corectl power over both protocols: status, the running-job guard, and an IPMI power cycle
    after which the node is back in Slurm."""
    args = ["--inventory", str(lab)]
    # 1. Fabric Manager stopped on dgx01, an Xid 79 on dgx02: each is drained by Slurm's health program
    docker_exec(DGX1, "systemctl", "stop", "nvidia-fabricmanager")
    docker_exec(DGX2, "gpu-sim", "fault", "xid", "--gpu", "2", "--xid", "79")
    drain_by_health(DGX1, f"{P}dgx01", "fabricmanager")
    drain_by_health(DGX2, f"{P}dgx02", "xid")
    before = booted_at(DGX2)
    healed = corectl("heal", *args)
    rows = outcome_rows(healed.stdout)
    assert rows[f"{P}dgx01"] == ["resumed", "fabricmanager: the checks pass after restart-fabricmanager"], rows
    assert rows[f"{P}dgx02"] == [
        "resumed",
        "xid: the checks and validation (dcgmi diag -r 2, nccl) pass after reboot",
    ], rows
    assert booted_at(DGX2) != before  # the reboot really happened (and the kernel log began anew)
    for node in (f"{P}dgx01", f"{P}dgx02"):
        assert wait_for(lambda n=node: slurm_reason(n), lambda r: r == "idle|none", 90) == "idle|none"
    history = corectl("history", f"{P}dgx02", *args, "--last", "6").stdout
    assert "heal: reboot" in history and "heal: resumed" in history, history
    # before the reboot erased them, heal kept the node's kernel log and nvidia-bug-report.sh's report
    assert any(" heal: evidence ok: before reboot: " in row for row in history_rows(history)), history
    folder = sorted((lab / ".evidence").glob(f"*/{P}dgx02"))[-1]  # (the history names it; wrapped at 80 columns)
    assert "NVRM: Xid (PCI:0000:3a:00): 79, " in (folder / "kernel.log").read_text(), folder
    with gzip.open(folder / "nvidia-bug-report.log.gz", "rt") as report:
        assert report.readline().startswith("Start of NVIDIA bug report log file"), folder

    # 1b. a pending row remap on dgx02: a GPU reset (its clients stopped and started again) clears it
    docker_exec(DGX2, "gpu-sim", "fault", "ecc", "--gpu", "1")
    drain_by_health(DGX2, f"{P}dgx02", "ecc")
    before = booted_at(DGX2)
    reset = outcome_rows(corectl("heal", f"{P}dgx02", *args).stdout)
    assert reset == {
        f"{P}dgx02": ["resumed", "ecc: the checks and validation (dcgmi diag -r 2, nccl) pass after gpu-reset"]
    }, reset
    assert booted_at(DGX2) == before  # no reboot
    for unit in ("nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm", "dcgm-exporter"):
        assert docker_exec(DGX2, "systemctl", "is-active", unit).strip() == "active", unit
    assert wait_for(lambda: slurm_reason(f"{P}dgx02"), lambda r: r == "idle|none", 90) == "idle|none"

    # 2. the Xid again on dgx02 within the window after its heal: straight to hardware service
    docker_exec(DGX2, "gpu-sim", "fault", "xid", "--gpu", "2", "--xid", "79")
    try:
        drain_by_health(DGX2, f"{P}dgx02", "xid")
        again = corectl("heal", f"{P}dgx02", *args, check=False)
        assert again.returncode == 1
        row = outcome_rows(again.stdout)[f"{P}dgx02"]
        assert row == ["needs service", "xid: failed again within 24h of being healed of it"], row
        assert slurm_reason(f"{P}dgx02") == "drain|corectl: needs hardware service (xid)"
        assert booted_at(DGX2) == before  # no step was tried
    finally:
        docker_exec(DGX2, "gpu-sim", "clear", "xid")
    resumed = corectl("resume", f"{P}dgx02", *args).stdout
    assert f"{P}dgx02: cleared xid: XID 79 on PCI:0000:3a:00" in resumed, resumed  # the kept Xid ends too
    assert wait_for(lambda: slurm_reason(f"{P}dgx02"), lambda r: r == "idle|none", 90) == "idle|none"

    # 3. a GPU fallen off the bus on dgx01 stays lost through a reboot and comes back with a power
    # cycle through its Redfish BMC; no operator step
    docker_exec(DGX1, "gpu-sim", "fault", "lost-gpu", "--gpu", "5")
    group_vars = lab / "group_vars" / "all.yml"
    kept = group_vars.read_text()
    try:
        drain_by_health(DGX1, f"{P}dgx01", "gpu-count")
        before = booted_at(DGX1)
        healed = corectl("heal", f"{P}dgx01", *args)
        row = outcome_rows(healed.stdout)[f"{P}dgx01"]
        assert row == [
            "resumed",
            "gpu-count: the checks and validation (dcgmi diag -r 2, nccl) pass after power-cycle",
        ], row
        assert booted_at(DGX1) != before
        assert wait_for(lambda: slurm_reason(f"{P}dgx01"), lambda r: r == "idle|none", 90) == "idle|none"
        steps = corectl("history", f"{P}dgx01", *args, "--last", "12").stdout
        actions = [a for line in steps.splitlines() for a in re.findall(r"heal: [a-z -]+?(?=  )", line)]
        ladder = ["heal: resumed", "heal: power-cycle", "heal: evidence", "heal: reboot", "heal: evidence"]
        assert actions[:5] == ladder, steps

        # 3b. a dead GPU (the window off, or it would go straight to service) exhausts the ladder:
        # reboot, power cycle, left for hardware service, alerted, in the RMA report
        group_vars.write_text(kept + "corectl_heal_window_hours: 0\n")
        docker_exec(DGX1, "gpu-sim", "fault", "dead-gpu", "--gpu", "5")
        drain_by_health(DGX1, f"{P}dgx01", "gpu-count")
        stuck = corectl("heal", f"{P}dgx01", *args, check=False)
        assert stuck.returncode == 1, stuck.stdout + stuck.stderr
        row = outcome_rows(stuck.stdout)[f"{P}dgx01"]
        assert row == ["needs service", "gpu-count: still failing (gpu-count) after reboot, power-cycle"], row
        assert slurm_reason(f"{P}dgx01") == "drain|corectl: needs hardware service (gpu-count)"
        assert run_hook(DGX1) == 1  # the health program keeps failing, and keeps the service drain
        assert slurm_reason(f"{P}dgx01") == "drain|corectl: needs hardware service (gpu-count)"
        # Prometheus alerts on it: the controller's node states (read now rather than in a minute)
        docker_exec(HEAD, "systemctl", "start", "corectl-slurm-metrics.service")

        # (dgx02's alert of step 2 resolves once Prometheus has seen it resumed: wait for that state)
        def service_alerts() -> list[tuple[str, str, str]]:
            alerts = prometheus(HEAD, "/api/v1/alerts")["data"]["alerts"]
            fired = [a for a in alerts if a["labels"]["alertname"] == "NodeNeedsHardwareService"]
            return [(a["labels"]["slurm_node"], a["labels"]["check"], a["state"]) for a in fired]

        expected = [(f"{P}dgx01", "gpu-count", "firing")]
        assert wait_for(service_alerts, lambda fired: fired == expected) == expected
        # and the RMA report lists it with the heal's steps as evidence
        rma = json.loads(corectl("rma", *args, "--json").stdout)
        [case] = [n for n in rma["nodes"] if n["node"] == f"{P}dgx01"]
        assert {c["name"] for e in case["evidence"] for c in e["checks"]} >= {"fabricmanager", "gpu-count"}
        shown = {a["action"] for a in case["actions"]}
        assert {"heal: reboot", "heal: power-cycle", "heal: needs hardware service"} <= shown, case
    finally:
        group_vars.write_text(kept)
        docker_exec(DGX1, "gpu-sim", "clear", "all")
    # the GPU is replaced, and the node powered on again as after hardware service (a GPU back on the
    # bus joins the NVSwitch fabric, and gets persistence mode, only when the boot's daemons start)
    before = booted_at(DGX1)
    assert outcome_rows(corectl("power", "cycle", f"{P}dgx01", *args).stdout) == {f"{P}dgx01": ["on", "done"]}
    assert booted_at(DGX1) != before
    corectl("resume", f"{P}dgx01", *args)
    for node, container in ((f"{P}dgx01", DGX1), (f"{P}dgx02", DGX2)):
        assert wait_for(lambda n=node: slurm_reason(n), lambda r: r == "idle|none", 120) == "idle|none"
        # the health program passes (run now, not left to slurmd's next interval) and keeps it in
        # service. Seconds after a boot a check may still fail (chrony not yet synchronised to the
        # head; CI saw one failed run then a pass): the program drains for it and resumes the node
        # itself once it passes, which is what is asserted here.
        passed, seen = hook_until_passes(container, node, 120)
        assert passed == 0, f"{hook_output(container)}\nreasons seen: {seen}"
        assert wait_for(lambda n=node: slurm_reason(n), lambda r: r == "idle|none", 30) == "idle|none", seen
        assert run_hook(container) == 0, hook_output(container)
        assert slurm_reason(node) == "idle|none"
        if len(seen) > 1:
            print(f"{node}: the health program failed {len(seen) - 1} time(s) after the boot: {seen[:-1]}")

    # 4. corectl power: both protocols answer; a node with a job is not cut; an IPMI cycle
    status = outcome_rows(corectl("power", "status", f"{P}dgx[01-02]", *args).stdout)
    assert status == {f"{P}dgx01": ["on", "ok"], f"{P}dgx02": ["on", "ok"]}, status
    job = docker_exec(
        HEAD, "runuser", "-u", "alice", "--", "sbatch", "--parsable", f"--nodelist={P}dgx02", "--chdir=/tmp",
        "--output=/dev/null", "--wrap", "sleep 600",
    ).strip()  # fmt: skip
    try:
        wait_for(lambda: docker_exec(HEAD, "squeue", "-h", "-j", job, "-o", "%T").strip(), lambda s: s == "RUNNING")
        refused = corectl("power", "cycle", f"{P}dgx02", *args, check=False)
        assert refused.returncode == 1
        assert f"power cycle refused: {P}dgx02 runs job {job}; drain first, or use --force" in refused.stderr
        assert docker_exec(HEAD, "squeue", "-h", "-j", job, "-o", "%T").strip() == "RUNNING"
    finally:
        docker_exec(HEAD, "scancel", job)
    wait_for(lambda: docker_exec(HEAD, "squeue", "-h", "-w", f"{P}dgx02").strip(), lambda s: s == "")
    before = booted_at(DGX2)
    cycled = outcome_rows(corectl("power", "cycle", f"{P}dgx02", *args).stdout)
    assert cycled == {f"{P}dgx02": ["on", "done"]}, cycled
    assert booted_at(DGX2) != before
    assert wait_for(lambda: slurm_reason(f"{P}dgx02"), lambda r: r == "idle|none", 120) == "idle|none"
    assert wait_for(lambda: health_report(lab, "--limit", f"{P}dgx02"), lambda r: r[0] == 0)[0] == 0


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


def job_end(job: str) -> tuple[str, str, int]:
    """(state, exit code, end time; 0 while it runs) of a job, from Slurm's accounting."""
    sacct = docker_exec(HEAD, "sh", "-c", f"SLURM_TIME_FORMAT=%s sacct -X -n -P -j {job} -o State,ExitCode,End")
    state, exit_code, end = sacct.strip().split("|")
    return state, exit_code, int(end) if end.isdigit() else 0


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


def slurmd_started(container: str) -> str:
    return docker_exec(container, "systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "--value", "slurmd")


# A small job on dgx01 that lives through add-node and remove-node of dgx03: it waits until dgx03
# joins Slurm, then until it has left, and ends with exit 0 (the restarts in between keep it).
THROUGH_JOB = (
    f"until sinfo -h -N -n {P}dgx03 -o %N 2>/dev/null | grep -q .; do sleep 1; done; "
    f"until ! sinfo -h -N -n {P}dgx03 -o %N 2>/dev/null | grep -q .; do sleep 1; done"
)


def assert_provision_changes_nothing(lab: Path, hosts: set[str]) -> None:
    """A full provision: every host converged (the site playbook is idempotent, and the command
    before this one left nothing for it to do)."""
    result = corectl("provision", "--inventory", str(lab))
    record = runs(lab)[-1]
    assert record["command"] == "provision" and set(record["hosts"]) == hosts
    assert record["status"] == "successful", result.stdout
    changed = {host: stats["changed"] for host, stats in record["hosts"].items() if stats["changed"]}
    assert changed == {}, (changed, result.stdout)


@dataclass(frozen=True)
class AddedNode:
    """What adding e2e-dgx03 printed and what was there before it."""

    job: str  # a job on e2e-dgx01 that runs through add-node and remove-node
    slurmd_before: list[str]  # the existing compute nodes' slurmd start times
    lab_add: str  # corectl lab add's output
    known_before: str  # known_hosts before
    add_node: str  # corectl add-node's output


@pytest.fixture(scope="module")
def added_node(lab: Path) -> AddedNode:
    """e2e-dgx03, a fresh machine (no corectl key, host key unknown, an admin user with a password
    and sudo), added with corectl add-node (bootstrap included) while a job runs on e2e-dgx01; the
    add-node test checks what that did, the remove-node test removes the node."""
    args = ["--inventory", str(lab)]
    before = [slurmd_started(c) for c in (f"corectl-{SITE}-{P}dgx01", f"corectl-{SITE}-{P}dgx02")]
    job = docker_exec(
        HEAD, "runuser", "-u", "alice", "--", "sbatch", "--parsable", f"--nodelist={P}dgx01", "--ntasks=1",
        "--mem=64", "--time=30", "--chdir=/tmp", "--output=/dev/null", "--wrap", THROUGH_JOB,
    ).strip()  # fmt: skip
    started = corectl("lab", "add", *args, "--bare").stdout
    known = (lab / "known_hosts").read_text()
    options = ["--address", f"{NET}.13", "--profile", "dgx-standin", "--leaf", "leaf1"]
    options += ["--ssh-host", "127.0.0.1", "--ssh-port", str(PORT_BASE + 3)]
    options += ["--bootstrap-user", "dgxadmin", "--password-env", "E2E_ADMIN_PASSWORD", "--yes"]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("E2E_ADMIN_PASSWORD", (lab / ".lab" / f"{P}dgx03.password").read_text().strip())
        # the vault password from the environment too, as an operator may give it (it must not be kept)
        env.setenv("CORECTL_VAULT_PASSWORD", (lab / ".vault-pass").read_text().strip())
        added = corectl("add-node", f"{P}dgx03", *args, *options).stdout
    return AddedNode(job=job, slurmd_before=before, lab_add=started, known_before=known, add_node=added)


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


# Hand-made drift on one converged node, and the task that must repair each (docs/performance.md:
# the fast paths that skip modules on a converged node must still see every one of these).
DRIFT = [
    (["sh", "-c", "echo 'ENROOT_ROOTFS_WRITABLE yes' >> /etc/enroot/enroot.conf"], "enroot: /etc/enroot/enroot.conf"),
    (["systemctl", "stop", "prometheus-node-exporter"], "node_exporter: Enable and start node_exporter"),
    (["chmod", "0644", "/etc/munge/munge.key"], "munge: Install the cluster's munge key"),
    (["userdel", "alice"], "users: Create users"),
    (
        ["sed", "-i", "/pam_slurm_adopt/d", "/etc/pam.d/sshd"],
        "pam_slurm_adopt: Put pam_access and pam_slurm_adopt in sshd's account stack",
    ),
]


def test_provision_repairs_drift_and_reports_exactly_what_it_repaired(lab: Path):
    from corectl.commands.provision import changes_from

    for argv, _ in DRIFT:
        docker_exec(DGX1, *argv)
    assert docker_exec(DGX1, "systemctl", "is-active", "prometheus-node-exporter", check=False).strip() == "inactive"
    corectl("provision", "--inventory", str(lab))
    run_dir = sorted((lab / ".runs").glob("*/corectl.json"))[-1].parent
    events = [json.loads(path.read_text()) for path in sorted((run_dir / "job_events").glob("*.json"))]
    expected = [task for _, task in DRIFT] + ["munge: Restart munge"]  # the handler of the key's mode
    assert {host: sorted(tasks) for host, tasks in changes_from(events).items()} == {f"{P}dgx01": sorted(expected)}
    # and the node is as declared again
    assert docker_exec(DGX1, "systemctl", "is-active", "prometheus-node-exporter").strip() == "active"
    assert docker_exec(DGX1, "stat", "-c", "%a %U", "/etc/munge/munge.key").split() == ["400", "munge"]
    assert docker_exec(DGX1, "id", "-u", "alice").strip() == "20001"
    assert "ENROOT_ROOTFS_WRITABLE yes" not in docker_exec(DGX1, "cat", "/etc/enroot/enroot.conf")
    assert "pam_slurm_adopt.so" in docker_exec(DGX1, "cat", "/etc/pam.d/sshd")


def test_limit_check_and_diff_pass_through(lab: Path):
    options = ["--limit", f"{P}dgx01", "--check", "--diff", "--tags", "base"]
    result = corectl("provision", "--inventory", str(lab), *options)
    assert "changed=0 failed=0 hosts=1" in result.stdout
    record = runs(lab)[-1]
    assert list(record["hosts"]) == [f"{P}dgx01"]
    assert record["check"] is True
    assert record["limit"] == f"{P}dgx01"


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
        result = corectl("provision", "--inventory", str(lab), "--limit", f"{P}dgx01", check=False)
    finally:
        known.write_text(original)
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line == (
        f"error: provision failed (unreachable: {P}dgx01); "
        f"retry just those: corectl provision --inventory {lab} --limit {P}dgx01"
    )
    unreachable = [ln for ln in result.stdout.splitlines() if ln.startswith(f"unreachable {P}dgx01: ")]
    # (the first task that connects: facts may come from the fact cache)
    assert len(unreachable) == 1, result.stdout
    # SSH's own line under Ansible's strategy; Mitogen words it itself (CORECTL_ACCELERATOR=mitogen)
    mitogen = r"Task failed: Host key checking is enabled, and SSH reported an unrecognized or mismatching host key\."
    reason = rf"(Host key verification failed\.|{mitogen})"
    assert re.fullmatch(rf"unreachable {P}dgx01: [^:]+: {reason}", unreachable[0]), unreachable[0]
    assert runs(lab)[-1]["hosts"][f"{P}dgx01"]["unreachable"] == 1


def lock_holder(site: Path) -> dict:
    """The holder named in the site's lock file ({} while nobody holds it)."""
    text = (site / ".lock").read_text() if (site / ".lock").exists() else ""
    return json.loads(text) if text.strip() else {}


def hosts_reached(run_dir: Path) -> set[str]:
    """Hosts with a task result so far in a run's live events."""
    hosts = set()
    for path in (run_dir / "job_events").glob("*.json"):
        if path.name.endswith("-partial.json"):  # written by Ansible's callback before corectl has seen it
            continue
        try:
            event = json.loads(path.read_text())
        except (OSError, ValueError):  # being written
            continue
        kind = event.get("event", "")
        # runner_on_start only says a task began on the host; a result is ok/failed/skipped/...
        if kind.startswith("runner_on_") and kind != "runner_on_start" and event.get("event_data", {}).get("host"):
            hosts.add(event["event_data"]["host"])
    return hosts


def site_files(site: Path) -> dict[str, tuple[bytes, int]]:
    return {
        name: ((site / name).read_bytes(), (site / name).stat().st_mtime_ns) for name in ("cluster.yml", "hosts.yml")
    }


def test_one_changing_command_per_site_and_ctrl_c_cancels_cleanly(lab: Path):
    before = {path.parent for path in (lab / ".runs").glob("*/corectl.json")}
    args = ["--inventory", str(lab)]
    proc = subprocess.Popen([CORECTL, "provision", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    holder = wait_for(lambda: lock_holder(lab), lambda h: bool(h.get("run")), 60)
    assert holder["command"] == f"provision --inventory {lab}" and holder["pid"] == proc.pid
    everyone = {f"{P}head01", f"{P}dgx01", f"{P}dgx02"}
    assert wait_for(lambda: hosts_reached(Path(holder["run"])), lambda h: h == everyone, 60) == everyone
    files = site_files(lab)
    # a second provision and an add-node are refused at once, naming the holder; nothing is touched
    for command in (["provision"], ["add-node", f"{P}dgx09", "--address", f"{NET}.19", "--profile", "dgx-standin"]):
        refused = corectl(*command, *args, check=False)
        assert refused.returncode == 75, refused.stderr
        [line] = refused.stderr.splitlines()
        assert line.startswith(f"error: site {SITE} is busy: `corectl provision --inventory {lab}` by root@"), line
        assert f"(pid {proc.pid}, since {holder['started']}, run {holder['run']})" in line, line
    assert site_files(lab) == files
    # Ctrl-C: the run stops cleanly and still reports every host it reached
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    # exactly one new run record (older ones may have been pruned: 30 are kept), from the first provision
    new = [path.parent for path in (lab / ".runs").glob("*/corectl.json") if path.parent not in before]
    assert [str(path) for path in new] == [holder["run"]]
    record = json.loads((new[0] / "corectl.json").read_text())
    assert record["status"] == "canceled"
    assert set(record["hosts"]) == {f"{P}head01", f"{P}dgx01", f"{P}dgx02"}
    summary = [row[0] for row in table_rows(out) if len(row) == 6]
    assert summary == [f"{P}dgx01", f"{P}dgx02", f"{P}head01"], out
    assert lock_holder(lab) == {}  # released


def test_a_killed_provision_leaves_no_secret_and_the_next_one_converges(lab: Path, tmp_path: Path):
    """SIGKILL (no clean-up at all) at a random point of a provision: the private directory it
    leaves holds no secret, the lock is taken over, and the next provision changes nothing."""
    # the point is counted in events, not seconds: a converged provision of this lab writes ~1,500,
    # and a delay in seconds could outlast the whole run (the kill then finds nothing to kill)
    point = random.Random().randint(20, 700)
    print(f"killing the provision after {point} of its events")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [CORECTL, "provision", "--inventory", str(lab)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    holder = wait_for(lambda: lock_holder(lab), lambda h: bool(h.get("run")), 60)
    events = Path(holder["run"]) / "job_events"
    wait_for(lambda: hosts_reached(Path(holder["run"])), bool, 60)
    wait_for(lambda: len(list(events.glob("*.json"))), lambda n: n >= point or proc.poll() is not None, 300)
    assert proc.poll() is None, "the provision ended before the kill"
    proc.kill()
    proc.wait(timeout=30)

    def playbooks_left() -> str:
        ps = subprocess.run(["pgrep", "-af", "ansible-playbook"], capture_output=True, text=True, check=False)
        return "\n".join(line for line in ps.stdout.splitlines() if str(lab) in line or str(tmp_path) in line)

    # ansible-playbook ignores the pty's SIGHUP; the runner's guard (PR_SET_PDEATHSIG) stops it
    assert wait_for(playbooks_left, lambda out: out == "", 30) == ""
    left = [path for path in tmp_path.rglob("*") if path.is_file()]
    vault_password = (lab / ".vault-pass").read_bytes().strip()
    assert [path for path in left if vault_password in path.read_bytes()] == []
    [script] = [path for path in left if path.name == "vault-pass"]  # the client script, and nobody to answer it
    assert subprocess.run([str(script)], capture_output=True, check=False).returncode != 0
    assert_provision_changes_nothing(lab, {f"{P}head01", f"{P}dgx01", f"{P}dgx02"})


def test_a_stale_lock_is_taken_over_with_a_warning(lab: Path):
    # what a corectl killed with SIGKILL leaves: its record, without the (kernel-held) lock
    stale = {"command": "upgrade drivers", "user": "root", "host": "elsewhere", "pid": 999999,
             "started": "2026-01-01T00:00:00+00:00", "run": ""}  # fmt: skip
    (lab / ".lock").write_text(json.dumps(stale) + "\n")
    result = corectl("render", "--inventory", str(lab))
    assert result.stderr.splitlines() == [
        f"warning: taking over the lock of site {SITE} left by `corectl upgrade drivers` by root@elsewhere "
        "(pid 999999, since 2026-01-01T00:00:00+00:00), which no longer holds it"
    ]
    assert lock_holder(lab) == {}


RUNNER1, RUNNER2 = (f"corectl-{SITE}-{P}runner{i}" for i in (1, 2))


def jobs_on(container: str) -> list[str]:
    """What a runner holds of corectl's jobs: worker directories and Ansible processes."""
    look = "ls -d /dev/shm/corectl-job-* 2>/dev/null; pgrep -fa '[a]nsible-'"
    return docker_exec(container, "sh", "-c", look, check=False).split("\n")[:-1]


def start_provision(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([CORECTL, "provision", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def gathered(run_dir: Path) -> set[str]:
    """Hosts whose facts a run gathered (not taken from the fact cache), from its job events."""
    hosts = set()
    for path in run_dir.rglob("*.json"):
        if path.parent.name == "job_events" and not path.name.endswith("-partial.json"):
            event = json.loads(path.read_text())
            if event.get("event") == "runner_on_ok" and event["event_data"].get("task") == "Gathering Facts":
                hosts.add(event["event_data"]["host"])
    return hosts


def fanned_run_started(lab: Path, shard: str, proc: subprocess.Popen[str]) -> Path:
    """The run directory, once ``shard`` has its first task result (its job runs on the runner)."""
    holder = wait_for(lambda: lock_holder(lab), lambda h: bool(h.get("run")) or proc.poll() is not None, 120)
    run_dir = Path(holder["run"])
    events = run_dir / "shards" / shard / "artifacts" / "job_events"
    wait_for(lambda: len(list(events.glob("*.json"))), lambda n: n > 20 or proc.poll() is not None, 300)
    assert proc.poll() is None, proc.communicate()
    return run_dir


def done_jobs(*jobs: str) -> list[str]:
    """`JobID|Account|QOS|State` of each ended job as the accounting database has it (sacct)."""
    out = docker_exec(HEAD, "sacct", "-X", "-n", "-P", "-o", "JobID,Account,QOS,State", "-j", ",".join(jobs))
    return sorted(out.split())


def vision_usage() -> int:
    line = docker_exec(HEAD, "sshare", "--noheader", "--parsable2", "--accounts=vision", "--format=RawUsage")
    return int(line.splitlines()[0])


@pytest.mark.second_lab
def test_a_head_whose_disk_died_is_restored_from_its_backup(lab: Path):
    """Issue 34: jobs run, a backup is taken (to CephFS), more jobs run; the head's machine goes with its disk. A
    blank one with its name and address is bootstrapped and provisioned: slurmctld stays stopped (no saved state on
    a site that has run before) and the provision says so. `corectl restore` then brings every job up to the backup
    back with its id, account and QOS, and the fair-share usage as it was; jobs run again; a provision after it
    changes nothing; a corrupted backup is refused with one line."""
    args = ("--inventory", str(lab))
    run = ("--account=vision", "--gres=gpu:2", "--wrap", "sleep 3")
    kept = [sbatch("--wait", "--qos=high", *run), sbatch("--wait", *run)]  # --wait: sbatch returns when it ended
    wait_for(lambda: done_jobs(*kept), lambda rows: len(rows) == 2 and all("|COMPLETED" in r for r in rows), 60)
    # slurmctld keeps fair-share usage in its state files (not in the database), saved every 5 minutes and when it
    # stops: a restart puts the usage of the jobs above in them now
    docker_exec(HEAD, "systemctl", "restart", "slurmctld")
    wait_for(lambda: docker_exec(HEAD, "scontrol", "ping", check=False), lambda said: "is UP" in said, 60)
    before = {"jobs": done_jobs(*kept), "usage": vision_usage()}
    assert before["jobs"] == [f"{kept[0]}|vision|high|COMPLETED", f"{kept[1]}|vision|normal|COMPLETED"]
    # what Prometheus knew just before the backup: each node exporter's `up` (the backup snapshots its data)
    then = f"{time.time():.0f}"

    def up_then() -> list[str]:
        try:
            answer = prometheus(HEAD, f"/api/v1/query?query=up%7Bjob%3D%22node%22%7D&time={then}")
        except subprocess.CalledProcessError:  # Prometheus starting
            return ["(no answer)"]
        return sorted(r["metric"]["instance"] for r in answer["data"]["result"])

    before["up"] = wait_for(up_then, lambda up: len(up) >= 3, 90)
    [backup] = json.loads(corectl("backup", *args, "--json").stdout)
    lost = sbatch("--wait", "--account=vision", "--gres=gpu:4", "--wrap", "sleep 10")  # after the backup: not in it
    wait_for(lambda: done_jobs(lost), lambda rows: rows == [f"{lost}|vision|normal|COMPLETED"], 60)
    assert wait_for(vision_usage, lambda now: now > before["usage"] * 1.05, 60) > before["usage"]

    # the head's machine and disk are gone; a blank one takes its name and address
    corectl("lab", "replace", f"{P}head01", *args)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("E2E_HEAD_PASSWORD", (lab / ".lab" / f"{P}head01.password").read_text().strip())
        corectl("bootstrap", *args, f"{P}head01", "--user", "dgxadmin", "--password-env", "E2E_HEAD_PASSWORD", "--yes")
    held = corectl("provision", *args, "--limit", f"{P}head01", check=False)
    assert held.returncode == 1, held.stdout
    assert "slurmctld is kept stopped: its state directory holds no saved state" in held.stdout + held.stderr
    assert docker_exec(HEAD, "systemctl", "is-active", "slurmctld", check=False).strip() == "inactive"
    assert docker_exec(HEAD, "systemctl", "is-enabled", "slurmctld", check=False).strip() == "disabled"

    # the new head's Prometheus knows nothing of that time
    assert wait_for(up_then, lambda up: up != ["(no answer)"], 60) == []
    restored = corectl("restore", *args).stdout
    assert f"restored backup {backup['name']} (taken " in restored, restored
    assert wait_for(up_then, lambda up: up == before["up"], 90) == before["up"]  # Prometheus's data is back
    assert done_jobs(*kept, lost) == before["jobs"]  # the jobs up to the backup, as they were; not the later one
    usage = vision_usage()  # fair-share usage decays (half-life of days): within 1 % of the backup's
    assert abs(usage - before["usage"]) <= before["usage"] / 100, (usage, before["usage"])
    again = sbatch("--wait", *run)
    wait_for(lambda: done_jobs(again), lambda rows: rows == [f"{again}|vision|normal|COMPLETED"], 60)
    corectl("provision", *args)
    assert set(last_run_changes(lab).values()) == {0}, changes_shown(lab)

    # a backup that does not verify is refused, with one line, and nothing is stopped
    newest = f"/shared/corectl-backups/{backup['name']}/slurmctld-state.tar.gz"
    docker_exec(HEAD, "sh", "-c", f"printf X | dd of={newest} bs=1 seek=30 conv=notrunc status=none")
    refused = corectl("restore", *args, "--backup", backup["name"], check=False)
    assert refused.returncode == 1, refused.stdout
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: backup {backup['name']} does not verify (corrupt: slurmctld-state.tar.gz does not match its "
        "checksum): nothing restored"
    )
    assert docker_exec(HEAD, "systemctl", "is-active", "slurmctld").strip() == "active"


@pytest.mark.second_lab
def test_runners_fan_a_provision_out_and_a_shard_fails_alone(lab: Path):
    """Issue 15: two runner stand-ins each provision half of a lab of head + 4 DGX (a rack each)."""
    args = ["--inventory", str(lab)]
    original = (lab / "cluster.yml").read_text()
    options = ["--nodes", "4", "--subnet", SUBNET, "--ssh-port-base", str(PORT_BASE), "--prefix", P]
    every = {f"{P}head01", *(f"{P}dgx0{i}" for i in range(1, 5))}
    try:
        # lab up rewrites the site's group_vars and host_vars too: keep what earlier tests set there
        # (the rolling upgrade's nvidia_driver_version)
        kept = {path: path.read_text() for path in [*lab.glob("group_vars/*.yml"), *lab.glob("host_vars/*.yml")]}
        corectl("lab", "up", *args, *options, "--runners", "2")
        for path, text in kept.items():
            path.write_text(text)
        corectl("runners", "bootstrap", *args)
        # two more DGX: the runners provision them (and the converged rest) from scratch
        first = corectl("provision", *args)
        record = runs(lab)[-1]
        assert record["status"] == "successful", first.stdout
        assert set(record["hosts"]) == every
        assert [(s["name"], s["runner"], s["hosts"], s["groups"], s["status"]) for s in record["shards"]] == [
            ("services", f"{P}runner1", [f"{P}head01"], [], "successful"),
            (f"{P}runner1-1", f"{P}runner1", [f"{P}dgx01", f"{P}dgx03"], ["rack-rack1", "rack-rack3"], "successful"),
            (f"{P}runner2-1", f"{P}runner2", [f"{P}dgx02", f"{P}dgx04"], ["rack-rack2", "rack-rack4"], "successful"),
        ]
        assert record["hosts"][f"{P}dgx04"]["changed"] > 50, record["hosts"]  # a fresh node, made whole
        assert f"shard {P}runner2-1 (rack-rack2, rack-rack4) on runner {P}runner2: successful, 2 hosts" in first.stdout
        assert docker_exec(HEAD, "srun", f"--nodelist={P}dgx04", "hostname").strip() == f"{P}dgx04"

        # the same result as a run from this host: nothing changed, the same tasks on each host,
        # but for fact gathering (the runners' fact caches and this host's differ in age)
        single = corectl("provision", *args, "--local")
        single_dir = lab / ".runs" / sorted(p.parent.name for p in (lab / ".runs").glob("*/corectl.json"))[-1]
        reference = runs(lab)[-1]
        assert "shards" not in reference, single.stdout
        assert reference["status"] == "successful" and not any(h["changed"] for h in reference["hosts"].values())
        fanned = corectl("provision", *args)
        record = runs(lab)[-1]
        assert record["status"] == "successful", fanned.stdout
        counts = ("ok", "changed", "failed", "unreachable")
        fanned_dir = lab / ".runs" / sorted(p.parent.name for p in (lab / ".runs").glob("*/corectl.json"))[-1]
        extra = {h: int(h in gathered(fanned_dir)) - int(h in gathered(single_dir)) for h in record["hosts"]}
        assert {h: [s[k] - (extra[h] if k == "ok" else 0) for k in counts] for h, s in record["hosts"].items()} == {
            h: [s[k] for k in counts] for h, s in reference["hosts"].items()
        }, (record["hosts"], reference["hosts"], extra)
        assert set(record["hosts"]) == every
        # nothing of the jobs stays on the runners (a job's ssh-agent sees its parent gone within 10 s)
        for runner in (RUNNER1, RUNNER2):
            assert wait_for(lambda r=runner: jobs_on(r), lambda left: left == [], 30) == []
        # corectl runs tells the shards apart
        shown = corectl("runs", *args, "--show", "last").stdout
        assert f"shard {P}runner2-1 on runner {P}runner2: successful, {P}dgx[02,04]" in shown, shown
        # health and the driver upgrade go through the runners too; health's reports travel in
        # the event stream (the new nodes' clocks may take a moment to sync: retried)
        rc, report = wait_for(lambda: health_report(lab), lambda r: r[0] == 0, 240)
        assert rc == 0 and sorted(report["nodes"]) == sorted(every - {f"{P}head01"}), report
        record = runs(lab)[-1]
        assert record["command"] == "health" and [s["name"] for s in record["shards"]] == [
            f"{P}runner1-1",
            f"{P}runner2-1",
        ]
        burn = corectl("health", "--burn-in", *args).stdout  # each node's all_reduce_perf, a Slurm job
        rows = {row[0]: row[1] for row in table_rows(burn) if row[0].startswith(P)}
        assert rows == {f"{P}dgx0{i}": "pass" for i in range(1, 5)}, burn
        assert burn.count("bus bandwidth 470.3 GB/s at 8 GiB") == 4, burn  # the checker's figure for each node
        assert len(runs(lab)[-1]["shards"]) == 2
        # issue 33, validation's pairwise round, run by its own timer's service (started here as the timer starts
        # it) over the idle nodes, at most max_nodes (3) of them, dgx03's NCCL at a quarter: the checker's
        # nccl-pair (all_reduce_perf across two nodes through srun) as two-node jobs of the validation QOS; dgx01
        # and dgx02 pass together, dgx03 then fails with dgx01 (known good) and is the only node drained
        docker_exec(DGX3, "gpu-sim", "fault", "nccl-slow")
        try:
            assert docker_exec(HEAD, "systemctl", "is-active", "corectl-validation-pairs.timer").strip() == "active"
            service = "corectl-validation-pairs.service"

            def unit() -> dict[str, str]:
                shown = docker_exec(
                    HEAD,
                    "systemctl",
                    "show",
                    "--property=ExecMainExitTimestampMonotonic",
                    "--property=ActiveState",
                    "--property=Result",
                    "--property=InvocationID",
                    service,
                )
                return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)

            before = unit()["ExecMainExitTimestampMonotonic"]
            docker_exec(HEAD, "systemctl", "start", "--no-block", service)
            after = wait_for(
                unit,
                lambda now: now["ExecMainExitTimestampMonotonic"] != before and now["ActiveState"] != "activating",
                900,
            )
            # exit 1 (a node failed and was drained) is a round that did its work
            assert (after["ActiveState"], after["Result"]) == ("inactive", "success"), after
            said = wait_for(  # the program's lines reach the journal through a stream that may trail its exit
                lambda: docker_exec(HEAD, "journalctl", f"_SYSTEMD_INVOCATION_ID={after['InvocationID']}", "-o", "cat"),
                lambda text: text.count(f"\n{P}dgx") + text.startswith(f"{P}dgx") >= 4,
                60,
            )
            rows = {line.split(":")[0]: line.split()[1] for line in said.splitlines() if line.startswith(f"{P}dgx")}
            want = {f"{P}dgx01": "pass", f"{P}dgx02": "pass", f"{P}dgx03": "fail", f"{P}dgx04": "skipped"}
            assert rows == want, said
            assert f"{P}dgx04: skipped max_nodes 3 reached" in said, said
            assert slurm_reason(f"{P}dgx03") == (
                "drain|corectl validation: nccl-pair: bus bandwidth 117.6 GB/s at 8 GiB < expected 360 GB/s "
                f"(with {P}dgx01)"
            )
            assert [slurm_reason(n) for n in (f"{P}dgx01", f"{P}dgx02", f"{P}dgx04")] == ["idle|none"] * 3
            pair_jobs = latest_jobs("corectl-validation-pair")
            assert {job["QOS"] for job in pair_jobs.values()} == {"validation"}, pair_jobs
        finally:
            docker_exec(DGX3, "gpu-sim", "clear", "nccl-slow")
        corectl("resume", f"{P}dgx03", *args)
        # ... and the ib-pair check of the same jobs (perftest's ib_write_bw on each port, dgx01 serving, the other
        # node writing through srun): dgx03's mlx5_3 ACTIVE at 400 Gb/s (the ib check passes) but carrying a quarter
        docker_exec(DGX3, "gpu-sim", "fault", "ib-slow", "--device", "mlx5_3")
        try:
            paired = corectl("validate-nodes", f"{P}dgx[01-03]", "--pairwise", *args, check=False)
            rows = {row[0]: row[1:] for row in table_rows(paired.stdout) if row[0].startswith(P)}
            assert {node: row[0] for node, row in rows.items()} == {
                f"{P}dgx01": "pass",
                f"{P}dgx02": "pass",
                f"{P}dgx03": "fail",
            }, paired.stdout
            # the passing pair's verdict, as the checker noted it on its job
            pair_jobs = latest_jobs("corectl-validation-pair")
            passed = next(j["JobId"] for n, j in pair_jobs.items() if n in (f"{P}dgx[01-02]", f"{P}dgx01,{P}dgx02"))
            shown = docker_exec(HEAD, "scontrol", "show", "job", passed)
            want = f"AdminComment=pass: ib-pair: ib_write_bw from {P}dgx02 on 8 ports: lowest 392.4 Gb/s (mlx5_0)"
            assert want in shown, shown
            assert slurm_reason(f"{P}dgx03") == (
                f"drain|corectl validation: ib-pair: ib_write_bw from {P}dgx03: mlx5_3 98.1 Gb/s < expected 380 Gb/s "
                f"(with {P}dgx01)"
            )
            assert [slurm_reason(n) for n in (f"{P}dgx01", f"{P}dgx02", f"{P}dgx04")] == ["idle|none"] * 3
        finally:
            docker_exec(DGX3, "gpu-sim", "clear", "ib-slow")
        corectl("resume", f"{P}dgx03", *args)
        upgrade = corectl("upgrade", "drivers", *args, "--limit", f"{P}dgx03,{P}dgx04", "--batch", "2").stdout
        record = runs(lab)[-1]
        assert record["command"] == f"upgrade drivers {P}dgx[03-04]" and record["status"] == "successful", upgrade
        assert [(s["runner"], s["hosts"]) for s in record["shards"]] == [
            (f"{P}runner1", [f"{P}dgx03"]),
            (f"{P}runner2", [f"{P}dgx04"]),
        ]

        # runner2 stops mid-run: its shard fails alone, named, with how to retry just its hosts
        proc = start_provision(args)
        fanned_run_started(lab, f"{P}runner2-1", proc)
        subprocess.run(["docker", "kill", RUNNER2], capture_output=True, check=True)
        out, err = proc.communicate(timeout=600)
        CONSOLE.append(out + err)
        assert proc.returncode == 1, (out, err)
        assert err.splitlines()[-1] == (
            f"error: provision failed (unreachable: {P}dgx02, {P}dgx04); "
            f"retry just those: corectl provision --inventory {lab} --limit {P}dgx02,{P}dgx04"
        )
        record = runs(lab)[-1]
        status = {s["name"]: s["status"] for s in record["shards"]}
        assert status == {"services": "successful", f"{P}runner1-1": "successful", f"{P}runner2-1": "error"}, record
        for host in (f"{P}dgx01", f"{P}dgx03"):
            assert record["hosts"][host]["failed"] == 0 and record["hosts"][host]["unreachable"] == 0
        assert record["messages"][f"{P}dgx02"].startswith(f"runner {P}runner2: ")
        subprocess.run(["docker", "start", RUNNER2], capture_output=True, check=True)

        # Ctrl-C stops every shard: nothing of the jobs is left running or on disk on the runners
        proc = start_provision(args)
        run_dir = fanned_run_started(lab, "services", proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        CONSOLE.append(out + err)
        assert proc.returncode == 130, (out, err)
        assert "Traceback" not in err
        record = json.loads((run_dir / "corectl.json").read_text())
        assert record["status"] == "canceled"
        assert wait_for(lambda: jobs_on(RUNNER1), lambda left: left == [], 30) == []
    finally:
        (lab / "cluster.yml").write_text(original)
        corectl("render", *args)


NODE_LOCAL = "node_local:\n  mode: 'on'\n  parallel: 4\n"


def disk_holds(container: str, needles: dict[str, bytes]) -> list[str]:
    """The files of ``container``'s own disk (and its tmpfs /dev/shm; not /proc, /sys or the CephFS mount) that
    hold any of ``needles``."""
    patterns = [arg for needle in needles.values() for arg in ("-e", needle.decode())]
    look = ["grep", "-rlsF", *patterns, "--exclude-dir=proc", "--exclude-dir=sys", "--exclude-dir=dev",
            "--exclude-dir=shared", "/", "/dev/shm"]  # fmt: skip
    return docker_exec(container, *look, check=False).split()


@pytest.mark.second_lab
def test_node_local_runs_converge_a_blank_node_and_a_dead_node_fails_alone(lab: Path):
    """Issue 30: with cluster.yml node_local on, the head's plays run from here and each DGX runs its own plays
    against itself, its job streamed into `ansible-runner worker` on it. A blank dgx02 is made whole that way (both
    nodes get the control host's ansible-core and ansible-runner in the same run); a second run changes nothing and
    counts what a run from here counts; nothing of the jobs stays on the nodes and no node's disk holds a secret it
    does not need; a node killed mid-run fails alone, named in the retry line; Ctrl-C stops every node's job."""
    args = ["--inventory", str(lab)]
    original = (lab / "cluster.yml").read_text()
    nodes = {f"{P}dgx01": DGX1, f"{P}dgx02": DGX2}
    try:
        (lab / "cluster.yml").write_text(original + NODE_LOCAL)
        # dgx02's machine is replaced by a blank one (no corectl key, no Ansible, nothing of the cluster)
        before = slurmd_registered(f"{P}dgx02")
        corectl("lab", "replace", f"{P}dgx02", *args)
        with pytest.MonkeyPatch.context() as env:
            env.setenv("E2E_DGX_PASSWORD", (lab / ".lab" / f"{P}dgx02.password").read_text().strip())
            login = ("--user", "dgxadmin", "--password-env", "E2E_DGX_PASSWORD", "--yes")
            corectl("bootstrap", *args, f"{P}dgx02", *login)
        docker_exec(DGX1, "rm", "-rf", "/var/lib/corectl-local")
        first = corectl("provision", *args)
        record = runs(lab)[-1]
        assert record["status"] == "successful", first.stdout
        assert [(s["name"], s["runner"], s["hosts"], s["status"]) for s in record["shards"]] == [
            ("services", "control host", [f"{P}head01"], "successful"),
            (f"{P}dgx01", f"{P}dgx01 (node-local)", [f"{P}dgx01"], "successful"),
            (f"{P}dgx02", f"{P}dgx02 (node-local)", [f"{P}dgx02"], "successful"),
        ], first.stdout
        assert record["hosts"][f"{P}dgx02"]["changed"] > 50, record["hosts"]  # a blank machine, made whole
        assert f"shard {P}dgx02 on runner {P}dgx02 (node-local): successful, 1 host" in first.stdout
        stamp = docker_exec(DGX1, "cat", "/var/lib/corectl-local/stamp").strip()
        assert len(stamp) == 16 and docker_exec(DGX2, "cat", "/var/lib/corectl-local/stamp").strip() == stamp
        wait_for(lambda: slurmd_registered(f"{P}dgx02"), lambda started: started != before, 240)
        wait_for(lambda: slurm_reason(f"{P}dgx02"), lambda reason: reason == "idle|none", 240)
        assert docker_exec(HEAD, "srun", f"--nodelist={P}dgx02", "hostname").strip() == f"{P}dgx02"

        # the same result as a run from this host: nothing changed, the same tasks on each host (but for fact
        # gathering: each node's own fact cache and this host's differ in age)
        single = corectl("provision", *args, "--local")
        reference = runs(lab)[-1]
        assert "shards" not in reference, single.stdout
        assert reference["status"] == "successful" and not any(h["changed"] for h in reference["hosts"].values())
        single_dir = lab / ".runs" / sorted(p.parent.name for p in (lab / ".runs").glob("*/corectl.json"))[-1]
        again = corectl("provision", *args)
        record = runs(lab)[-1]
        assert record["status"] == "successful" and len(record["shards"]) == 3, again.stdout
        again_dir = lab / ".runs" / sorted(p.parent.name for p in (lab / ".runs").glob("*/corectl.json"))[-1]
        counts = ("ok", "changed", "failed", "unreachable")
        extra = {h: int(h in gathered(again_dir)) - int(h in gathered(single_dir)) for h in record["hosts"]}
        assert {h: [s[k] - (extra[h] if k == "ok" else 0) for k in counts] for h, s in record["hosts"].items()} == {
            h: [s[k] for k in counts] for h, s in reference["hosts"].items()
        }, (record["hosts"], reference["hosts"], extra)

        # nothing of the jobs stays on the nodes; no node's disk holds a secret its own plays do not use (the
        # munge key and the CephFS key are its own; the vault password, the DB password, the BMC password, the
        # node key and the bootstrap passwords are not)
        for container in nodes.values():
            assert wait_for(lambda c=container: jobs_on(c), lambda left: left == [], 30) == []
        foreign = {k: v for k, v in secret_needles(lab).items() if not k.startswith(("munge key", "ceph key"))}
        assert {"vault password", "db password", "bmc password", "node ssh key"} <= set(foreign)
        for node, container in nodes.items():  # (a fresh machine's admin password is its own)
            theirs = {k: v for k, v in foreign.items() if k != f"bootstrap password of {node}"}
            assert disk_holds(container, theirs) == [], container

        # dgx02 dies mid-run: its job fails alone, named, with how to retry just it
        proc = start_provision(args)
        fanned_run_started(lab, f"{P}dgx02/1", proc)
        subprocess.run(["docker", "kill", DGX2], capture_output=True, check=True)
        out, err = proc.communicate(timeout=600)
        CONSOLE.append(out + err)
        assert proc.returncode == 1, (out, err)
        assert err.splitlines()[-1] == (
            f"error: provision failed (unreachable: {P}dgx02); "
            f"retry just those: corectl provision --inventory {lab} --limit {P}dgx02"
        ), err
        record = runs(lab)[-1]
        status = {s["name"]: s["status"] for s in record["shards"]}
        assert status == {"services": "successful", f"{P}dgx01": "successful", f"{P}dgx02": "error"}, record
        assert record["hosts"][f"{P}dgx01"]["failed"] == 0 and record["hosts"][f"{P}dgx01"]["unreachable"] == 0
        assert record["messages"][f"{P}dgx02"].startswith(f"runner {P}dgx02 (node-local): "), record["messages"]
        before = slurmd_registered(f"{P}dgx02")
        subprocess.run(["docker", "start", DGX2], capture_output=True, check=True)
        wait_for(lambda: slurmd_registered(f"{P}dgx02"), lambda started: started != before, 240)
        wait_for(lambda: slurm_reason(f"{P}dgx02"), lambda reason: reason == "idle|none", 240)

        # Ctrl-C stops every node's job: nothing of them is left running or on disk on any node
        proc = start_provision(args)
        run_dir = fanned_run_started(lab, f"{P}dgx01/1", proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        CONSOLE.append(out + err)
        assert proc.returncode == 130, (out, err)
        assert "Traceback" not in err
        assert json.loads((run_dir / "corectl.json").read_text())["status"] == "canceled"
        for container in nodes.values():
            assert wait_for(lambda c=container: jobs_on(c), lambda left: left == [], 30) == []
    finally:
        (lab / "cluster.yml").write_text(original)
        corectl("render", *args)


HEAD2 = f"corectl-{SITE}-{P}head02"


def controllers_said(container: str) -> str:
    """`scontrol ping` on ``container``: each slurmctld and whether it answers ("" while none can be asked)."""
    return docker_exec(container, "scontrol", "ping", check=False)


@pytest.mark.second_lab
def test_the_backup_controller_takes_over_from_a_killed_head_and_hands_back(lab: Path):
    """Issue 34: a second head stand-in is declared as slurm.backup_controller with slurmctld's state on CephFS; the
    provision moves the saved state there and the running job goes on. With a job running, the primary head's
    container is killed: the backup takes over, the job finishes, a new job runs; the primary returns, takes over
    again, and the accounting database has both jobs. A restore of the head then stops and restarts the second
    controller's slurmctld around its own."""
    args = ("--inventory", str(lab))
    cluster_yml = lab / "cluster.yml"
    declared = cluster_yml.read_text()
    added = corectl("lab", "add", "--head", *args).stdout
    assert f"{P}head02 {NET}.9    ssh 127.0.0.1:{PORT_BASE + 40}" in added, added
    # (cluster.yml as earlier tests left it: add-node and remove-node rewrite it in their own layout)
    config = yaml.safe_load(declared)
    config["nodes"].append(
        {
            "name": f"{P}head02",
            "address": f"{NET}.9",
            "profile": "head-standin",
            "roles": ["login"],
            "ssh": {"host": "127.0.0.1", "port": PORT_BASE + 40},
        }
    )
    config["slurm"].update(backup_controller=f"{P}head02", state_dir="/shared/slurm/state", controller_timeout_s=10)
    cluster_yml.write_text(yaml.safe_dump(config, sort_keys=False))
    through = sbatch(f"--nodelist={P}dgx01", "--time=30", "--wrap", "sleep 1500")  # (cancelled at the end)
    wait_for(lambda: job_state(through), lambda state: state.startswith("RUNNING"), 60)
    corectl("provision", *args)
    assert job_state(through).startswith("RUNNING")  # the move of the saved state kept the queue
    assert docker_exec(HEAD2, "test", "-s", "/shared/slurm/state/job_state", check=False) == ""
    assert "RequiresMountsFor=/shared/slurm/state" in docker_exec(HEAD, "systemctl", "cat", "slurmctld")
    said = wait_for(lambda: controllers_said(HEAD2), lambda s: s.count("is UP") == 2, 60)
    assert f"Slurmctld(primary) at {P}head01 is UP" in said and f"Slurmctld(backup) at {P}head02 is UP" in said
    options = docker_exec(DGX1, "cat", "/etc/default/slurmd")
    assert f'--conf-server {P}head01,{P}head02"' in options, options
    corectl("provision", *args)
    assert set(last_run_changes(lab).values()) == {0}, changes_shown(lab)

    # the primary head dies with a job running; the backup takes over once it has not answered for
    # controller_timeout_s and CephFS has released the dead head's session (its caps on the saved state)
    running = sbatch(f"--nodelist={P}dgx02", "--time=10", "--wrap", "sleep 45")
    wait_for(lambda: job_state(running), lambda state: state.startswith("RUNNING"), 60)
    killed = time.monotonic()
    subprocess.run(["docker", "kill", HEAD], capture_output=True, check=True)
    try:
        said = wait_for(
            lambda: controllers_said(HEAD2),
            lambda s: f"at {P}head01 is DOWN" in s and f"Slurmctld(backup) at {P}head02 is UP" in s,
            180,
        )
        # (the backup answers ping in standby too: a job is what shows it in charge)
        on_backup = ["runuser", "-u", "alice", "--", "srun", "--job-name=on-the-backup", f"--nodelist={P}dgx01"]
        new = wait_for(
            lambda: docker_exec(HEAD2, *on_backup, "--mem=64", "hostname", check=False),
            lambda out: out.strip() == f"{P}dgx01",
            180,
        )
        took_over = time.monotonic() - killed
        print(f"backup controller in charge {took_over:.0f} s after the head was killed")
        assert new.strip() == f"{P}dgx01"
        shown = wait_for(
            lambda: docker_exec(HEAD2, "scontrol", "show", "job", running, check=False),
            lambda text: "JobState=COMPLETED" in text,
            120,
        )
        assert "JobState=COMPLETED" in shown
    finally:
        subprocess.run(["docker", "start", HEAD], capture_output=True, check=True)
    # the primary is back (slurmctld after CephFS is mounted) and takes over again; its database gets what the
    # backup ran meanwhile
    said = wait_for(lambda: controllers_said(HEAD), lambda s: s.count("is UP") == 2, 240)
    assert f"Slurmctld(primary) at {P}head01 is UP" in said
    on_primary = ["runuser", "-u", "alice", "--", "srun", f"--nodelist={P}dgx02", "--mem=64", "hostname"]
    after = wait_for(lambda: docker_exec(HEAD, *on_primary, check=False), lambda out: out.strip() == f"{P}dgx02", 120)
    assert after.strip() == f"{P}dgx02"
    jobs = wait_for(
        lambda: docker_exec(HEAD, "sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", running, check=False),
        lambda out: f"{running}|COMPLETED" in out,
        180,
    )
    assert f"{running}|COMPLETED" in jobs
    recorded = docker_exec(HEAD, "sacct", "-X", "-n", "-P", "--name=on-the-backup", "-o", "NodeList,State")
    assert f"{P}dgx01|COMPLETED" in recorded.split(), recorded
    docker_exec(HEAD, "scancel", through)

    # a restore with two controllers (the head back to a backup taken now): the second controller's slurmctld is
    # stopped before the head's (it would take over and write the shared saved state while the backup's is
    # unpacked) and started after the head answers; then both answer and jobs run again
    [backup] = json.loads(corectl("backup", *args, "--json").stdout)
    restored = corectl("restore", *args, "--backup", backup["name"]).stdout
    record = runs(lab)[-1]
    assert record["command"].startswith("restore") and record["status"] == "successful", restored
    assert record["hosts"][f"{P}head02"]["changed"] == 2, record["hosts"]  # its slurmctld stopped, then started
    assert "/shared/slurm/state" in restored, restored
    assert f"the second controller {P}head02: slurmctld stopped meanwhile, running again" in restored, restored
    said = wait_for(lambda: controllers_said(HEAD2), lambda s: s.count("is UP") == 2, 60)
    assert f"Slurmctld(primary) at {P}head01 is UP" in said and f"Slurmctld(backup) at {P}head02 is UP" in said
    after = wait_for(lambda: docker_exec(HEAD, *on_primary, check=False), lambda out: out.strip() == f"{P}dgx02", 120)
    assert after.strip() == f"{P}dgx02"
    assert f"{running}|COMPLETED" in docker_exec(HEAD, "sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", running)


def by_hand(sacct: str) -> tuple[dict[str, tuple[int, float]], dict[str, tuple[int, float]]]:
    """Jobs and GPU-hours per account and per user from sacct's lines (JobID|User|Account|AllocTRES|ElapsedRaw|
    State), counted here: a job with an allocation counts, its gres/gpu times its elapsed seconds / 3,600."""
    accounts: dict[str, tuple[int, float]] = {}
    users: dict[str, tuple[int, float]] = {}
    for line in sacct.splitlines():
        _job, user, account, tres, elapsed, _state = line.split("|")
        if not tres:
            continue
        gpus = int(dict(item.split("=", 1) for item in tres.split(",")).get("gres/gpu", 0))
        for table, name in ((accounts, account), (users, user)):
            jobs, hours = table.get(name, (0, 0.0))
            table[name] = (jobs + 1, hours + gpus * int(elapsed) / 3600)
    return accounts, users


def test_the_report_shows_the_accountings_gpu_hours_the_utilisation_and_its_plots(lab: Path, tmp_path: Path):
    from corectl.health import page
    from corectl.health.charts import WIDTH
    from screenshot import bars, runs, screenshot

    # GPU jobs of alice under two accounts and of carol under her default one (hpcadmin), a few seconds each
    ran = []
    for user, account, gres in (("alice", "research", "gpu:2"), ("alice", "vision", "gpu:1"), ("carol", "", "gpu:1")):
        job = docker_exec(
            HEAD, "runuser", "-u", user, "--", "srun", *([f"--account={account}"] if account else []),
            f"--nodelist={P}dgx02", "--ntasks=1", "--cpus-per-task=1", "--mem=64", f"--gres={gres}",
            "sh", "-c", 'sleep 5; echo "$SLURM_JOB_ID"',
        ).strip()  # fmt: skip
        ran.append(job)
    # slurmctld hands each job's record to slurmdbd through a queue: wait for them all to be there, ended
    wait_for(
        lambda: docker_exec(HEAD, "sacct", "-X", "-n", "-P", "-j", ",".join(ran), "-o", "JobID,State"),
        lambda out: out.count("COMPLETED") == len(ran),
        60,
    )
    html = tmp_path / "report.html"
    shown = json.loads(corectl("report", "--inventory", str(lab), "--days", "1", "--json", "--html", str(html)).stdout)
    # the same window, read on the head here and counted by hand (sacct reads its times as UTC with TZ=UTC)
    start, end = (shown[key].removesuffix("Z") for key in ("since", "until"))
    sacct = docker_exec(
        HEAD, "env", "TZ=UTC", "sacct", "-a", "-X", "-n", "-P", "--noconvert", "--truncate", f"-S{start}", f"-E{end}",
        "--format=JobID,User,Account,AllocTRES,ElapsedRaw,State",
    )  # fmt: skip
    accounts, users = by_hand(sacct)
    assert {"research", "vision", "hpcadmin"} <= set(accounts) and {"alice", "carol"} <= set(users), sacct
    used = shown["usage"]
    assert used is not None, shown["usage_note"]
    for mine, theirs in ((accounts, used["accounts"]), (users, used["users"])):
        assert {s["name"]: s["jobs"] for s in theirs} == {name: jobs for name, (jobs, _) in mine.items()}
        assert {s["name"]: s["gpu_hours"] for s in theirs} == pytest.approx({n: h for n, (_, h) in mine.items()})
    series = shown["utilisation"]
    assert series is not None, shown["utilisation_note"]
    assert len(series["times"]) > 0 and max(series["gpus"]) >= 16  # both stand-ins' 8 GPUs each were sampled
    # the page: its plots, and in headless Chromium no error, the bars as long as the figures say, the lines drawn
    text = html.read_text()
    assert text.count("<svg") == 5 and "GPU-hours per account" in text and "GPU utilisation (%)" in text
    # a window taller than the page (its length grows with the lab's accounts, users and outages): the whole page
    # is in the shot when its last rows are blank
    image, errors = screenshot(html, tmp_path / "report.png", tmp_path / "profile", height=6000)
    assert errors == []
    assert set(b"".join(image.rows[-200:])) == {0xFF}, "the page is longer than the screenshot"
    plot = WIDTH - 220 - 130  # charts.bar_chart's plot width

    def widths(shares: list[dict]) -> list[int]:
        top = max(s["gpu_hours"] for s in shares)
        return [w for s in shares if (w := round(plot * s["gpu_hours"] / top)) > 0]

    assert bars(image, page.ACCOUNT_COLOUR) == pytest.approx(widths(used["accounts"]), abs=1)
    assert bars(image, page.USER_COLOUR) == pytest.approx(widths(used["users"]), abs=1)
    # the lab is minutes old in a day's report: its few samples are dots at the plots' right end, each chart's colour
    # also in rows below its legend's swatch
    for colour in (page.UTIL_COLOUR, page.BUSY_COLOUR):
        rows = sorted({y for y, _x, _n in runs(image, colour)})
        assert rows and rows[-1] - rows[0] > 15, f"{colour}: no sample drawn below the legend"
    causes = page.cause_colours(o["cause"] for o in shown["out_of_service"])
    for cause, colour in causes.items():
        assert bars(image, colour, min_height=15), f"no bar of {cause} on the timeline"


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


def secret_needles(lab: Path) -> dict[str, bytes]:
    """Every secret of the site (and the fresh machines' bootstrap passwords), as bytes to look for."""
    site = resolve_site(str(lab))
    files = secrets.SecretFiles(site)
    vault_password = secrets.vault_password(files)
    key = secrets._vault(vault_password).decrypt(files.munge_key.read_bytes())
    values = secrets.read_values(site)
    needles = {
        "vault password": vault_password,
        "munge key": key[:24],
        "munge key (base64)": base64.b64encode(key)[:32],
        "db password": values["corectl_slurm_db_password"].encode(),
        "ceph key": values["corectl_cephfs_client_keys"]["corectl"].encode(),
        "bmc password": values["corectl_bmc_credentials"]["password"].encode(),
        # runner jobs carry the node key to ssh-agent (test_runners_fan_a_provision_out_...)
        # (line 5 of the key file holds the private key bytes; the lines before hold public parts)
        "node ssh key": (lab / ".lab" / "id_ed25519").read_text().splitlines()[4].encode(),
    }
    # the admin passwords of fresh machines (lab add --bare and lab replace make them), where a test made one
    made = sorted(p for p in (lab / ".lab").glob("*.password") if p.name != "bmc.password")
    needles |= {f"bootstrap password of {p.stem}": p.read_bytes().strip() for p in made}
    if "corectl_backup_ssh_key" in values:  # made by the backup host test
        needles["backup ssh key"] = values["corectl_backup_ssh_key"].splitlines()[4].encode()  # private bytes
    return needles


def secrets_in(lab: Path, since: float, console: list[str]) -> list[str]:
    """Where a secret of the site is in a run record or fact file written since ``since``, or in ``console``."""
    needles = secret_needles(lab)
    found = []
    for directory in (lab / ".runs", lab / ".facts"):
        for path in directory.rglob("*"):
            if path.is_file() and path.stat().st_mtime >= since:
                data = path.read_bytes()
                found += [f"{name} in {path}" for name, needle in needles.items() if needle in data]
    text = "\n".join(console).encode()
    found += [f"{name} on the console" for name, needle in needles.items() if needle in text]
    return found


@pytest.fixture(autouse=True)
def no_secret_left_by_the_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test on the provisioned lab: no secret of the site in what its commands printed or in the
    run records and fact files they wrote (each test checked on its own, in any order and alone with -k)."""
    if "lab" not in request.fixturenames:
        yield
        return
    since, printed = time.time() - 1, len(CONSOLE)
    yield
    lab = request.getfixturevalue("lab")
    found = secrets_in(lab, since, CONSOLE[printed:])
    assert not found, f"a secret left by {request.node.name}: {found}"


@pytest.mark.every_lab
def test_no_secret_at_rest_in_runs_facts_or_console(lab: Path):
    """Every secret source, in everything the runs on this lab left behind (each test's own output is also
    checked right after it: no_secret_left_by_the_test)."""
    needles = secret_needles(lab)
    assert needles["bmc password"] == (lab / ".lab" / "bmc.password").read_bytes().strip()
    kept = [p for d in (lab / ".runs", lab / ".facts") for p in d.rglob("*") if p.is_file()]
    assert len(kept) > 100  # the first provision's records at least
    assert any(p.name == "command" for p in kept)  # ansible-runner's record of each run's environment
    assert CONSOLE  # at least lab up's and the first provision's output
    assert secrets_in(lab, 0.0, CONSOLE) == []
