"""The lab the end-to-end suite runs on, and what its tests share: the corectl and docker helpers, the lab's
names (site, subnet, ports, node-name prefix: LABS), Slurm and health helpers used by more than one module, and
the secret scan's needles. The fixtures (the lab, its first provision, the secret scan after every test) are in
e2e/fixtures.py; the tests are in modules by concern (test_lifecycle, test_jobs, test_observability, test_health,
test_fleet, test_head, test_nodes, test_secret_scan).

Needs Docker and root (the lab starts the engine and builds the image when missing).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from corectl import secrets
from corectl.cli.policy import COMMAND_LOCKS, READS
from corectl.site import resolve_site

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
    """Run corectl. A read-only command (COMMAND_LOCKS: READS) run while no other command holds its site's lock
    must leave the site as it was (issue 46): every read of every e2e test checks it."""
    site = read_only_site(args)
    before = site_tree(site) if site else None
    proc = subprocess.run([CORECTL, *args], capture_output=True, text=True, timeout=timeout, check=False)
    CONSOLE.append(proc.stdout + proc.stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"corectl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    if site is not None and not lock_holder(site):
        after = site_tree(site)
        changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
        assert not changed, f"corectl {' '.join(args)} (read-only) changed {site}: {changed}"
    return proc


def read_only_site(args: tuple[str, ...]) -> Path | None:
    """The site of ``args`` when they are a read-only command with --inventory and nobody holds its lock."""
    matches = []
    for entry, kind in COMMAND_LOCKS.items():
        words = entry.split()
        option = words[-1] if words[-1].startswith("--") else None
        command = words[:-1] if option else words
        if list(args[: len(command)]) == command and (option is None or option in args):
            matches.append((len(words), kind))
    if "--inventory" not in args or not matches or max(matches)[1] != READS:
        return None
    site = Path(args[args.index("--inventory") + 1])
    return None if lock_holder(site) else site


def site_tree(site: Path) -> dict[str, tuple[int, int]]:
    """The site's files with their sizes and modification times; of .runs/ only what it holds (a read that left
    a run record would add a folder there; the runs' thousands of event files are not looked at, each read of
    the e2e tests looks twice). Neither its lock file nor .lab/, where the lab's stand-in BMCs
    (tests/standin/bmc.py, not corectl) log each request a `power status` makes."""
    found: dict[str, tuple[int, int]] = {}
    for top in site.iterdir():
        if top.name in (".lock", ".lab"):
            continue
        if top.name == ".runs":
            paths = list(top.iterdir())
        else:
            paths = [top] if top.is_file() else [path for path in top.rglob("*") if path.is_file()]
        for path in paths:
            stat = path.stat()
            found[str(path.relative_to(site))] = (stat.st_size, stat.st_mtime_ns)
    return found


EXEC_LIMIT_S = 300  # one docker exec: an exec into a container that is stopping or rebooting can wait for good


def exec_in(container: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """docker exec, never waiting past EXEC_LIMIT_S: an exec that does is answered as a failure (exit 124)."""
    command = ["docker", "exec", container, *argv]
    try:
        return subprocess.run(command, capture_output=True, text=True, check=False, timeout=EXEC_LIMIT_S)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 124, "", f"docker exec: no answer in {EXEC_LIMIT_S} s")


class ExecFailed(subprocess.CalledProcessError):
    """A docker exec that failed, its stderr on the first line of its message (the line CI's summary shows)."""

    def __str__(self) -> str:
        said = " ".join(str(self.stderr or "").split())[-600:]
        return f"{super().__str__()} stderr: {said!r}"


def docker_exec(container: str, *argv: str, check: bool = True) -> str:
    done = exec_in(container, *argv)
    if check and done.returncode != 0:
        raise ExecFailed(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout


def flip_byte(container: str, path: str, offset: int) -> None:
    """Change the byte at ``offset`` of ``path`` in ``container`` for sure (to 255 minus it): writing a fixed byte
    there leaves the file as it was whenever it already held that byte (1 run in 256 for compressed data)."""
    script = (
        'b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d " ") && [ -n "$b" ] && '
        'printf "\\\\$(printf %o $((255 - b)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none'
    )
    docker_exec(container, "sh", "-c", script, "flip", path, str(offset))


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


def containers(site: Path) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=corectl.lab={site.name}", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sorted(out.split())


def ssh_as_alice(lab: Path, port: int, command: str) -> subprocess.CompletedProcess[str]:
    """alice's own SSH login (her key is declared in the lab's cluster.yml) from this machine."""
    argv = [
        "ssh", "-i", str(lab / ".lab" / "alice_ed25519"), "-p", str(port),
        "-o", f"UserKnownHostsFile={lab / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "alice@127.0.0.1", command,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def prometheus(head: str, path: str) -> dict:
    code = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9090{path}').read().decode())"
    return json.loads(docker_exec(head, "python3", "-c", code))


CONTAINER_IMAGE = "/var/tmp/corectl-e2e-debian.sqsh"


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


def sbatch(*args: str) -> str:
    """Submit as alice; the job id."""
    return docker_exec(
        HEAD, "runuser", "-u", "alice", "--", "sbatch", "--parsable", "--output=/dev/null", *args
    ).strip()  # fmt: skip


def job_fields(job: str) -> dict[str, str]:
    """`scontrol show job -o`'s fields of ``job`` ({} once Slurm forgot it)."""
    line = docker_exec(HEAD, "scontrol", "show", "job", "-o", job, check=False).strip()
    return dict(re.findall(r"(\w+)=((?:(?! \w+=).)*)", line))


def job_end(job: str) -> tuple[str, str, int]:
    """(state, exit code, end time; 0 while it runs) of a job, from Slurm's accounting."""
    sacct = docker_exec(HEAD, "sh", "-c", f"SLURM_TIME_FORMAT=%s sacct -X -n -P -j {job} -o State,ExitCode,End")
    state, exit_code, end = sacct.strip().split("|")
    return state, exit_code, int(end) if end.isdigit() else 0


def job_state(job: str) -> str:
    """'STATE REASON' of a job in the queue ("" once it left)."""
    return docker_exec(HEAD, "squeue", "--noheader", "--job", job, "--format", "%T %r", check=False).strip()


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


JOB_FIELDS = re.compile(r"(?:^| )(JobId|JobName|JobState|QOS|ReqNodeList)=(\S*)")


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


def lock_holder(site: Path) -> dict:
    """The holder named in the site's lock file ({} while nobody holds it)."""
    text = (site / ".lock").read_text() if (site / ".lock").exists() else ""
    return json.loads(text) if text.strip() else {}


def site_files(site: Path) -> dict[str, tuple[bytes, int]]:
    return {
        name: ((site / name).read_bytes(), (site / name).stat().st_mtime_ns) for name in ("cluster.yml", "hosts.yml")
    }


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


def offer(container: str, folder: str) -> None:
    """The node's repositories publish updates: its apt sources get the stand-in repository's ``folder`` (one of
    tests/standin/build_repo.py's flat repositories beside apt/), signed with the stand-in key, as the driver role
    added the stand-in repository to the DGX."""
    source = docker_exec(DGX1, "cat", "/etc/apt/sources.list.d/nvidia-cuda.sources")
    key = docker_exec(DGX1, "cat", "/etc/apt/keyrings/nvidia-cuda.asc")
    keyring = "/etc/apt/keyrings/corectl-e2e-standin.asc"
    source = re.sub(r"(?m)^URIs: (\S+)/apt/$", rf"URIs: \1/{folder}/", source)
    source = re.sub(r"(?m)^Signed-By: .*$", f"Signed-By: {keyring}", source)
    path = f"/etc/apt/sources.list.d/corectl-e2e-{folder}.sources"
    for text, target in ((key, keyring), (source, path)):
        subprocess.run(["docker", "exec", "-i", container, "sh", "-c", f"cat > {target}"], input=text, text=True,
                       check=True, timeout=60)  # fmt: skip
    assert f"/{folder}/" in docker_exec(container, "cat", path)


# A job that runs until the controller hears its node's slurmd on the stand-in point release, then ends: it proves
# that slurmd was restarted under it and that it survived, without guessing durations (at most 15 minutes).
UPGRADED_JOB = (
    'for i in $(seq 900); do scontrol show node -o "$SLURMD_NODENAME" | grep -qw "Version={version}" && exit 0; '
    "sleep 1; done; exit 1"
)
POINT = "22.05.9"  # tests/standin/upstream/slurm-point-release.py: Debian 12's 22.05.8, one point on


def daemon_started(container: str, unit: str) -> int:
    """When the daemon's running process started, on the kernel's monotonic clock (one for every container)."""
    return int(docker_exec(container, "systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "--value", unit))
