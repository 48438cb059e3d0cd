"""The fleet's runners: a provision fanned out over runner stand-ins, and node-local runs on the DGX stand-ins."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from corectl.ansible.remote.stream import EVENTS, read_events
from corectl.commands.runs import load_events
from e2e.lab import (
    CONSOLE,
    CORECTL,
    DGX1,
    DGX2,
    DGX3,
    HEAD,
    PORT_BASE,
    SITE,
    SUBNET,
    P,
    corectl,
    docker_exec,
    health_report,
    latest_jobs,
    lock_holder,
    runs,
    secret_needles,
    slurm_reason,
    slurmd_registered,
    table_rows,
    wait_for,
)

pytestmark = pytest.mark.lab


RUNNER1, RUNNER2 = (f"corectl-{SITE}-{P}runner{i}" for i in (1, 2))


def jobs_on(container: str) -> list[str]:
    """What a runner holds of corectl's jobs: worker directories and Ansible processes."""
    look = "ls -d /dev/shm/corectl-job-* 2>/dev/null; pgrep -fa '[a]nsible-'"
    return docker_exec(container, "sh", "-c", look, check=False).split("\n")[:-1]


def start_provision(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([CORECTL, "provision", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def gathered(run_dir: Path) -> set[str]:
    """Hosts whose facts a run gathered (not taken from the fact cache), from its job events."""
    return {
        event["event_data"]["host"]
        for event in load_events(run_dir)
        if event.get("event") == "runner_on_ok" and event["event_data"].get("task") == "Gathering Facts"
    }


def shard_events(run_dir: Path, shard: str) -> int:
    """How many events a shard has so far: a streamed job's one file (corectl.ansible.remote.stream), or the
    job_events of a part run from this host."""
    kept = run_dir / "shards" / shard / EVENTS
    if kept.exists():
        return len(read_events(kept))
    return len(list((run_dir / "shards" / shard / "artifacts" / "job_events").glob("*.json")))


def fanned_run_started(lab: Path, shard: str, proc: subprocess.Popen[str]) -> Path:
    """The run directory, once ``shard`` has its first task result (its job runs on the runner)."""
    holder = wait_for(lambda: lock_holder(lab), lambda h: bool(h.get("run")) or proc.poll() is not None, 120)
    run_dir = Path(holder["run"])
    wait_for(lambda: shard_events(run_dir, shard), lambda n: n > 20 or proc.poll() is not None, 300)
    assert proc.poll() is None, proc.communicate()
    return run_dir


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


# each DGX's job followed by a corectl process of its own (issue 49 item 1), whatever this machine's cores
NODE_LOCAL = "node_local:\n  mode: 'on'\n  parallel: 4\n  processes: 2\n"


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
