"""The site's runs on a converged lab: lab up's inventory, the first provision, plan, drift repair, limits and
pass-through options, host keys, one changing command per site, Ctrl-C, a killed provision, a stale lock.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
from pathlib import Path

import pytest

from corectl.ansible.runner import control_path_dir
from corectl.site import resolve_site
from e2e.lab import (
    CORECTL,
    DGX1,
    NET,
    PORT_BASE,
    SITE,
    SUBNET,
    P,
    assert_provision_changes_nothing,
    containers,
    corectl,
    docker_exec,
    lock_holder,
    runs,
    site_files,
    table_rows,
    wait_for,
)

pytestmark = pytest.mark.lab


def container_started(name: str) -> str:
    return subprocess.run(
        ["docker", "inspect", "--format", "{{.State.StartedAt}}", name], capture_output=True, text=True, check=True
    ).stdout.strip()


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
    # remove-node in test_nodes.py: assert_provision_changes_nothing, on every host)
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
