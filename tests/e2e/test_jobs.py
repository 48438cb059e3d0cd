"""Jobs and containers: Slurm jobs, pam_slurm_adopt, munge, pyxis and enroot, MPI through PMIx, per-job /tmp, GPU and
core binding, the epilog, GRES autodetect, fair share, limits and preemption, the accounting database, RDMA
readiness and CephFS.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from corectl import secrets
from corectl.lab.docker import accounting_flags
from corectl.site import resolve_site
from e2e.lab import (
    CONTAINER_IMAGE,
    DGX1,
    DGX2,
    HEAD,
    PORT_BASE,
    SITE,
    P,
    changes_shown,
    corectl,
    docker_exec,
    job_state,
    last_run_changes,
    runs,
    sbatch,
    slurm_reason,
    ssh_as_alice,
    wait_for,
)

pytestmark = pytest.mark.lab


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
    config = yaml.safe_load(declared)
    assert config["profiles"]["dgx-standin"]["gpus"]["autodetect"] == "off"
    config["profiles"]["dgx-standin"]["gpus"]["autodetect"] = "nvml"
    cluster_yml.write_text(yaml.safe_dump(config, sort_keys=False))
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
    config = yaml.safe_load(declared)
    config["slurm"]["accounts"] = [account for account in config["slurm"]["accounts"] if account["name"] != "vision"]
    for user in config["users"]:
        user["slurm_accounts"] = [account for account in user.get("slurm_accounts", []) if account != "vision"]
    dropped = yaml.safe_dump(config, sort_keys=False)
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


def test_cephfs_is_shared_between_nodes(lab: Path):
    head, dgx = f"corectl-{SITE}-{P}head01", f"corectl-{SITE}-{P}dgx01"
    assert docker_exec(dgx, "findmnt", "--noheadings", "--output", "FSTYPE", "/shared").strip() == "fuse.ceph-fuse"
    docker_exec(head, "sh", "-c", "echo from-head > /shared/e2e-file && chown alice:research /shared/e2e-file")
    assert docker_exec(dgx, "stat", "--format", "%U %u", "/shared/e2e-file").strip() == "alice 20001"
    assert docker_exec(dgx, "cat", "/shared/e2e-file").strip() == "from-head"
